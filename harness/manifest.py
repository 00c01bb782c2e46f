"""Run manifests: build one for a finished run, and re-check a run folder without loading any model.

A manifest (``manifest.json``, format ``kvgraft-manifest/1``, described in ``harness/RUN_FORMAT.md``)
records the SHA-256 of every input of a run (problem rows, prompt template, resolved config, model and
tokenizer fingerprints, artifact ids, code commit, packages, environment, determinism settings) and of
every output (each ``outputs.jsonl`` row, its completion text and token ids, the extracted answer and
score, the file bytes and the summary). Design invariant 4: every reported number traces to a manifest
whose hashes can be re-checked without the engine; :func:`verify_run` is that re-check.

Hashes per output row (``outputs.rows[i]``):

- ``row_sha256``: SHA-256 of the canonical JSON of the whole row;
- ``completion_sha256``: SHA-256 of the UTF-8 bytes of ``row["completion"]``;
- ``token_ids_sha256``: SHA-256 of the canonical JSON of ``row["completion_token_ids"]``
  (the prompt token ids are covered by ``row_sha256``).

Usage::

    manifest = build_manifest(problems=..., prompt_template=..., config=..., ..., outputs_bytes=data)
    write_json(run_dir / "manifest.json", manifest)
    check = verify_run(run_dir)          # or: python scripts/rescore.py RUN_DIR
    assert check.ok, check.problems
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.answers import score
from harness.errors import ManifestError
from harness.hashing import canonical_json, jsonl_bytes, sha256_hex, sha256_json
from harness.metrics import summarize_groups, summarize_scores

__all__ = [
    "MANIFEST_FORMAT",
    "PACKAGES",
    "RunCheck",
    "build_manifest",
    "code_state",
    "completion_sha256",
    "diff_values",
    "package_versions",
    "problem_id_of",
    "token_ids_sha256",
    "verify_run",
]

MANIFEST_FORMAT = "kvgraft-manifest/1"
SUMMARY_FORMAT = "kvgraft-summary/1"

#: Distributions whose versions every manifest records (None when not installed).
PACKAGES: tuple[str, ...] = (
    "torch",
    "transformers",
    "safetensors",
    "hydra-core",
    "mlflow",
    "sympy",
    "math-verify",
    "datasets",
    "numpy",
    "kvgraft",
)

_REPO_ROOT = Path(__file__).resolve().parents[1]
_SCORE_FIELDS = ("extracted", "answer", "correct")
_MAX_ROW_MESSAGES = 20  # per check, so a wholesale corruption does not print 10,000 lines
_REL_TOL = 1e-9  # summary floats are re-derived; allow last-ulp libm differences across machines


# --- hashes of single values ------------------------------------------------------------------------


def completion_sha256(completion: str) -> str:
    """SHA-256 of a completion's UTF-8 bytes (``outputs.rows[i].completion_sha256``)."""
    return sha256_hex(completion.encode("utf-8"))


def token_ids_sha256(token_ids: Sequence[int]) -> str:
    """SHA-256 of the canonical JSON of a completion's token ids (``outputs.rows[i].token_ids_sha256``)."""
    return sha256_json(list(token_ids))


def problem_id_of(problem: dict[str, Any]) -> str:
    """The id of a problem row: its ``id`` field (bundled/AIME format), else ``problem_id``."""
    pid = problem.get("id", problem.get("problem_id"))
    if pid is None:
        raise ManifestError(
            f"problem row without an 'id' (or 'problem_id') field: {str(problem)[:120]}; "
            "every problem row needs a unique id"
        )
    return str(pid)


# --- environment of the build -----------------------------------------------------------------------


def _git(*args: str) -> str | None:
    """Output of ``git <args>`` in the repository, or None if git or the repository is unavailable."""
    try:
        proc = subprocess.run(
            ["git", *args], cwd=_REPO_ROOT, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def code_state() -> dict[str, Any]:
    """``{"commit": sha|None, "dirty": bool|None}`` of the repository holding this code.

    ``dirty`` is True when ``git status --porcelain`` lists anything (modified or untracked, not ignored).
    """
    head = _git("rev-parse", "--verify", "HEAD")
    status = _git("status", "--porcelain")
    return {
        "commit": head.strip() if head else None,
        "dirty": None if status is None else bool(status.strip()),
    }


def package_versions(names: Iterable[str] = PACKAGES) -> dict[str, str | None]:
    """Installed version of each distribution in ``names`` (None when it is not installed)."""
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


# --- build ------------------------------------------------------------------------------------------


def _output_entry(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "problem_id": row["problem_id"],
        "sample": row["sample"],
        "row_sha256": sha256_json(row),
        "completion_sha256": completion_sha256(row["completion"]),
        "token_ids_sha256": token_ids_sha256(row["completion_token_ids"]),
        "extracted": row["extracted"],
        "answer": row["answer"],
        "correct": row["correct"],
    }


def build_manifest(
    *,
    problems: list[dict[str, Any]],
    prompt_template: str,
    config: dict[str, Any],
    model_fingerprint: str,
    tokenizer_fingerprint: str,
    determinism: dict[str, Any],
    environment: dict[str, Any],
    rows: list[dict[str, Any]],
    outputs_bytes: bytes,
    summary: dict[str, Any],
    library: dict[str, Any] | None = None,
    artifacts: Iterable[str] = (),
) -> dict[str, Any]:
    """Return the manifest of a run (``kvgraft-manifest/1``, see ``harness/RUN_FORMAT.md``).

    ``outputs_bytes`` must be exactly the bytes written to ``outputs.jsonl`` (canonical lines of
    ``rows``); a mismatch raises :class:`ManifestError` rather than producing a manifest that can never
    verify. ``artifacts`` is merged with every non-null ``artifact_id`` of ``rows``.
    """
    if outputs_bytes != jsonl_bytes(rows):
        raise ManifestError(
            "outputs_bytes are not the canonical JSON lines of rows: write outputs.jsonl with "
            "harness.hashing.jsonl_bytes(rows) and pass those same bytes to build_manifest"
        )
    problem_hashes: dict[str, str] = {}
    for problem in problems:
        pid = problem_id_of(problem)
        if pid in problem_hashes:
            raise ManifestError(f"duplicate problem id {pid!r} in the run's problems; ids must be unique")
        problem_hashes[pid] = sha256_json(problem)
    artifact_ids = {str(a) for a in artifacts}
    artifact_ids.update(str(r["artifact_id"]) for r in rows if r.get("artifact_id") is not None)

    inputs: dict[str, Any] = {
        "problems": problem_hashes,
        "prompt_template": sha256_hex(prompt_template.encode("utf-8")),
        "config": sha256_json(config),
        "model_fingerprint": model_fingerprint,
        "tokenizer_fingerprint": tokenizer_fingerprint,
        "code": code_state(),
        "packages": package_versions(),
        "environment": environment,
        "determinism": determinism,
        "artifacts": sorted(artifact_ids),
    }
    if library is not None:
        inputs["library"] = library
    manifest: dict[str, Any] = {
        "format": MANIFEST_FORMAT,
        "inputs": inputs,
        "outputs": {
            "rows": [_output_entry(row) for row in rows],
            "outputs_sha256": sha256_hex(outputs_bytes),
            "summary_sha256": sha256_json(summary),
        },
    }
    # Round-trip through JSON so the self-hash is over exactly what a reader will parse.
    manifest = json.loads(canonical_json(manifest))
    manifest["manifest_sha256"] = sha256_json(manifest)
    return manifest


# --- verify -----------------------------------------------------------------------------------------


@dataclass
class RunCheck:
    """Result of :func:`verify_run`.

    ``ok`` is True only when ``problems`` is empty. Each problem names the file, the row (1-based line,
    problem id, sample) or field, and what to do. ``scores`` is ``summarize_scores`` recomputed from
    ``outputs.jsonl`` by re-scoring every completion; ``recorded_scores`` is ``summary.json``'s ``scores``.
    """

    ok: bool
    problems: list[str]
    n_rows: int
    scores: dict[str, Any]
    recorded_scores: dict[str, Any] = field(default_factory=dict)


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise ManifestError(
            f"{path}: file is missing; a complete run folder has it (see RUN_FORMAT.md)"
        ) from None
    except OSError as exc:
        raise ManifestError(f"{path}: cannot read it ({exc.strerror or exc})") from exc


def _read_json_object(path: Path) -> dict[str, Any]:
    data = _read_bytes(path)
    try:
        obj = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestError(f"{path}: not valid UTF-8 JSON ({exc}); restore the file from the run") from exc
    if not isinstance(obj, dict):
        raise ManifestError(f"{path}: expected a JSON object, found {type(obj).__name__}")
    return obj


def _jsonable(obj: Any) -> Any:
    """``obj`` as it would read back from JSON (tuples -> lists, int keys -> str, numpy scalars -> Python)."""

    def default(o: Any) -> Any:
        if hasattr(o, "item"):
            return o.item()
        raise TypeError(f"not JSON serialisable: {type(o).__name__}")

    return json.loads(json.dumps(obj, default=default, allow_nan=True))


def _same_number(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    fa, fb = float(a), float(b)
    if math.isnan(fa) or math.isnan(fb):
        return math.isnan(fa) and math.isnan(fb)
    return math.isclose(fa, fb, rel_tol=_REL_TOL, abs_tol=1e-12)


def diff_values(recorded: Any, recomputed: Any, path: str) -> list[tuple[str, Any, Any]]:
    """Leaves where ``recorded`` differs from ``recomputed`` as ``(dotted path, recorded, recomputed)``."""
    if isinstance(recorded, dict) and isinstance(recomputed, dict):
        out: list[tuple[str, Any, Any]] = []
        for key in sorted(set(recorded) | set(recomputed), key=str):
            sub = f"{path}.{key}"
            if key not in recorded:
                out.append((sub, "<missing>", recomputed[key]))
            elif key not in recomputed:
                out.append((sub, recorded[key], "<missing>"))
            else:
                out.extend(diff_values(recorded[key], recomputed[key], sub))
        return out
    if isinstance(recorded, list) and isinstance(recomputed, list):
        if len(recorded) != len(recomputed):
            return [(path, recorded, recomputed)]
        return [
            d
            for i, (a, b) in enumerate(zip(recorded, recomputed, strict=True))
            for d in diff_values(a, b, f"{path}.{i}")
        ]
    numeric = (int, float)
    if isinstance(recorded, numeric) and isinstance(recomputed, numeric):
        return [] if _same_number(recorded, recomputed) else [(path, recorded, recomputed)]
    return [] if recorded == recomputed else [(path, recorded, recomputed)]


class _Problems:
    """Collects problem messages, capping the per-check count of row-level messages."""

    def __init__(self) -> None:
        self.messages: list[str] = []
        self._counts: dict[str, int] = {}

    def add(self, message: str) -> None:
        self.messages.append(message)

    def add_row(self, check: str, message: str) -> None:
        n = self._counts.get(check, 0) + 1
        self._counts[check] = n
        if n <= _MAX_ROW_MESSAGES:
            self.messages.append(message)

    def finish(self) -> list[str]:
        for check, n in self._counts.items():
            if n > _MAX_ROW_MESSAGES:
                self.messages.append(f"... and {n - _MAX_ROW_MESSAGES} more rows failing the {check} check")
        return self.messages


def _row_label(line_no: int, row: dict[str, Any] | None) -> str:
    if row is None:
        return f"outputs.jsonl line {line_no}"
    return (
        f"outputs.jsonl line {line_no} (problem_id={row.get('problem_id')!r}, sample={row.get('sample')!r})"
    )


def _parse_jsonl(data: bytes, name: str, probs: _Problems) -> list[tuple[int, dict[str, Any] | None]]:
    """``(line number, row or None if unparsable)`` for each line of a ``.jsonl`` file."""
    if data and not data.endswith(b"\n"):
        probs.add(f"{name}: the last line has no trailing newline; the file was truncated or edited")
    out: list[tuple[int, dict[str, Any] | None]] = []
    for i, line in enumerate(data.splitlines(), start=1):
        try:
            obj = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            probs.add_row(
                f"{name} parse", f"{name} line {i}: not valid UTF-8 JSON ({exc}); the file was edited"
            )
            out.append((i, None))
            continue
        if not isinstance(obj, dict):
            probs.add_row(
                f"{name} parse", f"{name} line {i}: expected a JSON object, found {type(obj).__name__}"
            )
            out.append((i, None))
            continue
        out.append((i, obj))
    return out


def _check_problems_file(
    run_dir: Path, inputs: dict[str, Any], probs: _Problems
) -> dict[str, dict[str, Any]]:
    """Check problems.jsonl against ``inputs.problems``; return the parsed problems by id."""
    parsed = _parse_jsonl(_read_bytes(run_dir / "problems.jsonl"), "problems.jsonl", probs)
    recorded = inputs.get("problems")
    if not isinstance(recorded, dict):
        probs.add("manifest.json: inputs.problems is missing or not an object; the manifest is damaged")
        recorded = {}
    by_id: dict[str, dict[str, Any]] = {}
    for line_no, problem in parsed:
        if problem is None:
            continue
        pid = problem.get("id", problem.get("problem_id"))
        if pid is None:
            probs.add(f"problems.jsonl line {line_no}: no 'id' field; the file was edited")
            continue
        pid = str(pid)
        if pid in by_id:
            probs.add(f"problems.jsonl line {line_no}: duplicate problem id {pid!r}")
        by_id[pid] = problem
        want = recorded.get(pid)
        if want is None:
            probs.add(
                f"problems.jsonl line {line_no} (id={pid!r}): not in manifest inputs.problems; "
                "the file was edited or belongs to another run"
            )
        elif sha256_json(problem) != want:
            probs.add(
                f"problems.jsonl line {line_no} (id={pid!r}): SHA-256 differs from manifest inputs.problems; "
                "the problem row (text or answer) changed after the run: restore it or re-run"
            )
    for pid in sorted(set(recorded) - set(by_id)):
        probs.add(
            f"problems.jsonl: problem {pid!r} listed in manifest inputs.problems is missing from the file"
        )
    return by_id


def _check_config(run_dir: Path, inputs: dict[str, Any], probs: _Problems) -> None:
    path = run_dir / "config.yaml"
    if not path.exists():
        return  # not needed to re-score; its hash is checked when present
    import yaml

    try:
        config = yaml.safe_load(_read_bytes(path).decode("utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        probs.add(f"config.yaml: not valid YAML ({exc}); restore it from the run")
        return
    if sha256_json(config) != inputs.get("config"):
        probs.add(
            "config.yaml: SHA-256 of the resolved config differs from manifest inputs.config; "
            "the config was edited after the run: restore it or re-run"
        )


def _check_row_hashes(line_no: int, row: dict[str, Any], entry: Any, probs: _Problems) -> None:
    """Compare the row with its manifest entry: identity, row, completion and token-id hashes."""
    label = _row_label(line_no, row)
    if not isinstance(entry, dict):
        probs.add_row(
            "manifest row", f"{label}: no matching entry in manifest outputs.rows; the row was added"
        )
        return
    for key in ("problem_id", "sample"):
        if row.get(key) != entry.get(key):
            probs.add_row(
                "row order",
                f"{label}: {key} {row.get(key)!r} but manifest outputs.rows[{line_no - 1}] has "
                f"{entry.get(key)!r}; rows were reordered, removed or edited",
            )
    if sha256_json(row) != entry.get("row_sha256"):
        probs.add_row(
            "row_sha256",
            f"{label}: row_sha256 does not match the manifest; a field of this row was changed after the run",
        )
    completion = row.get("completion")
    if not isinstance(completion, str):
        probs.add_row("completion", f"{label}: field 'completion' missing or not a string")
    elif completion_sha256(completion) != entry.get("completion_sha256"):
        probs.add_row(
            "completion_sha256",
            f"{label}: completion_sha256 does not match the manifest; the completion text was changed",
        )
    token_ids = row.get("completion_token_ids")
    if not isinstance(token_ids, list):
        probs.add_row("token ids", f"{label}: field 'completion_token_ids' missing or not a list")
    elif token_ids_sha256(token_ids) != entry.get("token_ids_sha256"):
        probs.add_row(
            "token_ids_sha256",
            f"{label}: token_ids_sha256 does not match the manifest; completion_token_ids were changed",
        )


def _check_row_inputs(
    line_no: int,
    row: dict[str, Any],
    problems_by_id: dict[str, dict[str, Any]],
    artifacts: set[str],
    probs: _Problems,
) -> None:
    """The row's gold answer is its problem's answer; its artifact is one the manifest lists."""
    label = _row_label(line_no, row)
    gold = row.get("gold_answer")
    pid = row.get("problem_id")
    problem = problems_by_id.get(str(pid))
    if problem is None:
        probs.add_row("problem", f"{label}: problem_id {pid!r} is not in problems.jsonl")
    elif str(problem.get("answer")) != str(gold):
        probs.add_row(
            "gold_answer",
            f"{label}: gold_answer {gold!r} differs from problems.jsonl answer {problem.get('answer')!r}; "
            "the gold answer or the problem file was edited",
        )
    artifact_id = row.get("artifact_id")
    if artifact_id is not None and str(artifact_id) not in artifacts:
        probs.add_row("artifact", f"{label}: artifact_id {artifact_id!r} is not in manifest inputs.artifacts")


def _rescore_row(line_no: int, row: dict[str, Any], entry: Any, probs: _Problems) -> dict[str, Any]:
    """Re-score the row's completion, report disagreements with the row and manifest; return the
    row with the fresh ``extracted``/``answer``/``correct`` (unchanged if it cannot be scored)."""
    label = _row_label(line_no, row)
    completion, gold = row.get("completion"), row.get("gold_answer")
    if not isinstance(completion, str) or gold is None:
        return row  # reported by _check_row_hashes / the gold check
    try:
        fresh = score(completion, gold)
    except Exception as exc:  # noqa: BLE001 - any scorer failure is a finding about this row
        probs.add_row("score", f"{label}: re-scoring failed ({type(exc).__name__}: {exc}); check gold_answer")
        return row
    entry = entry if isinstance(entry, dict) else {}
    for name in _SCORE_FIELDS:
        value = getattr(fresh, name)
        if row.get(name) != value or type(row.get(name)) is not type(value):
            probs.add_row(
                f"row {name}",
                f"{label}: field '{name}' is {row.get(name)!r} but re-scoring the completion gives "
                f"{value!r}; the recorded score was edited or the scorer changed (re-run to re-score)",
            )
        if entry and (entry.get(name) != value or type(entry.get(name)) is not type(value)):
            probs.add_row(
                f"manifest {name}",
                f"manifest.json outputs.rows[{line_no - 1}] ({row.get('problem_id')!r}, sample "
                f"{row.get('sample')!r}): '{name}' is {entry.get(name)!r} but re-scoring gives {value!r}",
            )
    return {**row, **{name: getattr(fresh, name) for name in _SCORE_FIELDS}}


def _check_energy(name: str, status: Any, joules: Any, probs: _Problems, check: str | None = None) -> None:
    """Design invariant 5: measured means a number with a source; unavailable means joules is null."""
    bad = None
    if not isinstance(status, str) or not status.startswith(("measured:", "unavailable:")):
        bad = f"energy status {status!r} is neither 'measured:<source>' nor 'unavailable:<reason>'"
    elif status.startswith("measured:") and (
        isinstance(joules, bool) or not isinstance(joules, (int, float))
    ):
        bad = f"energy status {status!r} but joules is {joules!r}"
    elif status.startswith("unavailable:") and joules is not None:
        bad = f"energy status {status!r} but joules is {joules!r} (must be null)"
    if bad:
        msg = f"{name}: {bad}; energy is measured or declared unavailable, never estimated"
        if check:
            probs.add_row(check, msg)
        else:
            probs.add(msg)


def _check_totals(summary: dict[str, Any], rows: list[dict[str, Any]], probs: _Problems) -> None:
    tokens = summary.get("tokens")
    if isinstance(tokens, dict):
        for key in ("prompt", "prefill", "grafted", "decode"):
            if key in tokens:
                total = sum(r.get(f"{key}_tokens") or 0 for r in rows)
                if tokens[key] != total:
                    probs.add(
                        f"summary.json: tokens.{key} is {tokens[key]!r} but outputs.jsonl rows sum to "
                        f"{total}; the summary was edited"
                    )
    time = summary.get("time")
    if isinstance(time, dict):
        for key in ("wall_s", "cpu_s"):
            if key in time:
                total = math.fsum(r.get(key) or 0.0 for r in rows)
                if not isinstance(time[key], (int, float)) or not math.isclose(
                    time[key], total, rel_tol=1e-6, abs_tol=1e-6
                ):
                    probs.add(
                        f"summary.json: time.{key} is {time[key]!r} but outputs.jsonl rows sum to {total}; "
                        "the summary was edited"
                    )
    energy = summary.get("energy")
    if isinstance(energy, dict):
        _check_energy("summary.json energy", energy.get("status"), energy.get("joules"), probs)


def verify_run(run_dir: Path) -> RunCheck:
    """Re-check a run folder from its files alone (no model): hashes, scores and summary.

    Raises :class:`ManifestError` only when a required file (``manifest.json``, ``outputs.jsonl``,
    ``summary.json``, ``problems.jsonl``) is missing or cannot be parsed at the top level; every other
    discrepancy is reported in :attr:`RunCheck.problems`.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ManifestError(f"{run_dir}: not a directory; pass a run folder (runs/<condition>/<stamp>/)")
    probs = _Problems()
    manifest = _read_json_object(run_dir / "manifest.json")
    summary = _read_json_object(run_dir / "summary.json")
    outputs_bytes = _read_bytes(run_dir / "outputs.jsonl")

    # 1. manifest self-hash and format
    if manifest.get("format") != MANIFEST_FORMAT:
        probs.add(f"manifest.json: format is {manifest.get('format')!r}, expected {MANIFEST_FORMAT!r}")
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    if sha256_json(body) != manifest.get("manifest_sha256"):
        probs.add(
            "manifest.json: manifest_sha256 does not match the manifest's content; the manifest was edited "
            "after the run: restore it (every other check below trusts it)"
        )
    inputs = manifest.get("inputs") if isinstance(manifest.get("inputs"), dict) else {}
    outputs = manifest.get("outputs") if isinstance(manifest.get("outputs"), dict) else {}
    if not inputs or not outputs:
        probs.add("manifest.json: 'inputs' or 'outputs' section missing; the manifest is damaged")

    # 2. inputs re-derivable from the folder
    problems_by_id = _check_problems_file(run_dir, inputs, probs)
    _check_config(run_dir, inputs, probs)

    # 3. outputs.jsonl bytes, then row by row
    if sha256_hex(outputs_bytes) != outputs.get("outputs_sha256"):
        probs.add(
            "outputs.jsonl: SHA-256 of the file differs from manifest outputs.outputs_sha256; the file was "
            "changed after the run (see the row messages for where): restore it or re-run"
        )
    parsed = _parse_jsonl(outputs_bytes, "outputs.jsonl", probs)
    entries = outputs.get("rows") if isinstance(outputs.get("rows"), list) else []
    if len(parsed) != len(entries):
        probs.add(
            f"outputs.jsonl: {len(parsed)} lines but manifest outputs.rows lists {len(entries)}; "
            "rows were added or removed after the run"
        )
    artifacts = {str(a) for a in inputs.get("artifacts") or []}
    rows: list[dict[str, Any]] = []
    rescored: list[dict[str, Any]] = []
    for line_no, row in parsed:
        if row is None:
            continue
        rows.append(row)
        entry = entries[line_no - 1] if line_no - 1 < len(entries) else None
        _check_row_hashes(line_no, row, entry, probs)
        _check_row_inputs(line_no, row, problems_by_id, artifacts, probs)
        rescored.append(_rescore_row(line_no, row, entry, probs))
        _check_energy(
            _row_label(line_no, row), row.get("energy_status"), row.get("energy_j"), probs, "energy"
        )

    # 4. summary: hash, scores recomputed from the rows, totals
    if summary.get("format") != SUMMARY_FORMAT:
        probs.add(f"summary.json: format is {summary.get('format')!r}, expected {SUMMARY_FORMAT!r}")
    if sha256_json(summary) != outputs.get("summary_sha256"):
        probs.add(
            "summary.json: SHA-256 differs from manifest outputs.summary_sha256; the summary was edited "
            "after the run: restore it or re-run"
        )
    recorded_scores = summary.get("scores") if isinstance(summary.get("scores"), dict) else {}
    try:
        scores = _jsonable(summarize_scores(rescored))
    except Exception as exc:  # noqa: BLE001 - report, do not crash the check
        probs.add(f"summary.json: recomputing scores failed ({type(exc).__name__}: {exc})")
        scores = {}
    if scores:
        for path, old, new in diff_values(recorded_scores, scores, "scores"):
            probs.add(
                f"summary.json: {path} is {old!r} but re-scoring outputs.jsonl gives {new!r}; "
                "the summary was edited or the scorer changed (re-run, or report the recomputed value)"
            )
    if isinstance(summary.get("groups"), dict) and rescored:
        try:
            groups = _jsonable(summarize_groups(rescored))
        except Exception as exc:  # noqa: BLE001 - report, do not crash the check
            probs.add(f"summary.json: recomputing groups failed ({type(exc).__name__}: {exc})")
            groups = summary["groups"]
        for path, old, new in diff_values(summary["groups"], groups, "groups"):
            probs.add(f"summary.json: {path} is {old!r} but re-scoring outputs.jsonl gives {new!r}; "
                      "the summary was edited (re-run, or report the recomputed value)")
    _check_totals(summary, rows, probs)

    messages = probs.finish()
    return RunCheck(
        ok=not messages,
        problems=messages,
        n_rows=len(rows),
        scores=scores,
        recorded_scores=recorded_scores,
    )
