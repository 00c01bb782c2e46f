"""Audit a run folder without loading any model: every hash of its manifest, every score, the summary, and
the recurring/held-out groups. `scripts/rescore.py` (`make rescore RUN=<dir>`) prints the result.

Design invariant 4: every reported number traces to a manifest whose hashes can be re-checked without the
engine. Building the manifest is harness/record/manifest.py; the folder's layout is harness/record/folder.py.

    check = audit(RunFolder("runs/baseline/<stamp>"))
    assert check.ok, check.findings     # each finding names the file, row (line, problem id, sample) or field

Length: ~430 lines: one check per manifest field, kept in one place so a reader sees every re-check the
rescore makes; the compare-folder audit is in harness/compare/audit.py. It reads the files as JSON, not as
the typed records (harness.record.rows, harness.record.figures): a damaged or edited file must still be diffed field
by field.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import RunFolderError
from harness.record.figures import TOKEN_KINDS
from harness.record.folder import (
    CONFIG,
    MANIFEST,
    OUTPUTS,
    PARTIAL,
    PROBLEMS,
    RESUME,
    SUMMARY,
    FinishedRun,
    RunFolder,
)
from harness.record.hashing import sha256_hex, sha256_json
from harness.record.manifest import MANIFEST_FORMAT, completion_sha256, token_ids_sha256
from harness.record.metrics import LATE_SCORE_KEYS, summarize_groups, summarize_scores
from harness.record.rows import STOP_REASONS, SUMMARY_FORMAT, Group, legacy_row_group
from harness.task.trace import opening_of, resolve_trace, score_traced

__all__ = ["RunCheck", "audit", "audited", "diff_values", "refusal"]

_SCORE_FIELDS = ("extracted", "answer", "correct")
_MAX_ROW_MESSAGES = 20  # per check, so a wholesale corruption does not print 10,000 lines
_SEE_ROWS = "see the row messages for where"  # the whole-file finding of outputs.jsonl, whose rows say where
_SEE_FIELDS = "see the field messages for which"  # the whole-file finding of summary.json, whose fields say which
_REL_TOL = 1e-9  # summary floats are re-derived; allow last-ulp libm differences across machines


@dataclass
class RunCheck:
    """Result of :func:`audit`.

    ``ok`` is True only when ``findings`` is empty. Each finding names the file, the row (1-based line,
    problem id, sample) or field, and what to do. ``scores`` is ``summarize_scores`` recomputed from
    ``outputs.jsonl`` by re-scoring every completion; ``recorded_scores`` is ``summary.json``'s ``scores``.
    """

    ok: bool
    findings: list[str]
    n_rows: int
    scores: dict[str, Any]
    recorded_scores: dict[str, Any] = field(default_factory=dict)


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
        pairs = enumerate(zip(recorded, recomputed, strict=True))
        return [d for i, (a, b) in pairs for d in diff_values(a, b, f"{path}.{i}")]
    numeric = (int, float)
    if isinstance(recorded, numeric) and isinstance(recomputed, numeric):
        return [] if _same_number(recorded, recomputed) else [(path, recorded, recomputed)]
    return [] if recorded == recomputed else [(path, recorded, recomputed)]


class _Findings:
    """Collects findings, capping the per-check count of row-level messages."""

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
    where = "" if row is None else f" (problem_id={row.get('problem_id')!r}, sample={row.get('sample')!r})"
    return f"outputs.jsonl line {line_no}{where}"


def _parse_jsonl(data: bytes, name: str, found: _Findings) -> list[tuple[int, dict[str, Any] | None]]:
    """``(line number, row or None if unparsable)`` for each line of a ``.jsonl`` file."""
    if data and not data.endswith(b"\n"):
        found.add(f"{name}: the last line has no trailing newline; the file was truncated or edited")
    out: list[tuple[int, dict[str, Any] | None]] = []
    for i, line in enumerate(data.splitlines(), start=1):
        try:
            obj = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            found.add_row(f"{name} parse", f"{name} line {i}: not valid UTF-8 JSON ({exc}); the file was edited")
            out.append((i, None))
            continue
        if not isinstance(obj, dict):
            found.add_row(f"{name} parse", f"{name} line {i}: expected a JSON object, found {type(obj).__name__}")
            out.append((i, None))
            continue
        out.append((i, obj))
    return out


def _check_problems_file(folder: RunFolder, inputs: dict[str, Any], found: _Findings) -> dict[str, dict[str, Any]]:
    """Check problems.jsonl against ``inputs.problems``; return the parsed problems by id."""
    parsed = _parse_jsonl(folder.read_bytes(PROBLEMS), PROBLEMS, found)
    recorded = inputs.get("problems")
    if not isinstance(recorded, dict):
        found.add("manifest.json: inputs.problems is missing or not an object; the manifest is damaged")
        recorded = {}
    by_id: dict[str, dict[str, Any]] = {}
    for line_no, problem in parsed:
        if problem is None:
            continue
        pid = problem.get("id", problem.get("problem_id"))
        if pid is None:
            found.add(f"problems.jsonl line {line_no}: no 'id' field; the file was edited")
            continue
        pid = str(pid)
        if pid in by_id:
            found.add(f"problems.jsonl line {line_no}: duplicate problem id {pid!r}")
        by_id[pid] = problem
        want = recorded.get(pid)
        if want is None:
            found.add(f"problems.jsonl line {line_no} (id={pid!r}): not in manifest inputs.problems; "
                "the file was edited or belongs to another run")
        elif sha256_json(problem) != want:
            found.add(f"problems.jsonl line {line_no} (id={pid!r}): SHA-256 differs from manifest inputs.problems; "
                "the problem row (text or answer) changed after the run: restore it or re-run")
    for pid in sorted(set(recorded) - set(by_id)):
        found.add(f"problems.jsonl: problem {pid!r} listed in manifest inputs.problems is missing from the file")
    return by_id


def _check_config(folder: RunFolder, inputs: dict[str, Any], found: _Findings) -> dict[str, Any]:
    """The config's hash (when config.yaml is present: it is not needed to re-score); returns the config."""
    if not folder.file(CONFIG).exists():
        return {}
    try:
        config = folder.read_config()
    except RunFolderError as exc:
        found.add(f"config.yaml: {exc}")
        return {}
    if sha256_json(config) != inputs.get("config"):
        found.add("config.yaml: SHA-256 of the resolved config differs from manifest inputs.config; "
            "the config was edited after the run: restore it or re-run")
    return config


_FIELD_HASHES = (  # (row field, type, hash, manifest key, what a mismatch means)
    ("completion", str, completion_sha256, "completion_sha256", "the completion text was"),
    ("completion_token_ids", list, token_ids_sha256, "token_ids_sha256", "completion_token_ids were"),
)


def _check_row_hashes(line_no: int, row: dict[str, Any], entry: Any, found: _Findings) -> None:
    """Compare the row with its manifest entry: identity, row, completion and token-id hashes."""
    label = _row_label(line_no, row)
    if not isinstance(entry, dict):
        found.add_row("manifest row", f"{label}: no matching entry in manifest outputs.rows; the row was added")
        return
    for key in ("problem_id", "sample"):
        if row.get(key) != entry.get(key):
            found.add_row("row order",
                f"{label}: {key} {row.get(key)!r} but manifest outputs.rows[{line_no - 1}] has "
                f"{entry.get(key)!r}; rows were reordered, removed or edited")
    if sha256_json(row) != entry.get("row_sha256"):
        found.add_row("row_sha256",
            f"{label}: row_sha256 does not match the manifest; a field of this row was changed after the run")
    for name, kind, digest, key, what in _FIELD_HASHES:
        value = row.get(name)
        if not isinstance(value, kind):
            found.add_row(name, f"{label}: field '{name}' missing or not a {kind.__name__}")
        elif digest(value) != entry.get(key):
            found.add_row(key, f"{label}: {key} does not match the manifest; {what} changed")


def _check_row_inputs(line_no: int, row: dict[str, Any], problems_by_id: dict[str, dict[str, Any]],
                      artifacts: set[str], found: _Findings) -> None:
    """The row's gold answer is its problem's answer; its artifact is one the manifest lists; its token
    counts add up (prompt = prefilled + grafted = the prompt token ids)."""
    label = _row_label(line_no, row)
    gold = row.get("gold_answer")
    pid = row.get("problem_id")
    problem = problems_by_id.get(str(pid))
    if problem is None:
        found.add_row("problem", f"{label}: problem_id {pid!r} is not in problems.jsonl")
    elif str(problem.get("answer")) != str(gold):
        found.add_row("gold_answer",
            f"{label}: gold_answer {gold!r} differs from problems.jsonl answer {problem.get('answer')!r}; "
            "the gold answer or the problem file was edited")
    ids, counts = row.get("prompt_token_ids"), [row.get(f"{k}_tokens") for k in ("prompt", "prefill", "grafted")]
    if isinstance(ids, list) and all(isinstance(c, int) for c in counts):
        if not len(ids) == counts[0] == counts[1] + counts[2]:
            found.add_row("token counts", f"{label}: prompt_tokens {counts[0]}, prefill_tokens {counts[1]} + "
                          f"grafted_tokens {counts[2]} and {len(ids)} prompt_token_ids disagree; the row was edited")
    artifact_id = row.get("artifact_id")
    if artifact_id is not None and str(artifact_id) not in artifacts:
        found.add_row("artifact", f"{label}: artifact_id {artifact_id!r} is not in manifest inputs.artifacts")


def _rescore_row(line_no: int, row: dict[str, Any], entry: Any, found: _Findings,
                 opening: str | None = None) -> dict[str, Any]:
    """Re-score the row's completion, report disagreements with the row and manifest; return the
    row with the fresh ``extracted``/``answer``/``correct`` (unchanged if it cannot be scored)."""
    label = _row_label(line_no, row)
    completion, gold = row.get("completion"), row.get("gold_answer")
    if not isinstance(completion, str) or gold is None:
        return row  # reported by _check_row_hashes / the gold check
    close = row.get("trace_close")
    fields = _SCORE_FIELDS if close is None else (*_SCORE_FIELDS, "overlong")
    try:
        fresh = score_traced(completion, gold, str(row.get("stop_reason")), close, opening)
    except Exception as exc:  # noqa: BLE001 - any scorer failure is a finding about this row
        found.add_row("score", f"{label}: re-scoring failed ({type(exc).__name__}: {exc}); check gold_answer")
        return row
    entry = entry if isinstance(entry, dict) else {}
    for name in fields:
        value = getattr(fresh, name)
        if row.get(name) != value or type(row.get(name)) is not type(value):
            found.add_row(f"row {name}",
                f"{label}: field '{name}' is {row.get(name)!r} but re-scoring the completion gives "
                f"{value!r}; the recorded score was edited or the scorer changed (re-run to re-score)")
        if name == "overlong":
            continue  # in the row (its hash is in the manifest), not a manifest field of its own
        if entry and (entry.get(name) != value or type(entry.get(name)) is not type(value)):
            found.add_row(f"manifest {name}",
                f"manifest.json outputs.rows[{line_no - 1}] ({row.get('problem_id')!r}, sample "
                f"{row.get('sample')!r}): '{name}' is {entry.get(name)!r} but re-scoring gives {value!r}")
    return {**row, **{name: getattr(fresh, name) for name in fields}}


def _trace_opening(config: dict[str, Any], closes: set[Any], found: _Findings) -> str | None:
    """The opening delimiter a custom pair (`model.trace='OPEN CLOSE'`) names, for re-scoring (a named pair's follows
    from its closing delimiter: harness.task.trace.opening_of); a finding when rows are scored after a closing
    delimiter of no named pair and config.yaml, which names its opening one, is missing: whether a trace was
    re-opened after its last close cannot be told without it."""
    model = config.get("model") if isinstance(config.get("model"), dict) else {}
    setting = model.get("trace")
    if isinstance(setting, str) and len(setting.split()) == 2:
        return setting.split()[0]
    custom = sorted(str(c) for c in closes if c is not None and opening_of(str(c)) is None)
    if custom and not config:
        found.add(f"outputs.jsonl: rows are scored after trace_close {custom} and config.yaml, which names its "
                  "opening delimiter, is missing: a trace re-opened after its last close cannot be told from an "
                  "answer; restore config.yaml")
    return None


def _check_trace(config: dict[str, Any], rows: list[dict[str, Any]], found: _Findings) -> None:
    """Every row of a run with model.trace is scored after the same closing delimiter, the one the setting names
    (`model`, read from the chat template, is checked for sameness only); a run without it has no traced row."""
    model = config.get("model") if isinstance(config.get("model"), dict) else {}
    setting = model.get("trace")
    closes = {r.get("trace_close") for r in rows}
    if not config:
        want = closes
    elif setting is None:
        want = {None}
    elif setting == "model":
        want = closes if len(closes) == 1 and None not in closes else {"<one delimiter, in every row>"}
    else:
        try:
            trace = resolve_trace(str(setting), None)
            want = {trace.close if trace else None}
        except Exception as exc:  # noqa: BLE001 - a config the scorer refuses is a finding
            found.add(f"config.yaml: model.trace={setting!r} names no trace ({exc})")
            return
    if rows and closes != want:
        found.add(f"outputs.jsonl: rows are scored after trace_close {sorted(map(str, closes))} but config.yaml "
                  f"model.trace={setting!r} means {sorted(map(str, want))}; the rows or the config were edited")


def _late_key(path: str, old: Any) -> bool:
    """A score key added within format 1 (maj@k, overlong) that a summary written before it does not have."""
    return old == "<missing>" and bool(LATE_SCORE_KEYS.match(path.rsplit(".", 1)[-1]))


def _check_energy(name: str, status: Any, joules: Any, found: _Findings, check: str | None = None) -> None:
    """Design invariant 5: measured (or estimated) means a number with a source (or method); unavailable means joules
    is null. An estimate is recorded as "estimated:<method>", never under a measured name."""
    bad = None
    if not isinstance(status, str) or not status.startswith(("measured:", "estimated:", "unavailable:")):
        bad = (f"energy status {status!r} is neither 'measured:<source>', 'estimated:<method>' nor "
               "'unavailable:<reason>'")
    elif status.startswith(("measured:", "estimated:")) and (isinstance(joules, bool)
                                                             or not isinstance(joules, (int, float))):
        bad = f"energy status {status!r} but joules is {joules!r}"
    elif status.startswith("unavailable:") and joules is not None:
        bad = f"energy status {status!r} but joules is {joules!r} (must be null)"
    if bad:
        msg = f"{name}: {bad}; energy is measured, estimated under its method's name, or declared unavailable"
        found.add_row(check, msg) if check else found.add(msg)


def _check_totals(summary: dict[str, Any], rows: list[dict[str, Any]], found: _Findings) -> None:
    tokens = summary.get("tokens")
    if isinstance(tokens, dict):
        for key in TOKEN_KINDS:
            if key in tokens:
                total = sum(r.get(f"{key}_tokens") or 0 for r in rows)
                if tokens[key] != total:
                    found.add(f"summary.json: tokens.{key} is {tokens[key]!r} but outputs.jsonl rows sum to "
                        f"{total}; the summary was edited")
    time = summary.get("time")
    if isinstance(time, dict):
        for key in ("wall_s", "cpu_s", "ttft_s"):
            if key in time:
                total = math.fsum(r.get(key) or 0.0 for r in rows)
                value = time[key]
                if not isinstance(value, (int, float)) or not math.isclose(value, total, rel_tol=1e-6, abs_tol=1e-6):
                    found.add(f"summary.json: time.{key} is {time[key]!r} but outputs.jsonl rows sum to {total}; "
                        "the summary was edited")
    energy = summary.get("energy")
    if isinstance(energy, dict):
        _check_energy("summary.json energy", energy.get("status"), energy.get("joules"), found)
    stops = summary.get("stop_reasons")
    if isinstance(stops, dict):
        counts = {k: sum(r.get("stop_reason") == k for r in rows) for k in STOP_REASONS}
        if stops != counts:
            found.add(f"summary.json: stop_reasons is {stops!r} but outputs.jsonl rows give {counts!r}; the summary "
                      "was edited")


def _recompute(fn: Any, what: str, found: _Findings) -> Any:
    try:
        return _jsonable(fn())
    except Exception as exc:  # noqa: BLE001 - report, do not crash the check
        found.add(f"summary.json: recomputing {what} failed ({type(exc).__name__}: {exc})")
        return None


def _row_group(row: dict[str, Any], run: str | None) -> str:
    """The group a row must have: its run's (summary.json `group`, harness.record.rows.Group), or for a folder written
    before the run's group was recorded, the legacy rule from its match."""
    return run if run is not None else legacy_row_group(row.get("match")).value


def _check_group(line_no: int, row: dict[str, Any], exclude_self: bool, run: str | None, found: _Findings) -> None:
    """Recurring vs held-out is one rule (harness.record.rows.Group); a held-out run never matches itself."""
    label = _row_label(line_no, row)
    group, match, want = row.get("group"), row.get("match"), _row_group(row, run)
    if group is not None and group != want:
        why = "the run's group (summary.json group)" if run is not None else f"match {match!r}"
        found.add_row("group", f"{label}: group {group!r} but {why} makes it {want!r} (harness.record.rows.Group); "
                               "the row was edited")
    if exclude_self and match == "exact":
        found.add_row("exclude_self", f"{label}: library.exclude_self=true but the match is 'exact': the "
                                      "evaluated problem reached the context; the held-out figure is void")


def audit(folder: RunFolder) -> RunCheck:
    """Re-check a run folder from its files alone (no model): hashes, scores, summary and groups.

    Raises :class:`RunFolderError` only when a required file (``manifest.json``, ``outputs.jsonl``,
    ``summary.json``, ``problems.jsonl``) is missing or cannot be parsed at the top level; every other
    discrepancy is reported in :attr:`RunCheck.findings`.
    """
    if not folder.path.is_dir():
        raise RunFolderError(f"{folder.path}: not a directory; pass a run folder (runs/<condition>/<stamp>/)")
    found = _Findings()
    manifest = folder.read_json(MANIFEST)
    summary = folder.read_json(SUMMARY)
    outputs_bytes = folder.read_bytes(OUTPUTS)

    # 1. manifest self-hash and format
    if manifest.get("format") != MANIFEST_FORMAT:
        found.add(f"manifest.json: format is {manifest.get('format')!r}, expected {MANIFEST_FORMAT!r}")
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    if sha256_json(body) != manifest.get("manifest_sha256"):
        found.add("manifest.json: manifest_sha256 does not match the manifest's content; the manifest was edited "
            "after the run: restore it (every other check below trusts it)")
    inputs = manifest.get("inputs") if isinstance(manifest.get("inputs"), dict) else {}
    outputs = manifest.get("outputs") if isinstance(manifest.get("outputs"), dict) else {}
    if not inputs or not outputs:
        found.add("manifest.json: 'inputs' or 'outputs' section missing; the manifest is damaged")

    # 2. inputs re-derivable from the folder
    problems_by_id = _check_problems_file(folder, inputs, found)
    config = _check_config(folder, inputs, found)
    library = config.get("library") if isinstance(config.get("library"), dict) else {}
    exclude_self = bool(library.get("exclude_self"))
    grouped = isinstance(summary.get("groups"), dict)
    run_group = summary.get("group") if isinstance(summary.get("group"), str) else None
    if run_group is not None and run_group != (Group.HELD_OUT if exclude_self else Group.RECURRING).value:
        found.add(f"summary.json: group is {run_group!r} but the run was configured with library.exclude_self="
                  f"{str(exclude_self).lower()}; the summary was edited")

    # 3. outputs.jsonl bytes, then row by row
    if sha256_hex(outputs_bytes) != outputs.get("outputs_sha256"):
        found.add("outputs.jsonl: SHA-256 of the file differs from manifest outputs.outputs_sha256; the file was "
            f"changed after the run ({_SEE_ROWS}): restore it or re-run")
    parsed = _parse_jsonl(outputs_bytes, "outputs.jsonl", found)
    entries = outputs.get("rows") if isinstance(outputs.get("rows"), list) else []
    if len(parsed) != len(entries):
        found.add(f"outputs.jsonl: {len(parsed)} lines but manifest outputs.rows lists {len(entries)}; "
            "rows were added or removed after the run")
    artifacts = {str(a) for a in inputs.get("artifacts") or []}
    opening = _trace_opening(config, {r.get("trace_close") for _, r in parsed if r is not None}, found)
    rows: list[dict[str, Any]] = []
    rescored: list[dict[str, Any]] = []
    for line_no, row in parsed:
        if row is None:
            continue
        rows.append(row)
        entry = entries[line_no - 1] if line_no - 1 < len(entries) else None
        _check_row_hashes(line_no, row, entry, found)
        _check_row_inputs(line_no, row, problems_by_id, artifacts, found)
        fresh = _rescore_row(line_no, row, entry, found, opening)
        if grouped and "group" not in row:  # rows written before the group field: the same one rule
            fresh["group"] = _row_group(row, run_group)
        rescored.append(fresh)
        _check_energy(_row_label(line_no, row), row.get("energy_status"), row.get("energy_j"), found, "energy")
        _check_group(line_no, row, exclude_self, run_group, found)

    # 4. summary: hash, scores recomputed from the rows, totals
    if summary.get("format") != SUMMARY_FORMAT:
        found.add(f"summary.json: format is {summary.get('format')!r}, expected {SUMMARY_FORMAT!r}")
    if sha256_json(summary) != outputs.get("summary_sha256"):
        found.add("summary.json: SHA-256 differs from manifest outputs.summary_sha256; the summary was edited "
            f"after the run ({_SEE_FIELDS}, if any): restore it or re-run")
    recorded_scores = summary.get("scores") if isinstance(summary.get("scores"), dict) else {}
    scores = _recompute(lambda: summarize_scores(rescored), "scores", found) or {}
    if scores:
        for path, old, new in diff_values(recorded_scores, scores, "scores"):
            if _late_key(path, old):
                continue
            found.add(f"summary.json: {path} is {old!r} but re-scoring outputs.jsonl gives {new!r}; "
                "the summary was edited or the scorer changed (re-run, or report the recomputed value)")
    if grouped and rescored:
        groups = _recompute(lambda: summarize_groups(rescored), "groups", found) or summary["groups"]
        for path, old, new in diff_values(summary["groups"], groups, "groups"):
            if _late_key(path, old):
                continue
            found.add(f"summary.json: {path} is {old!r} but re-scoring outputs.jsonl gives {new!r}; "
                "the summary was edited (re-run, or report the recomputed value)")
    if run_group is not None and summary.get("own_entry_rows") != sum(r.get("match") == "exact" for r in rows):
        found.add(f"summary.json: own_entry_rows is {summary.get('own_entry_rows')!r} but outputs.jsonl has "
                  f"{sum(r.get('match') == 'exact' for r in rows)} exact matches; the summary was edited")
    _check_totals(summary, rows, found)
    _check_trace(config, rows, found)

    messages = found.finish()
    return RunCheck(ok=not messages,
        findings=messages,
        n_rows=len(rows),
        scores=scores,
        recorded_scores=recorded_scores)


def refusal(where: Path | str, findings: list[str], reader: str) -> str:
    """The one line a reader gives for a folder that does not re-check: its first difference (the first finding that
    names where: a row, a field; the whole-file hashes of outputs.jsonl and summary.json say only that the file
    changed), how many more, and what to do."""
    first = next((f for f in findings if _SEE_ROWS not in f and _SEE_FIELDS not in f), findings[0])
    more = f" (and {len(findings) - 1} more findings)" if len(findings) > 1 else ""
    return (f"{where} does not re-check: {first}{more}; it was modified after it was written, so {reader} "
            f"does not read it: see `make rescore RUN={where}`, restore the folder or re-run")


def audited(path: str | Path | RunFolder, reader: str) -> FinishedRun:
    """The records of a finished run folder, read only after it re-checks through :func:`audit` (what `make rescore`
    runs): every reader that reports or exports a figure of a run (export, transfer_table, report, log-run, harvest)
    takes its rows from here. `reader` names the reader in the refusal. A RunFolderError in one line when the folder
    is missing, unfinished (an interrupted run's rows are not figures), or does not re-check (naming the first
    difference); nothing is read from a folder that was edited."""
    folder = (path if isinstance(path, RunFolder) else RunFolder(Path(path))).held()  # one read: audited = used
    if not folder.path.is_dir():
        raise RunFolderError(f"{folder.path}: no such run folder; {reader} reads a finished run folder "
                             "(runs/<condition>/<stamp>/, holding manifest.json)")
    if not folder.file(MANIFEST).exists() and (folder.file(RESUME).exists() or folder.file(PARTIAL).exists()):
        raise RunFolderError(f"{folder.path}: an unfinished run (no manifest.json; its rows are in {PARTIAL}); "
                             f"{reader} reads finished runs only: re-run its command to finish it")
    check = audit(folder)
    if not check.ok:
        raise RunFolderError(refusal(folder.path, check.findings, reader))
    return folder.finished()
