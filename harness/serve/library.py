"""A library served behind the endpoint: opened and audited once, then one entry per request, chosen and composed by
the graft condition's own code (harness.run.conditions.retrieve_entry / graft_context).

The rule that finds a request's problem by its content (docs/vllm.md, "The rule that finds a request's problem"):

1. the texts: a completion's `prompt` when it is one string (or a list of exactly one string); a chat request's
   messages whose content is a string or a list of text parts; the asked text is the prompt, or the last user
   message. Anything else (token ids, several prompts, no user message) has no problem the rule can tell;
2. every text is compared in its normal form (harness.library.content.normal: NFKC, LaTeX delimiters dropped, case
   folded, whitespace removed). A library problem is *in the request* when its normal form is inside the normal
   form of any of its texts (system message and few-shot examples included), or when at least NEAR_DUPLICATE of its
   3-word shingles are in the request's, or (once the problem asked is found, rule 3) NEAR_DUPLICATE of the asked
   problem's shingles are in its (a near duplicate, either way: harness.library.content.ContentIndex, which the
   harness's own held-out and random apply to the evaluated problem);
3. the problem asked: the library problem whose normal form ends last in the asked text, unless the text after it
   repeats the words that lead into it (`Question:` of a few-shot example: another question follows) or is longer
   than TAIL_CHARS normal characters; then (or when no library problem is in the asked text) the asked text itself:
   after the last library problem and its lead-in when there is one, and inside the prompt template when the text
   is the template (prompt.template) rendered around some X, exactly: X; empty: no problem;
4. the request's problem id: the library entry's own for a library problem, else `request-<fingerprint[:12]>`; its
   gold answer is the entry's (a request carries none; nothing is scored on the server).

Then the retrieval (RETRIEVAL: recurring = library.exclude_self false, BM25 for a problem not in the library;
held-out = exclude_self true, BM25; random = exclude_self true, a random other entry; held-out and random also
exclude every library problem in the request, rule 2) and the composition (the entry's tokens, then the client's text
as sent) are the graft condition's, called here, not copied. Under held-out and random a request whose problem the
rule cannot tell is served without a graft (fail closed).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from harness.errors import ConfigError, LibraryError
from harness.library.build import Library, Match
from harness.library.content import contains, normal, normal_map
from harness.run.conditions import graft_context, query_prompt, retrieve_entry
from harness.task.problems import Problem, problem_fingerprint
from kvstore import KVStoreError, open_store

#: RETRIEVAL -> (library.exclude_self, library.retrieval), the harness's own settings for each condition group
RETRIEVAL_MODES: dict[str, tuple[bool, str]] = {
    "recurring": (False, "bm25"),
    "held-out": (True, "bm25"),
    "random": (True, "random"),
}
CONDITIONS = ("graft", "incontext")
#: after the asked library problem, at most this many normal-form characters of wording (an instruction, `Answer:`)
TAIL_CHARS = 300
_LEAD_IN = re.compile(r"([^\W\d_]{3,}:?)$")  # the word (and colon) right before a problem: `question:`, `problem:`


@dataclass(frozen=True)
class Found:
    """What the rule found in a request: the problem asked (None: it cannot be told, `why`), how (`library`: a library
    problem by its normal form; `text`: the asked text, no library problem), and every library problem in the request
    (entry id -> problem id and the share of its shingles found: 1.0 for its normal form), which held-out and random
    never retrieve."""

    problem: Problem | None
    how: str = ""
    present: dict[str, tuple[str, float]] = field(default_factory=dict)
    why: str = ""

    @property
    def excluded(self) -> frozenset[str]:
        return frozenset(self.present)

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"problem_id": None, "found": None}
        if self.problem is not None:
            out = {"problem_id": self.problem.id, "found": self.how, "fingerprint": self.problem.fingerprint[:16],
                   "text": self.problem.problem[:80]}
        out["in_request"] = sorted({pid for pid, _ in self.present.values()})
        if self.why:
            out["why"] = self.why
        return out


@dataclass
class Composed:
    """What a request becomes: the problem found, the entry chosen, the context's token ids (entry + the text)."""

    problem: Problem
    prompt: str
    match: Match
    context_ids: list[int]
    entry_tokens: int

    def describe(self) -> dict[str, Any]:
        e = self.match.entry
        return {"entry": e.entry_id, "problem_id": e.problem_id, "artifact": e.artifact_id, "tokens": e.tokens,
                "match": self.match.kind, "similarity": round(float(self.match.similarity), 6)}


def retrieval_settings(mode: str) -> tuple[bool, str]:
    """(exclude_self, retrieval) of a RETRIEVAL name; a ConfigError naming the choices otherwise."""
    try:
        return RETRIEVAL_MODES[mode]
    except KeyError:
        raise ConfigError(f"RETRIEVAL={mode!r} is not one of {[*RETRIEVAL_MODES, 'none']} (none: the server without "
                          "a library)") from None


def built_for(manifest: dict[str, Any], text: Any, path: Path) -> None:
    """LibraryError in one line unless the library's manifest says it was built for the served model `text` (its
    model and tokenizer fingerprints) and its artifacts computed on `text`'s backend."""
    for key, mine in (("model_fingerprint", text.fingerprint), ("tokenizer_fingerprint", text.tokenizer_fingerprint)):
        if manifest.get(key) != mine:
            raise LibraryError(f"library {path}: built for another model ({key} {str(manifest.get(key))[:12]}, the "
                               f"served model's {mine[:12]}); serve its model (MODEL=) or build the library for this "
                               "one (`make library ARGS=\"model=...\"`)")
    recorded = manifest.get("determinism")
    backend = recorded.get("backend") if isinstance(recorded, dict) else None
    if backend != text.name:
        raise LibraryError(f"library {path}: its artifacts were computed on backend {backend!r}, the server runs "
                           f"{text.name!r}; build it with model=<name>_{text.name}")


class _ServedModel:
    """The served model `text` (kvstore.load_text_model: no engine) as open_library reads a backend: its name,
    fingerprints, encode and chat template, and `settings()`: the engine settings its library's artifacts record
    (`recorded`, read from the store; the connector compares each artifact's with the live engine's on every
    graft)."""

    def __init__(self, text: Any, recorded: dict[str, Any]) -> None:
        self.text, self.recorded = text, recorded
        self.name, self.model_name = text.name, text.model_name
        self.fingerprint, self.tokenizer_fingerprint = text.fingerprint, text.tokenizer_fingerprint

    def settings(self) -> dict[str, Any]:
        return dict(self.recorded)

    def batch_invariant(self) -> bool:
        return False  # kvgraft's batch-invariant mode is the transformers backend's (kvstore.Backend)

    def encode(self, text: str, add_bos: bool = True, special: bool = False) -> list[int]:
        return self.text.encode(text, add_bos=add_bos, special=special)

    def chat_template(self) -> str | None:
        return self.text.chat_template()


def open_served(path: str | Path, store: str, mode: str, text: Any, project_root: str | Path = ".",
                overrides: list[str] | tuple[str, ...] = ()) -> Library:
    """The library folder `path` opened as the harness's graft condition opens its library (harness.library.build.
    open_library: the manifest and index hashes, the identity rebuilt from the library's source and compared, every
    row checked against the source, each entry's own token ids for `check_artifact`), for the served model `text`
    and RETRIEVAL `mode`. Its config is the one its manifest names (configs/library/<name>.yaml), with the source
    selection its identity records, the folder's parent as library.root and `store`; `overrides` (library.*=...) last.
    A LibraryError in one line when the folder is not the library that config builds for this model."""
    from harness.config.schema import compose_config
    from harness.library.build import open_library
    from harness.task.chat import chat_frame

    exclude_self, retrieval = retrieval_settings(mode)
    folder = Path(path).resolve()
    if not (folder / "manifest.json").is_file():
        raise LibraryError(f"LIBRARY={path}: no manifest.json there; give a library folder (one that `make library` "
                           "built, under library.root)")
    try:
        store_obj = open_store(store)
    except KVStoreError as e:
        raise LibraryError(f"LIBRARY={path}: its store {store} cannot be opened ({e}); give STORE= the store the "
                           "library was built into") from e
    sealed = Library(folder, store_obj)  # its manifest and index against their own hashes first
    built_for(sealed.manifest, text, folder)
    identity = sealed.manifest.get("identity")
    if not isinstance(identity, dict) or not isinstance(identity.get("name"), str):
        raise LibraryError(f"LIBRARY={path}: manifest.json records no identity, so the library's source cannot be "
                           "checked; serve a library that `make library` built")
    try:
        cfg = compose_config([f"library={identity['name']}", f"project_root={Path(project_root).resolve()}"]
                             + [f"library.{k}" for k in _selection(identity)] + list(overrides))
    except ConfigError as e:
        raise LibraryError(f"LIBRARY={path}: the library config its manifest names (library={identity['name']}, "
                           f"configs/library/{identity['name']}.yaml, with the source it records) does not compose "
                           f"({e}); serve it from the checkout that built it, or give --library-override") from e
    lib_cfg = cfg.library
    lib_cfg.root, lib_cfg.store = str(folder.parent), store
    lib_cfg.exclude_self, lib_cfg.retrieval = exclude_self, retrieval
    model = text if callable(getattr(text, "settings", None)) else _ServedModel(text, _recorded(sealed, folder))
    chat = chat_frame(model, "model") if "chat_frame_sha256" in identity else None
    lib = open_library(lib_cfg, model, Path(cfg.project_root), chat=chat)
    if lib.path.resolve() != folder:
        raise LibraryError(f"LIBRARY={path}: its content is that of the library at {lib.path}, not of this folder; "
                           "serve the folder `make library` built")
    return lib


def _selection(identity: dict[str, Any]) -> list[str]:
    """The library config overrides (after `library.`) that select the source its identity records."""
    if identity.get("source") == "harvest":
        return [f"harvest_run={identity.get('source_harvest_run')}"]
    out = []
    for key in ("path", "hub_id", "subset", "split", "limit"):
        value = identity.get(f"source_{key}")
        out.append(f"dataset.{key}={'null' if value is None else json.dumps(value) if key != 'split' else value}")
    for field_, column in (identity.get("source_columns") or {}).items():
        out.append(f"dataset.columns.{field_}={column}")
    return out


def _recorded(sealed: Library, folder: Path) -> dict[str, Any]:
    """The engine settings the library's first artifact records (its determinism), read from the store."""
    if not sealed.entries:
        return {}
    e = sealed.entries[0]
    try:
        return dict(sealed.store.get(e.artifact_id).determinism)
    except KVStoreError as err:
        raise LibraryError(f"library {folder}, entry {e.entry_id} (problem {e.problem_id}): artifact "
                           f"{e.artifact_id[:16]} {type(err).__name__}: {err}; rebuild the library (`make library`) "
                           "or give STORE= its store") from err


class ServedLibrary:
    """A library folder opened for the served model `text` (kvstore.load_text_model) through the graft condition's
    checks (`open_served`) and audited (`audit`)."""

    def __init__(self, path: str | Path, store: str, mode: str, text: Any, template: str,
                 project_root: str | Path = ".", overrides: list[str] | tuple[str, ...] = ()) -> None:
        exclude_self, _ = retrieval_settings(mode)
        self.library = open_served(path, store, mode, text, project_root, overrides)
        self.mode, self.text, self.template = mode, text, template
        self.excludes = exclude_self
        self._own = {e.problem_fingerprint: e for e in self.library.entries}
        self._normal = [(normal(e.problem), e) for e in self.library.entries]
        head, sep, tail = template.partition("{problem}")
        self._around = (head, tail) if sep else None
        self._sealed = self._seal()

    def _seal(self) -> str:
        """SHA-256 of the library folder's manifest and index bytes as they are now ("" when unreadable)."""
        import hashlib

        h = hashlib.sha256()
        try:
            for name in ("manifest.json", "index.jsonl"):
                h.update((self.library.path / name).read_bytes())
        except OSError:
            return ""
        return h.hexdigest()

    def changed(self) -> str | None:
        """Why the library cannot be served now: its folder's manifest or index changed (or went) since it was opened
        and audited; None when they are the bytes audited."""
        if self._seal() == self._sealed:
            return None
        return (f"library {self.library.path} changed since the server opened and audited it (manifest.json or "
                "index.jsonl): nothing is grafted from it; restart the server to audit it again")

    def audit(self) -> None:
        """LibraryError in one line unless the library (its manifest and index already checked against their hashes
        when opened) was built for the served model and tokenizer, and every entry's artifact is in the store, reads
        back to its id and holds exactly the entry's tokens."""
        lib = self.library
        built_for(lib.manifest, self.text, lib.path)
        for e in lib.entries:
            try:
                snap = lib.store.get(e.artifact_id)
            except KVStoreError as err:
                raise LibraryError(f"library {lib.path}, entry {e.entry_id} (problem {e.problem_id}): artifact "
                                   f"{e.artifact_id[:16]} {type(err).__name__}: {err}; rebuild the library "
                                   "(`make library`) or give STORE= its store") from err
            lib.check_artifact(e, snap)

    # ------------------------------------------------------------------ the rule (module docstring)
    def find(self, asked: str, others: list[str] | tuple[str, ...] = ()) -> Found:
        """The problem asked in `asked` (a completion's prompt, a chat request's last user message) and every library
        problem in the request (`asked` and `others`: its other messages) or a near duplicate of the problem asked,
        by the module's rule (the harness's held-out and random exclude the same: Library.present)."""
        found = self._find(asked, others)
        if found.problem is None:
            return found
        near = self.library.present([], asked=found.problem.problem)
        return replace(found, present={**near, **found.present})

    def _find(self, asked: str, others: list[str] | tuple[str, ...]) -> Found:
        present = self.library.present([asked, *others])  # the harness's held-out and random apply the same rule
        src, n_asked, where = normal_map(asked)
        if not n_asked:
            return Found(None, present=present, why="the asked text is empty")
        last, end = None, -1
        for n, e in self._normal:
            at = contains(n_asked, n)
            if at > end or (at == end >= 0 and last is not None and len(n) > len(normal(last.problem))):
                last, end = e, at
        rest = asked  # no library problem in it: the text as sent (the harness's problem text, for its own prompt)
        if last is not None:
            tail = n_asked[end:]
            lead = _LEAD_IN.search(n_asked[: end - len(normal(last.problem))])
            repeated = lead is not None and lead.group(1) in tail
            if not repeated and len(tail) <= TAIL_CHARS:
                return Found(Problem(id=last.problem_id, problem=last.problem, answer=last.answer), "library", present)
            cut = end + (tail.rfind(lead.group(1)) + len(lead.group(1)) if repeated else 0)
            rest = src[where[cut]:]
        body = self._inside_template(rest).strip()
        if not body:
            return Found(None, present=present, why="no text after the last library problem in the asked text")
        fp = problem_fingerprint(body)
        own = self._own.get(fp)
        if own is not None:  # the same text as a library problem's, whitespace and case aside
            return Found(Problem(id=own.problem_id, problem=body, answer=own.answer), "library", present)
        return Found(Problem(id=f"request-{fp[:12]}", problem=body, answer="0"), "text", present)

    def _inside_template(self, text: str) -> str:
        """X when `text` is the prompt template rendered around X, exactly; else `text`."""
        if self._around is not None:
            head, tail = self._around
            if len(text) >= len(head) + len(tail) and text.startswith(head) and text.endswith(tail):
                return text[len(head): len(text) - len(tail)]
        return text

    def problem(self, text: str) -> Problem | None:
        """The problem the rule finds in a completion's prompt `text` alone (None: none)."""
        return self.find(text).problem

    def query(self, problem: Problem) -> str:
        """The harness's query prompt for `problem` (prompt.template rendered)."""
        return query_prompt(self.template, problem)

    def retrieve(self, found: Found) -> Match | None:
        """The entry for the problem found: the graft condition's retrieval, never (held-out, random) a library
        problem in the request."""
        assert found.problem is not None
        return self.library.retrieve(found.problem, exclude=found.excluded)

    def compose(self, problem: Problem, match: Match | None = None, prompt: str | None = None) -> Composed | None:
        """The graft condition's entry and context for `problem`: the entry's tokens, then `prompt` (the client's
        text as sent; default: the harness's query prompt). None when retrieval finds no entry; `match` when it was
        retrieved already. A KVStoreError or LibraryError when the entry's artifact cannot be read or does not hold
        its tokens."""
        found = retrieve_entry(self.library, problem, match=match)
        if found is None:
            return None
        match, snapshot = found
        prompt = query_prompt(self.template, problem) if prompt is None else prompt
        return Composed(problem, prompt, match, graft_context(self.text, None, snapshot, prompt),
                        int(snapshot.token_count))
