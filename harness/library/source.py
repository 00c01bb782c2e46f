"""What a solution library is built from: its candidate (problem, solution) pairs, read from a problem set
(`library.source=dataset`) or harvested from a run's correct rows (`library.source=harvest`), and the identity of
that content (`library_identity`), whose SHA-256 names the library's folder and is checked when it is opened
(harness/library/build.py). A library built from other rows, another selection (path, columns, limit), another entry
template or another model is another library: it is never reused in place of this one.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.config.identity import RunIdentity
from harness.errors import HarnessError, LibraryError
from harness.record.folder import RunFolder
from harness.record.hashing import sha256_hex, sha256_json
from harness.task.chat import ChatFrame
from harness.task.problems import Problem, load_problems

if TYPE_CHECKING:
    from kvstore import Backend

LIBRARY_FORMAT = "kvgraft-library/1"


def read_candidates(lib_cfg, project_root: Path, be: Backend | None = None) -> tuple[list[tuple[Problem, str]], str]:
    """(problem, solution text) pairs and the origin label. A harvest run is re-checked first (`check_harvest_run`:
    its audit and, given the library's model `be`, its model)."""
    if lib_cfg.source == "dataset":
        d = lib_cfg.dataset
        path = str(project_root / d.path) if d.path else None
        problems = load_problems(path, d.hub_id, d.subset, d.split, dict(d.columns), d.limit)
        return [(p, p.solution) for p in problems if p.solution], f"dataset:{d.name}"
    if lib_cfg.source == "harvest":
        if not lib_cfg.harvest_run:
            raise LibraryError("library.source=harvest needs library.harvest_run=<run folder>")
        run = RunFolder(project_root / lib_cfg.harvest_run)
        check_harvest_run(run, be)
        try:
            probs = {r["id"]: r for r in run.read_problems()}
            rows = run.read_rows()
        except HarnessError as e:
            raise LibraryError(f"harvest run {run.path}: {e}; give a finished run folder") from e
        out, seen = [], set()
        for r in rows:
            if r.correct and r.problem_id not in seen and r.problem_id in probs:
                seen.add(r.problem_id)
                pr = probs[r.problem_id]
                text = r.completion.text
                out.append((Problem(pr["id"], pr["problem"], pr["answer"], text, pr.get("source") or {}), text))
        return out, f"harvest:{run.name}"
    raise LibraryError(f"library.source={lib_cfg.source!r}: use 'dataset' or 'harvest'")


def check_harvest_run(run: RunFolder, be: Backend | None = None) -> None:
    """LibraryError unless the harvest run re-checks (harness.record.audit: every manifest hash, every score
    recomputed, the summary; what `make rescore` prints) and, given the model `be`, was run with that model and
    tokenizer (fingerprints): a library never takes rows from an edited run or another model's (issue 41,
    finding 3)."""
    from harness.record.audit import audit

    try:
        check = audit(run)
    except HarnessError as e:
        raise LibraryError(f"harvest run {run.path}: {e}; give a finished run folder") from e
    if not check.ok:
        shown = "; ".join(check.findings[:3]) + (f"; ... ({len(check.findings)} findings)"
                                                 if len(check.findings) > 3 else "")
        raise LibraryError(f"harvest run {run.path} does not re-check ({shown}): it was modified after it was "
                           f"written; see `make rescore RUN={run.path}`, and harvest from an intact run")
    if be is None:
        return
    try:
        inputs = run.read_manifest().get("inputs")
    except HarnessError as e:
        raise LibraryError(f"harvest run {run.path}: {e}; give a finished run folder") from e
    inputs = inputs if isinstance(inputs, dict) else {}
    for key, mine in (("model_fingerprint", be.fingerprint), ("tokenizer_fingerprint", be.tokenizer_fingerprint)):
        theirs = inputs.get(key)  # where a run records it (harness.record.manifest): manifest.json inputs.<key>
        if not isinstance(theirs, str) or not theirs:  # absent evidence is not evidence: no record, no harvest
            raise LibraryError(
                f"harvest run {run.path}: manifest.json inputs.{key} is missing, so the model that wrote its rows "
                f"cannot be told; the harvest loop grafts a model's own verified solutions: harvest from a run made "
                f"by this harness with {be.model_name}")
        if theirs != mine:
            raise LibraryError(
                f"harvest run {run.path}: its {key} {theirs[:12]} (manifest.json inputs.{key}) is not the library "
                f"model's {mine[:12]} ({be.model_name}): the harvest loop grafts a model's own verified solutions; "
                "harvest with this model, or build the library with the harvest run's model")


def library_identity(lib_cfg, be: Backend, project_root: Path,
                     candidates: list[tuple[Problem, str]] | None = None,
                     chat: ChatFrame | None = None) -> dict[str, Any]:
    """Everything that determines a library's content: the candidate rows it is built from (`candidates`, read
    from the source when not given) and the source file's SHA-256, how they are selected (dataset path, hub id,
    columns, limit; or the harvested run and its manifest SHA-256), the entry template, the model and tokenizer.
    Its SHA-256 names the library's folder and is checked when the library is opened."""
    if candidates is None:
        candidates, _ = read_candidates(lib_cfg, project_root, be)  # a harvest run: by this model, or refused
    if lib_cfg.source == "dataset":
        d = lib_cfg.dataset
        path = project_root / d.path if d.path else None
        source = {"path": d.path, "hub_id": d.hub_id, "subset": d.subset, "split": d.split,
                  "columns": dict(d.columns), "limit": d.limit,
                  "file_sha256": _file_sha256(path) if path is not None else None}
    else:
        run = RunFolder(project_root / lib_cfg.harvest_run)
        try:
            manifest_sha256 = run.read_manifest().get("manifest_sha256")
        except HarnessError as e:
            raise LibraryError(f"harvest run {run.path}: {e}; give a finished run folder") from e
        source = {"harvest_run": lib_cfg.harvest_run, "manifest_sha256": manifest_sha256}
    identity = {
        "format": LIBRARY_FORMAT, "name": lib_cfg.name, "version": lib_cfg.version, "source": lib_cfg.source,
        **{f"source_{k}": v for k, v in source.items()},
        "candidates_sha256": sha256_json([[p.to_row(), text] for p, text in candidates]),
        "entry_template_sha256": sha256_hex(lib_cfg.entry_template.encode()),
        "model_fingerprint": be.fingerprint, "tokenizer_fingerprint": be.tokenizer_fingerprint,
    }
    # the backend (absent for transformers) and the batch-invariant mode (absent when off): every library built before
    # either existed keeps its folder (harness.config.identity)
    identity.update(RunIdentity(be).library_fields())
    if chat is not None:  # entries open the model's chat template (absent without one: earlier folders stay)
        identity["chat_frame_sha256"] = chat.sha256
    return identity


def _file_sha256(path: Path) -> str:
    try:
        return sha256_hex(path.read_bytes())
    except OSError as e:
        raise LibraryError(f"library.dataset.path {path}: cannot read it ({e.strerror or e}); give an existing "
                           "problem file") from e
