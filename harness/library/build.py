"""The solution library: verified solutions, each deposited once as a KV artifact, with an index from
problem fingerprint to artifact and the text used for retrieval.

Nothing enters unverified: `harness.task.answers.score` checks each solution's final answer against the ground
truth and that record stays with the entry. A library is identified by everything that determines its content
(`library_identity`: the source rows and file hash, the selection (path, columns, limit) or harvested run, the
entry template, the model and tokenizer) and lives in `<root>/<name>-v<version>-<model fp[:12]>-<identity[:12]>/`,
so a library built from other rows is never reused; opening one re-checks its manifest's own hash, its identity
and every index row:
    index.jsonl    one entry per line (canonical JSON): entry_id, problem_id, problem_fingerprint, problem,
                   answer, artifact_id, tokens, origin, verification
    manifest.json  name, version, identity, fingerprints, template hash, entry hashes, skipped rows, manifest_sha256
Artifacts live in the shared content-addressed store (`library.store`) and are read one at a time, so a
library of any size is served without holding its artifacts in memory. How it is searched is fixed when it
is opened (`open_library`: `library.exclude_self`, `library.retrieval`).

    python -m harness.library                       # build the default library (make library)
    python -m harness.library library=harvest library.harvest_run=runs/baseline/<run>
    python -m harness.library --redeposit [overrides]   # re-deposit its entries in this compute environment

Exactness is a property of (artifact, environment) (kvstore/environment.py): a graft refuses an artifact
deposited in another compute environment. `redeposit_library` recomputes each such entry from the token ids
its artifact holds, under this process's settings and environment, keeping entry ids; the manifest records the
environment its artifacts were computed in. The environment and determinism settings are bound per artifact,
not in the identity: a graft refuses an artifact computed elsewhere, naming the field, and `--redeposit` fixes it
in place.

Over 400 lines because it is the library's on-disk format written and read in one place: `Library` checks exactly
the manifest and index rows that `build_library` and `redeposit_library` write (`_write_library`), so splitting
the reader from the writers would put the two halves of one format in two modules (the sources and the identity
already live in harness/library/source.py, the bundles in harness/library/bundle.py).
"""

from __future__ import annotations

import glob
import json
import re
import resource
import sys
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from harness.config.exact import print_note
from harness.config.model import load_model
from harness.config.schema import compose_config, typed
from harness.errors import LibraryError, exit_on_error, plain
from harness.library.content import ContentIndex
from harness.library.random_entry import random_other_entry
from harness.library.source import LIBRARY_FORMAT, library_identity, read_candidates
from harness.record.hashing import jsonl_bytes, sha256_hex, sha256_json, write_json, write_jsonl
from harness.task.answers import score
from harness.task.chat import ChatFrame, chat_frame, encode_entry
from harness.task.problems import Problem, check_problem_sets, problem_fingerprint
from harness.task.prompts import render
from kvstore import (
    Backend,
    InEngineDecoding,
    KVStoreError,
    LocalStore,
    Snapshot,
    admission_differences,
    artifact_differences,
    enter_profile,
    numerics_evidence_problem,
    open_store,  # scale-out: library.store may be s3://bucket/prefix (docs/scale-out.md)
    tokens_sha256,
)

_WORD = re.compile(r"[a-z0-9]+")
LIBRARY_FILES = ("index.jsonl", "manifest.json")  # a library folder's files, in the order they are written


@dataclass(frozen=True)
class Entry:
    entry_id: str
    problem_id: str
    problem_fingerprint: str
    problem: str
    answer: str
    artifact_id: str
    tokens: int
    origin: str
    verification: dict[str, Any]
    tokens_sha256: str | None = None  # SHA-256 of the entry's token ids; None in libraries built before it existed

    @classmethod
    def from_row(cls, row: dict) -> Entry:
        return cls(**{k: row[k] for k in cls.__dataclass_fields__ if k in row or k != "tokens_sha256"})

    def to_row(self) -> dict:
        """The index row; tokens_sha256 left out when None, so older libraries' rows (and hashes) read as written."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__
                if k != "tokens_sha256" or self.tokens_sha256 is not None}

    def holds(self, snapshot: Snapshot) -> bool:
        """Whether `snapshot` holds this entry's tokens: their count, and their SHA-256 where the entry records it."""
        return snapshot.token_count == self.tokens and (
            self.tokens_sha256 is None or tokens_sha256(snapshot.token_ids) == self.tokens_sha256)


@dataclass(frozen=True)
class Match:
    entry: Entry
    similarity: float  # 1.0 for an exact fingerprint match; the BM25 score otherwise
    kind: str  # "exact" | "bm25" | "random"


def library_dir(root: str | Path, name: str, version: int, model_fingerprint: str, identity_sha256: str) -> Path:
    """`<root>/<name>-v<version>-<model fp[:12]>-<identity[:12]>`: one folder per content (`library_identity`)."""
    return Path(root) / f"{name}-v{version}-{model_fingerprint[:12]}-{identity_sha256[:12]}"



def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


RETRIEVALS = ("bm25", "none", "random")


class Library:
    """A built library opened for lookups. Entries are small index rows; artifacts stay in the store.

    `exclude_self` (held-out: the evaluated problem never reaches the context) and `retrieval` (how a
    non-exact match is found: bm25 | none | random, a random other entry: harness/library/random_entry.py) are fixed
    here, so every lookup of one run follows the same rule."""

    def __init__(self, path: Path, store: LocalStore, *, exclude_self: bool = False, retrieval: str = "bm25") -> None:
        if retrieval not in RETRIEVALS:
            raise LibraryError(f"library.retrieval={retrieval!r}: use one of {list(RETRIEVALS)}")
        self.path = Path(path)
        self.store = store
        self.exclude_self, self.retrieval = bool(exclude_self), retrieval
        try:
            self.manifest = json.loads((self.path / "manifest.json").read_text(encoding="utf-8"))
            data = (self.path / "index.jsonl").read_bytes()
        except (OSError, ValueError) as e:
            raise LibraryError(
                f"library {self.path} is missing or unreadable ({e}); build it with `make library`"
            ) from e
        if not isinstance(self.manifest, dict):
            raise LibraryError(f"{self.path / 'manifest.json'}: expected a JSON object; rebuild it with `make library`")
        body = {k: v for k, v in self.manifest.items() if k != "manifest_sha256"}
        if sha256_json(body) != self.manifest.get("manifest_sha256"):
            raise LibraryError(
                f"{self.path / 'manifest.json'}: manifest_sha256 does not match the manifest's content; the library "
                "was modified after it was built: restore it, or rebuild it with `make library`"
            )
        rows = _index_rows(self.path / "index.jsonl", data)
        recorded = self.manifest.get("entries", {})
        for i, row in enumerate(rows, start=1):
            if recorded.get(row.get("entry_id")) != sha256_json(row):
                raise LibraryError(
                    f"{self.path / 'index.jsonl'}, row {i} (entry {row.get('entry_id')}): does not match the hash "
                    "in manifest.json; the library was modified. Rebuild it with `make library`."
                )
        if len(rows) != len(recorded):
            raise LibraryError(f"{self.path}: index has {len(rows)} entries, manifest lists {len(recorded)}")
        if "index_sha256" in self.manifest and sha256_hex(data) != self.manifest["index_sha256"]:
            raise LibraryError(f"{self.path / 'index.jsonl'}: SHA-256 differs from manifest.json index_sha256 (rows "
                               "reordered or reformatted); rebuild it with `make library`")
        self.entries = [Entry.from_row(r) for r in rows]
        sealed = [e.entry_id for e in self.entries if e.tokens_sha256 is not None]
        if sealed and len(sealed) != len(self.entries):  # a library built with the field records it on every row
            bare = next(e.entry_id for e in self.entries if e.tokens_sha256 is None)
            raise LibraryError(
                f"{self.path / 'index.jsonl'}, entry {bare}: no tokens_sha256 where {len(sealed)} other rows of this "
                "library record it (a library built with the field records it on every row): the library was "
                "modified; rebuild it with `make library`")
        self._by_fp = {e.problem_fingerprint: e for e in self.entries}
        self._bm25 = None
        self._content: ContentIndex | None = None  # built on the first `present` (held-out, random, the server)
        self._problem_ids: dict[str, str] = {}
        # entry id -> the token ids its own text encodes to (open_library sets the encoder from the library's source)
        self.entry_ids: Callable[[Entry], tuple[str, list[int]] | None] | None = None

    def check_artifact(self, entry: Entry, snapshot: Snapshot) -> None:
        """LibraryError unless the artifact read for `entry` holds the entry's tokens (a graft never takes another
        problem's context from a store whose object or index was swapped since the build)."""
        own = self.entry_ids(entry) if self.entry_ids is not None else ("", [])
        if own is None or own[0] and own[0] != entry.problem_fingerprint:
            raise LibraryError(
                f"library {self.path}, entry {entry.entry_id} (problem {entry.problem_id}): "
                + ("the library's source holds no such entry" if own is None else
                   "its problem fingerprint is not its own problem's")
                + ": the library was modified; remove the library folder and rebuild it with `make library`")
        expected = own[1] if self.entry_ids is not None else None
        if expected is not None and list(snapshot.token_ids) != expected:
            raise LibraryError(
                f"library {self.path}, entry {entry.entry_id} (problem {entry.problem_id}): artifact "
                f"{entry.artifact_id[:12]} holds {snapshot.token_count} tokens (SHA-256 "
                f"{tokens_sha256(snapshot.token_ids)[:12]}) that are not the encoding of the entry's own text "
                f"({len(expected)} tokens, {tokens_sha256(expected)[:12]}): the library points at another problem's "
                "context; remove the library folder and rebuild it with `make library`")
        if not entry.holds(snapshot):
            raise LibraryError(
                f"library {self.path}, entry {entry.entry_id} (problem {entry.problem_id}): artifact "
                f"{entry.artifact_id[:12]} holds {snapshot.token_count} tokens (SHA-256 "
                f"{tokens_sha256(snapshot.token_ids)[:12]}), not the entry's {entry.tokens}"
                + (f" ({entry.tokens_sha256[:12]})" if entry.tokens_sha256 else "")
                + f": the library points at another artifact; run `kvstore gc --store {self.store.root}`, remove "
                "the library folder and rebuild it with `make library`")

    @property
    def manifest_sha256(self) -> str:
        return self.manifest["manifest_sha256"]

    def describe(self) -> dict:
        return {
            "name": self.manifest["name"],
            "version": self.manifest["version"],
            "path": str(self.path),
            "entries": len(self.entries),
            "manifest_sha256": self.manifest_sha256,
            "exclude_self": self.exclude_self,
            "retrieval": self.retrieval,
        }

    def present(self, texts: Collection[str], asked: str = "") -> dict[str, tuple[str, float]]:
        """entry id -> (its problem id, the share found) of every entry whose problem is in `texts` by content, or
        a near duplicate of the problem `asked` (harness.library.content.ContentIndex)."""
        if self._content is None:
            self._content = ContentIndex((e.entry_id, e.problem) for e in self.entries)
            self._problem_ids = {e.entry_id: e.problem_id for e in self.entries}
        return {k: (self._problem_ids[k], share) for k, share in self._content.present(list(texts), asked).items()}

    def retrieve(self, problem: Problem, exclude: Collection[str] = ()) -> Match | None:
        """The entry to graft for `problem`: an exact fingerprint match (recurring) unless exclude_self;
        otherwise the most similar entry by BM25 over problem text, never the problem itself when excluded, nor
        (held-out, random) an entry whose problem is in the problem's text by content or a near duplicate of it
        (`present`: the library-aware server's rule, so the two exclude the same entries). `exclude`: entry ids
        never retrieved either when exclude_self (the server's: every library problem found in a request)."""
        fp = problem.fingerprint
        exclude_self = self.exclude_self
        if exclude_self:
            exclude = {*exclude, *self.present([problem.problem], asked=problem.problem)}
        if not exclude_self and fp in self._by_fp:
            entry = self._by_fp[fp]
            if entry.answer != problem.answer:
                raise LibraryError(
                    f"problem {problem.id}: library {self.path} holds the same problem text (entry {entry.entry_id}, "
                    f"problem {entry.problem_id}) with answer {entry.answer}, where this problem set says "
                    f"{problem.answer}; one of the two is wrong: correct it (and rebuild the library)"
                )
            return Match(entry, 1.0, "exact")
        if self.retrieval == "none":
            return None
        if self.retrieval == "random":  # the control: any other verified entry, the same one for a problem every run
            other = random_other_entry(self.entries, problem, exclude=exclude if exclude_self else ())
            return Match(other, 0.0, "random") if other is not None else None
        if self._bm25 is None:
            from rank_bm25 import BM25Okapi

            self._bm25 = BM25Okapi([_words(e.problem) for e in self.entries])
        scores = self._bm25.get_scores(_words(problem.problem))
        best, best_score = None, float("-inf")
        for e, s in zip(self.entries, scores):
            if exclude_self and (e.problem_fingerprint == fp or e.problem_id == problem.id or e.entry_id in exclude):
                continue
            if s > best_score:
                best, best_score = e, float(s)
        return Match(best, best_score, "bm25") if best is not None else None


def _index_rows(path: Path, data: bytes) -> list[dict[str, Any]]:
    """The rows of index.jsonl; a line that is not UTF-8 JSON of an object is a LibraryError naming it."""
    rows = []
    for i, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
            raise LibraryError(f"{path}, line {i}: not valid UTF-8 JSON ({e}); the library was modified: restore "
                               "it, or rebuild it with `make library`") from e
        if not isinstance(row, dict):
            raise LibraryError(f"{path}, line {i}: expected a JSON object (an entry), found {type(row).__name__}; "
                               "the library was modified: restore it, or rebuild it with `make library`")
        rows.append(row)
    return rows


@dataclass(frozen=True)
class Reuse:
    """A stored artifact of an entry's exact tokens that this backend could graft: `evidence` is "" when its numerics
    record shows it was computed under this backend's numerics (reused as is), else why not (it is then re-verified
    by recomputation before any use: `_reverify`)."""

    artifact_id: str
    evidence: str
    extra: dict


def _reusable(store, ids: list[int], be: Backend) -> Reuse | None:
    """A stored artifact of exactly `ids` that this backend can graft, or None. The index only proposes
    candidates: each is read (verified) and must hold these token ids from position 0, made by this backend with
    this model and tokenizer under these settings and environment. A candidate whose index row lies is reported
    (stderr) and skipped: `kvstore gc` repairs the row. Its numerics evidence is judged, never assumed: a candidate
    with no record, several, another machine's or an unreadable one is returned with the reason (issue 51)."""
    for aid in store.find_tokens(tokens_sha256(ids)):
        try:
            snap = store.get(aid)
        except KVStoreError as e:
            print(plain(f"library: store {store.root}: artifact {aid} listed by the index cannot be read ({e}); not "
                        f"reused: run `kvstore gc --store {store.root}`"), file=sys.stderr, flush=True)
            continue
        if list(snap.token_ids) != list(ids) or snap.start_position != 0:
            print(plain(f"library: store {store.root}: the index row of artifact {aid} says it holds {len(ids)} tokens "
                        f"with SHA-256 {tokens_sha256(ids)[:12]}, but the artifact holds {snap.token_count} other "
                        f"tokens; not reused: repair the index with `kvstore gc --store {store.root}`"),
                  file=sys.stderr, flush=True)
            continue
        if (snap.model_fingerprint, snap.tokenizer_fingerprint) != (be.fingerprint, be.tokenizer_fingerprint):
            continue
        if not [d for d in admission_differences(snap, be) if d.fact != "numerics"]:  # this backend, same facts
            return Reuse(str(aid), numerics_evidence_problem(snap.numerics, be.numerics(), former=be.former_numerics()),
                         dict(snap.extra))
    return None


def _reverify(store, be: Backend, ids: list[int], reuse: Reuse, tags: list[str]) -> tuple[str, bool]:
    """Re-verify a stored artifact whose numerics evidence is missing or not this machine's by reproduction: its
    prefix is recomputed here (with the artifact's own `extra`, so equal KV means equal bytes) and put. Equal bytes
    are the same id: the store then records the fingerprint measured here in place of what it had. Other bytes are
    another artifact, used instead (the old one is not). Returns (the id to use, whether it reproduced)."""
    try:
        aid = str(store.put(be.deposit(ids, extra=reuse.extra), tags=tags))
    except KVStoreError as e:
        raise LibraryError(f"re-verifying artifact {reuse.artifact_id} by recomputation failed: {e}") from e
    return aid, aid == reuse.artifact_id


def _evidence_kinds(suspects: list[Reuse]) -> str:
    """How many of the suspects' numerics records were missing, several, another machine's or unreadable."""
    kinds = {"no record": 0, "several fingerprints": 0, "another machine's": 0, "unreadable": 0}
    for r in suspects:
        key = ("unreadable" if "could not be read" in r.evidence else "no record" if "no numerics record" in r.evidence
               else "several fingerprints" if "fingerprints (" in r.evidence else "another machine's")
        kinds[key] += 1
    return ", ".join(f"{k}: {n}" for k, n in kinds.items() if n)


def _numerics_problem(snap: Snapshot, be: Backend) -> list[str]:
    """Why `snap`'s numerics record (attached by store.get) does not show this backend's numerics ([]: it does)."""
    problem = numerics_evidence_problem(snap.numerics, be.numerics(), "numerics", former=be.former_numerics())
    return [problem] if problem else []


def build_library(lib_cfg, be: Backend, project_root: Path = Path("."), progress: bool = True,
                  chat: ChatFrame | None = None) -> Path:
    """Verify, deposit and index every candidate solution on the backend `be`. Resumable: an entry whose tokens
    are already in the store for this model and these settings is not recomputed. Returns the library folder."""
    store = open_store(lib_cfg.store, project_root)
    candidates, origin = read_candidates(lib_cfg, project_root, be)  # a harvest run: re-checked, and by this model
    identity = library_identity(lib_cfg, be, project_root, candidates, chat)
    identity_sha256 = sha256_json(identity)
    out_dir = library_dir(project_root / lib_cfg.root, lib_cfg.name, lib_cfg.version, be.fingerprint, identity_sha256)
    tag = f"library:{lib_cfg.name}-v{lib_cfg.version}"
    entries: dict[str, dict] = {}
    skipped = []
    # Pass 1 (seconds): verify each solution, render and tokenize its entry, find those already deposited.
    planned: list[tuple[Problem, str, dict, str, list[int], str | None]] = []
    for p, solution in candidates:
        check = score(solution, p.answer)
        verification = {
            "scorer": "harness.answers.score",
            "extracted": check.extracted,
            "answer": check.answer,
            "gold": check.gold,
            "correct": check.correct,
        }
        if not check.correct:
            skipped.append(
                {
                    "problem_id": p.id,
                    "reason": f"solution's final answer {check.extracted!r} does not score correct against {p.answer}",
                    "verification": verification,
                }
            )
            continue
        text = render(lib_cfg.entry_template, problem=p.problem, solution=solution.strip(), answer=p.answer, id=p.id)
        ids = encode_entry(be, chat, text)  # with a chat template: the template's opening, then the entry
        refusal = be.graft_refusal(len(ids)) if isinstance(be, InEngineDecoding) else None
        if refusal is not None:  # an entry this backend would deposit but never graft (kvstore.InEngineDecoding)
            skipped.append({"problem_id": p.id, "verification": verification,
                            "reason": f"{be.name} cannot graft its {len(ids)}-token entry: {refusal}"})
            continue
        planned.append((p, solution, verification, text, ids, _reusable(store, ids, be)))
    # Pass 2: deposit what is not in the store yet, re-verify by recomputation what is there without this machine's
    # numerics evidence; progress in tokens (the work), ETA from tokens/s.
    t0 = time.perf_counter()
    todo = sum(len(ids) for *_, ids, r in planned if r is None or r.evidence)
    reused = sum(r is not None and not r.evidence for *_, r in planned)
    suspects = [r for *_, r in planned if r is not None and r.evidence]
    if progress and reused:
        print(f"library {lib_cfg.name}: {reused} of {len(planned)} entries already in the store (resumed)", flush=True)
    if suspects:  # said before the work, and what came of it after (the rule: absent evidence is not evidence)
        print(f"library {lib_cfg.name}: {len(suspects)} stored artifact(s) of this library's entries have no numerics "
              f"record showing this machine's numerics ({_evidence_kinds(suspects)}); each is re-verified by "
              "recomputing its prefix here and comparing the bytes, never reused on its record", flush=True)
    reproduced, replaced = [], []
    bar = tqdm(total=todo, desc=f"library {lib_cfg.name}: depositing", unit="tok", unit_scale=True,
               disable=not progress or todo == 0, miniters=1)
    for p, solution, verification, text, ids, reuse in planned:
        if reuse is not None and not reuse.evidence:
            aid = reuse.artifact_id
            store.add_tags(aid, [tag])
        elif reuse is not None:
            aid, same = _reverify(store, be, ids, reuse, [tag])
            (reproduced if same else replaced).append((reuse.artifact_id, aid))
            bar.update(len(ids))
        else:
            try:
                aid = str(store.put(be.deposit(ids, extra={"text_sha256": sha256_hex(text.encode())}),
                                    tags=[tag]))  # the capture's measured numerics are recorded with it
            except KVStoreError as e:
                raise LibraryError(f"depositing the entry for problem {p.id} failed: {e}") from e
            bar.update(len(ids))
            bar.set_postfix_str(f"entry {plain(p.id)}")  # an ANSI escape in an id is shown, not obeyed
        fp = problem_fingerprint(p.problem)
        entry = Entry(
            entry_id=sha256_hex(f"{fp}\n{solution}".encode())[:16],
            problem_id=p.id,
            problem_fingerprint=fp,
            problem=p.problem,
            answer=p.answer,
            artifact_id=aid,
            tokens=len(ids),
            origin=origin,
            verification=verification,
            tokens_sha256=tokens_sha256(ids),
        )
        entries.setdefault(entry.entry_id, entry.to_row())
    bar.close()
    if suspects:
        sha = be.numerics()
        print(f"library {lib_cfg.name}: re-verified by recomputation: {len(reproduced)} of {len(suspects)} "
              "reproduced byte for byte here" + (f" (numerics:{sha[:16]} recorded for them)" if sha else "")
              + (f"; {len(replaced)} did not (other bytes here: the recomputed artifact is used, the stored one is "
                 f"not: {', '.join(f'{a[:12]} -> {b[:12]}' for a, b in replaced[:5])})" if replaced else ""),
              flush=True)
    if progress:
        secs = time.perf_counter() - t0
        disk = sum(store.info(e["artifact_id"]).size for e in entries.values())
        toks = sum(e["tokens"] for e in entries.values())
        print(f"library {lib_cfg.name}: deposited {len(planned) - reused} entries ({todo} tokens) in {secs:.0f} s"
              + (f" = {todo / secs:.0f} tokens/s" if todo and secs > 0 else "")
              + f"; {reused} already in the store; {len(skipped)} refused; {disk / 1e9:.2f} GB on disk for {toks} "
              f"tokens ({disk / max(toks, 1) / 1e3:.1f} kB/token, {be.dtype}, {be.name}); peak RSS "
              f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6:.2f} GB", flush=True)
    if not entries:
        raise LibraryError(f"library {lib_cfg.name}: no verified solution to deposit ({len(skipped)} skipped)")
    rows = list(entries.values())
    manifest = {
        "format": LIBRARY_FORMAT,
        "name": lib_cfg.name,
        "version": lib_cfg.version,
        "origin": origin,
        "identity": identity,
        "identity_sha256": identity_sha256,
        "model_fingerprint": be.fingerprint,
        "tokenizer_fingerprint": be.tokenizer_fingerprint,
        "model_name": be.model_name,
        "entry_template_sha256": sha256_hex(lib_cfg.entry_template.encode()),
        "store": str(store.root),
        "skipped": skipped,
    }
    kept = _existing_store(out_dir)
    if kept is not None and kept != manifest["store"]:
        # the library of this identity exists: its manifest (which runs name by its SHA-256) is not rewritten to
        # name another store (issue 61); this build's deposits are in that other store
        print(f"library {lib_cfg.name}: {out_dir} already holds this library (its manifest names store {kept}); "
              f"left as it is: the entries deposited into {store.root} are there too, and runs keep naming the "
              "existing manifest", flush=True)
        return out_dir
    _write_library(out_dir, manifest, rows, be)
    return out_dir


def _existing_store(out_dir: Path) -> str | None:
    """The store a complete library folder's manifest names (None: no manifest there, or not readable as one)."""
    try:
        found = json.loads((out_dir / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return str(found.get("store")) if isinstance(found, dict) and "store" in found else None


def _write_library(out_dir: Path, manifest: dict, rows: list[dict], be: Backend) -> None:
    """Write index.jsonl, then manifest.json (last: a library without it is incomplete) with the entry hashes,
    totals, and the settings (llama.cpp: "backend" and its settings) and compute environment its artifacts were
    computed in."""
    manifest = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    manifest.update(
        determinism=be.settings(),
        environment=be.environment(),
        n_entries=len(rows),
        entries={r["entry_id"]: sha256_json(r) for r in rows},
        index_sha256=sha256_hex(jsonl_bytes(rows)),
        tokens_total=sum(r["tokens"] for r in rows),
    )
    manifest["manifest_sha256"] = sha256_json(manifest)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_jsonl(out_dir / "index.jsonl", rows)
    write_json(out_dir / "manifest.json", manifest)


def redeposit_library(lib_cfg, be: Backend, project_root: Path = Path("."),
                      progress: bool = True, chat: ChatFrame | None = None) -> dict:
    """Re-deposit every entry of the library `lib_cfg` names (built under the chat frame `chat`, if any) whose
    artifact this process could not graft exactly (another compute environment or settings), from the token ids
    the artifact holds, keeping entry ids.
    Returns {"path", "entries", "redeposited", "kept", "differences": {entry_id: [...]}}."""
    lib = open_library(lib_cfg, be, project_root, chat=chat)
    tag = f"library:{lib_cfg.name}-v{lib_cfg.version}"
    rows, differences = [], {}
    for e in tqdm(lib.entries, desc=f"redeposit {lib_cfg.name}", unit="entry", disable=not progress):
        try:
            snap = lib.store.get(e.artifact_id)
        except KVStoreError as err:
            raise LibraryError(f"library {lib.path}, entry {e.entry_id}: artifact {e.artifact_id} cannot be read "
                               f"({err}); rebuild the library with `make library`") from err
        lib.check_artifact(e, snap)
        if snap.tokenizer_fingerprint != be.tokenizer_fingerprint or snap.model_fingerprint != be.fingerprint:
            raise LibraryError(f"library {lib.path}, entry {e.entry_id}: its artifact was made with another model or "
                               "tokenizer, so its token ids cannot be re-deposited; rebuild it with `make library`")
        diffs = artifact_differences(snap, be) + _numerics_problem(snap, be)
        row = e.to_row()
        if diffs:
            differences[e.entry_id] = diffs
            try:  # the capture's measured numerics replace the record the store had
                aid = lib.store.put(be.deposit(snap.token_ids, extra=snap.extra), tags=[tag])
            except KVStoreError as err:
                raise LibraryError(f"re-depositing entry {e.entry_id} of {lib.path} failed: {err}") from err
            row["artifact_id"] = str(aid)
        rows.append(row)
    if differences:
        _write_library(lib.path, lib.manifest, rows, be)
    return {"path": str(lib.path), "entries": len(rows), "redeposited": len(differences),
            "kept": len(rows) - len(differences), "differences": differences}


def identity_changes(path: Path, identity: dict[str, Any]) -> tuple[Path, str] | None:
    """The newest other library folder of the same name, version and model beside `path`, and what of its recorded
    identity differs from `identity`, in words: each differing key, and for a backend's settings each setting with
    both values (`backend_settings.n_batch: 512 there, 256 here`). None when there is no such folder."""
    prefix = path.name.rsplit("-", 1)[0] + "-"
    others = sorted((p for p in path.parent.glob(f"{glob.escape(prefix)}*") if p != path
                     and (p / "manifest.json").is_file()), key=lambda p: p.stat().st_mtime, reverse=True)
    for other in others:
        try:
            recorded = json.loads((other / "manifest.json").read_text(encoding="utf-8")).get("identity")
        except (OSError, ValueError):
            continue
        if not isinstance(recorded, dict):
            continue
        words = []
        for k in sorted(set(identity) | set(recorded)):
            mine, theirs = identity.get(k), recorded.get(k)
            if mine == theirs:
                continue
            if isinstance(mine, dict) and isinstance(theirs, dict):
                words += [f"{k}.{s}: {theirs.get(s)!r} there, {mine.get(s)!r} here"
                          for s in sorted(set(mine) | set(theirs)) if mine.get(s) != theirs.get(s)]
            else:
                words.append(f"{k}: {str(theirs)[:16]!r} there, {str(mine)[:16]!r} here")
        return other, "; ".join(words) or "nothing recorded"
    return None


def open_library(lib_cfg, be: Backend, project_root: Path = Path("."),
                 build_if_missing: bool = False, chat: ChatFrame | None = None) -> Library:
    """The library `lib_cfg` names for this model and backend, searched as `lib_cfg.exclude_self` / `.retrieval`
    say: the one built from exactly the content `lib_cfg` describes (`library_identity`), its manifest and index
    re-checked."""
    identity = library_identity(lib_cfg, be, project_root, chat=chat)
    identity_sha256 = sha256_json(identity)
    path = library_dir(project_root / lib_cfg.root, lib_cfg.name, lib_cfg.version, be.fingerprint, identity_sha256)
    if not (path / "manifest.json").exists():
        if not build_if_missing:
            near = identity_changes(path, identity)
            what = (f"; the one built for this model at {near[0]} differs in {near[1]}" if near else
                    f" (source rows {identity['candidates_sha256'][:12]}, template "
                    f"{identity['entry_template_sha256'][:12]}) for model {be.fingerprint[:12]}")
            raise LibraryError(
                f"no library {lib_cfg.name} v{lib_cfg.version} built from this content at {path}{what}; build it "
                "with `make library` (with the same library.* and model.* overrides), or run `make aime-graft`, "
                "which builds it"
            )
        build_library(lib_cfg, be, project_root, chat=chat)
    store = open_store(lib_cfg.store, project_root)
    lib = Library(path, store, exclude_self=lib_cfg.exclude_self, retrieval=lib_cfg.retrieval)
    lib.entry_ids = _entry_encoder(lib_cfg, be, project_root, chat)
    _check_rows_against_source(lib, lib_cfg, be, project_root)
    if lib.manifest.get("identity_sha256") != identity_sha256:
        recorded = lib.manifest.get("identity") if isinstance(lib.manifest.get("identity"), dict) else {}
        differs = sorted(k for k in set(identity) | set(recorded) if identity.get(k) != recorded.get(k))
        raise LibraryError(
            f"{path / 'manifest.json'}: identity_sha256 is not that of the configured library (differs in: "
            f"{', '.join(differs) or 'identity_sha256'}): the folder holds a library built from other content; "
            "remove the folder and rebuild it with `make library`"
        )
    return lib


def _check_rows_against_source(lib: Library, lib_cfg, be: Backend, project_root: Path) -> None:
    """LibraryError unless every index row says what the library's source says of its entry: the problem id, the
    problem text (what held-out retrieval searches), its fingerprint and the answer, for an entry id the source makes.
    The index's own hashes prove only that the rows were sealed, not by whom: a library edited and re-sealed (answers,
    problem texts) is refused here, naming the first difference, instead of changing retrieval or an answer column
    silently (issue 51, item 9)."""
    candidates, _ = read_candidates(lib_cfg, project_root, be)
    source = {sha256_hex(f"{problem_fingerprint(p.problem)}\n{solution}".encode())[:16]: p
              for p, solution in candidates}
    for i, e in enumerate(lib.entries, start=1):
        p = source.get(e.entry_id)
        where = f"{lib.path / 'index.jsonl'}, row {i} (entry {e.entry_id})"
        if p is None:
            raise LibraryError(f"{where}: no such entry in the library's source ({lib_cfg.source}); the library was "
                               "modified and re-sealed: remove the folder and rebuild it with `make library`")
        for field, recorded, wanted in (("problem_id", e.problem_id, p.id), ("problem", e.problem, p.problem),
                                        ("problem_fingerprint", e.problem_fingerprint, problem_fingerprint(p.problem)),
                                        ("answer", str(e.answer), str(p.answer))):
            if recorded != wanted:
                raise LibraryError(f"{where}: {field} {str(recorded)[:60]!r} but the library's source says "
                                   f"{str(wanted)[:60]!r}; the library was modified and re-sealed: remove the folder "
                                   "and rebuild it with `make library`")


def _entry_encoder(lib_cfg, be: Backend, project_root: Path,
                   chat: ChatFrame | None) -> Callable[[Entry], tuple[str, list[int]] | None]:
    """entry -> (the problem fingerprint, the token ids) of the entry's own text: its problem and solution from the
    library's source (the rows whose SHA-256 the library's identity checked), rendered by the entry template and
    encoded as the build encodes them; None when the source holds no such entry. A graft compares them with the
    entry's row and the artifact's token ids, so a library re-sealed to point an entry at another problem's
    artifact (or another problem's retrieval at an entry) is refused (issue 41, finding 2)."""
    texts: dict[str, tuple[str, str]] | None = None
    cache: dict[str, tuple[str, list[int]]] = {}

    def ids(entry: Entry) -> tuple[str, list[int]] | None:
        nonlocal texts
        if texts is None:
            candidates, _ = read_candidates(lib_cfg, project_root, be)
            texts = {}
            for p, solution in candidates:
                fp = problem_fingerprint(p.problem)
                texts[sha256_hex(f"{fp}\n{solution}".encode())[:16]] = (fp, render(
                    lib_cfg.entry_template, problem=p.problem, solution=solution.strip(), answer=p.answer, id=p.id))
        if entry.entry_id not in cache:
            if entry.entry_id not in texts:
                return None
            fp, text = texts[entry.entry_id]
            cache[entry.entry_id] = (fp, encode_entry(be, chat, text))
        return cache[entry.entry_id]

    return ids


@exit_on_error
def main(argv: list[str] | None = None) -> None:
    """`python -m harness.library [--redeposit] [overrides]`: build the configured library and print what went in
    (--redeposit: re-deposit its entries that this environment cannot graft exactly, keeping entry ids)."""
    args = list(sys.argv[1:] if argv is None else argv)
    redeposit = "--redeposit" in args
    notes: list[str] = []
    cfg = compose_config([a for a in args if a != "--redeposit"], notes=notes)
    enter_profile(cfg.determinism.profile)  # re-executes with the profile's kernel variables when not set
    for note in notes:
        print_note(note)  # the exact default's one line (harness.config.exact), once, after any re-execution
    root = Path(cfg.project_root)
    c = typed(cfg)
    check_problem_sets(c, root, dataset=False)  # its problem file refuses here, before the model is loaded
    be = load_model(c)
    frame = chat_frame(be, c.model.chat)
    if redeposit:
        r = redeposit_library(cfg.library, be, root, chat=frame)
        kinds = sorted({d.split(":", 1)[0] for ds in r["differences"].values() for d in ds})
        print(f"library {r['path']}: {r['redeposited']} of {r['entries']} entries re-deposited in this compute "
              f"environment (differed in: {', '.join(kinds) or 'nothing'}), {r['kept']} already exact here")
        return
    path = build_library(cfg.library, be, root, chat=frame)
    m = Library(path, open_store(cfg.library.store, root)).manifest
    print(
        f"library {m['name']} v{m['version']}: {m['n_entries']} verified entries, {len(m['skipped'])} skipped, "
        f"{m['tokens_total']} tokens deposited -> {path} (manifest {m['manifest_sha256'][:12]})"
    )


if __name__ == "__main__":
    main()
