"""The re-check of a written comparison.json: recompute every figure from the run folders it names, without the
model (no torch).

    check = audit_comparison("runs/compare/<stamp>")       # scripts/rescore.py, make rescore RUN=...

It finds each run by content, wherever the compare folder was moved or copied with its runs: through `run_links`
(each run's path relative to the compare folder, written since issue 31), else, for older files, a run folder
beside the compare folder with the recorded path's tail (`<runs>/<condition>/<stamp>`), else the recorded path
itself (`locate_runs`; the working directory never decides). It audits every run found (harness.record.audit),
checks that each is the run the comparison was made from (its manifest SHA-256, recorded in `run_manifests`), that
it is the condition and group its label says and shares the comparison's comparable key, re-pairs each pair's rows
(harness.compare.pairing), then recomputes the whole comparison from those runs (harness.compare.comparison.comparison,
the function the job used) and reports every field that differs (`summaries.graft (held-out).comparison.
token_reduction`, `pairs.recurring.graft_run` ...). The file is read as
JSON, not as a typed Comparison: a damaged or edited file must still be diffed field by field.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.compare.comparison import COMPARISON, comparison
from harness.compare.pairing import Pairing, pair_folders
from harness.compare.plan import Plan
from harness.errors import RunFolderError
from harness.record.audit import RunCheck, audit, diff_values, refusal
from harness.record.folder import FinishedRun, RunFolder
from harness.record.rows import Summary, run_group

__all__ = ["BINDING_FIELDS", "MACHINE_FIELDS", "AuditedComparison", "ComparisonCheck", "audit_comparison",
           "audited_comparison", "locate_runs"]

_MAX_FIELD_MESSAGES = 30
#: What the machine was like while the job ran (load average per run, the library's build): recorded in
#: comparison.json for an honest reading of its timings, not recomputable from the runs, so not re-checked.
MACHINE_FIELDS = ("load", "library")
#: What binds the comparison to its runs (checked run by run, not recomputed): each run's manifest SHA-256 and its
#: path relative to the compare folder.
BINDING_FIELDS = ("run_manifests", "run_links")


@dataclass
class ComparisonCheck:
    """Result of :func:`audit_comparison`: each listed run's audit (label -> RunCheck), each group's pairing
    re-derived from the recorded rows (group -> Pairing.to_json()), and findings (empty when ok)."""

    ok: bool
    findings: list[str]
    runs: dict[str, RunCheck]
    pairs: dict[str, Any]
    located: dict[str, str] | None = None  # label -> the folder re-checked, and how it was found
    # the compare folder and each run folder as read by the check (RunFolder.held: the bytes audited), for readers
    compare: RunFolder | None = None
    held: dict[str, RunFolder] = field(default_factory=dict)


def locate_runs(compare_dir: Path, comp: dict[str, Any]) -> dict[str, tuple[Path, str]]:
    """label -> (the run folder to re-check, how it was found), for every run comparison.json lists, in this order:
    its `run_links` entry (relative to the compare folder: a copy of runs/ re-checks its own copies); a run folder
    beside the compare folder with the recorded path's last 2-4 parts (an older file in a moved runs/); the recorded
    path (absolute, or relative to the project root above <runs>, never to the working directory). A folder is
    taken where it exists; the run's manifest SHA-256 then says whether it is the run compared."""
    runs = comp.get("runs") if isinstance(comp.get("runs"), dict) else {}
    links = comp.get("run_links") if isinstance(comp.get("run_links"), dict) else {}
    base = Path(compare_dir).absolute()
    runs_root = base.parent.parent  # <runs>/compare/<stamp>
    out = {}
    for label, recorded in runs.items():
        rec = Path(str(recorded))
        candidates = ([(Path(os.path.normpath(base / links[label])), "run_links")]
                      if isinstance(links.get(label), str) else [])
        candidates += [(runs_root.joinpath(*rec.parts[-k:]), "beside the compare folder")
                       for k in (2, 3, 4) if len(rec.parts) >= k]
        candidates.append((rec if rec.is_absolute() else runs_root.parent / rec, "the recorded path"))
        out[label] = next(((p, how) for p, how in candidates if p.is_dir()), candidates[-1])
    return out


def _check_location(label: str, recorded: Any, found: tuple[Path, str], findings: list[str]) -> None:
    """A finding when `runs.<label>` names another run than the one re-checked (its <condition>/<stamp> differs):
    the paths were swapped or re-pointed."""
    path, how = found
    if how == "the recorded path":
        return
    if Path(str(recorded)).parts[-2:] != path.parts[-2:]:
        findings.append(f"comparison.json runs.{label}: names {recorded} but the run found ({how}) is {path}: the "
                        "file was edited; restore it or re-run `make aime-graft`")


def _check_run(label: str, folder: RunFolder, comp: dict[str, Any], recorded_manifests: dict[str, Any],
               plan: Plan, findings: list[str]) -> tuple[Summary, str] | None:
    """The run's summary and manifest SHA-256 after checking it is the run, condition, group and comparable key
    comparison.json says; None when its files cannot be read (already a finding of the audit)."""
    where = f"run {label!r} ({folder.path})"
    try:
        summary, manifest = folder.read_summary(), folder.read_manifest()
        config = folder.read_config() if folder.file("config.yaml").exists() else {}
    except RunFolderError:
        return None
    sha = str(manifest.get("manifest_sha256"))
    if label in recorded_manifests and recorded_manifests[label] != sha:
        findings.append(f"comparison.json run_manifests.{label}: {str(recorded_manifests[label])[:16]}.. but {where} "
                        f"has manifest {sha[:16]}..: not the run the comparison was made from (re-pointed or "
                        "replaced); restore it or re-run `make aime-graft`")
    if summary.comparable_key != comp.get("comparable_key"):
        key = str(comp.get("comparable_key"))[:16]
        findings.append(f"comparison.json runs.{label}: {where} has comparable_key "
                        f"{str(summary.comparable_key)[:16]}.., the comparison {key}..: a run with another model, "
                        "dataset, prompt or decoding cannot be compared")
    planned = plan.run(label)
    if planned is None:
        findings.append(f"comparison.json runs.{label}: not a run of the comparison's plan {plan.labels}")
        return summary, sha
    if summary.condition != planned.condition:
        findings.append(f"comparison.json runs.{label}: {where} is a {summary.condition!r} run, the label needs "
                        f"{planned.condition!r}")
    library = config.get("library") if isinstance(config.get("library"), dict) else {}
    if planned.group is not None and "exclude_self" in library and run_group(summary, config) is not planned.group:
        findings.append(f"comparison.json runs.{label}: {where} ran with library.exclude_self="
                        f"{str(bool(library['exclude_self'])).lower()}: it is not the {planned.group.label} run")
    return summary, sha


def audit_comparison(compare_dir: str | Path) -> ComparisonCheck:
    """Re-check a compare job's folder without the model (module docstring). Raises RunFolderError when
    comparison.json is missing or unreadable; every other discrepancy is a finding naming the field."""
    folder = RunFolder(compare_dir).held()  # every file read once: what is checked is what a reader gets (issue 61)
    comp = folder.read_json(COMPARISON)
    findings: list[str] = []
    runs = comp.get("runs") if isinstance(comp.get("runs"), dict) else {}
    if not runs:
        findings.append(f"{folder.file(COMPARISON)}: no 'runs' listed; the file is damaged")
    recorded_manifests = comp.get("run_manifests")
    if not isinstance(recorded_manifests, dict):
        findings.append("comparison.json: no 'run_manifests' (the manifest SHA-256 of each run compared): written "
                        "before comparisons were bound to their runs, so they cannot be re-checked; re-run "
                        "`make aime-graft`")
        recorded_manifests = {}
    for label in sorted(set(recorded_manifests) - set(runs)):
        findings.append(f"comparison.json: run_manifests.{label} names a run that 'runs' does not list")
    try:
        plan = Plan.of_comparison(comp)
    except (ValueError, TypeError, IndexError) as exc:
        findings.append(f"comparison.json plan: unreadable ({exc}); the file is damaged")
        plan = Plan.of_comparison({k: v for k, v in comp.items() if k != "plan"})
    if set(plan.labels) != set(runs):
        findings.append(f"comparison.json plan.runs: {plan.labels} but 'runs' lists {sorted(runs)}; the file was "
                        "edited")
    checks: dict[str, RunCheck] = {}
    folders: dict[str, RunFolder] = {}
    summaries: dict[str, Summary] = {}
    manifests: dict[str, str] = {}
    located = locate_runs(folder.path, comp)
    held = {label: RunFolder(located[label][0]).held() for label in runs}
    for label in runs:
        path, _ = located[label]
        _check_location(label, runs[label], located[label], findings)
        run = held[label]
        try:
            checks[label] = audit(run)
        except RunFolderError as exc:
            findings.append(f"run {label!r} ({path}): {exc}")
            continue
        findings.extend(f"run {label!r} ({path}): {f}" for f in checks[label].findings)
        got = _check_run(label, run, comp, recorded_manifests, plan, findings)
        if got is not None:  # named by its recorded path: where a run lies is not part of what is re-computed
            folders[label], (summaries[label], manifests[label]) = RunFolder(runs[label]), got
    if "pairs" not in comp:
        findings.append(f"{folder.file(COMPARISON)}: no 'pairs' section: written before the incontext control "
                        "existed; re-run `make aime-graft` to get the graft-vs-incontext check")
    pairings: dict[str, Pairing] = {}
    for key, (first, twin) in plan.pairs.items():
        if first in runs and twin in runs:
            try:
                pairings[key] = pair_folders(held[first], held[twin])
            except RunFolderError as exc:
                findings.append(f"comparison.json pairs.{key}: cannot re-pair its runs ({exc})")
                continue
            findings.extend(f"pairs.{key}: {first} row differs from its twin {twin}: {d}"
                            for d in pairings[key].differences)
        else:
            findings.append(f"comparison.json pairs.{key}: 'runs' does not list {first} and {twin}")
    for key in sorted(set(comp.get("pairs") or {}) - set(plan.pairs)):
        findings.append(f"comparison.json pairs.{key}: not a pair of the comparison's plan; the file was edited")
    if plan.baseline not in runs:
        findings.append(f"comparison.json: 'runs' has no {plan.baseline!r}; every figure is against it")
    elif set(summaries) == set(runs):  # every run readable: recompute every figure from them
        recomputed = comparison(comp.get("comparable_key"), folders, summaries,
                                pairings if "pairs" in comp else None, manifests,
                                plan if "plan" in comp else None).to_json()
        recorded = {k: v for k, v in comp.items() if k not in BINDING_FIELDS and k not in MACHINE_FIELDS}
        for k in BINDING_FIELDS:
            recomputed.pop(k, None)
        diffs = diff_values(recorded, recomputed, "")
        for path, old, new in diffs[:_MAX_FIELD_MESSAGES]:
            findings.append(f"comparison.json {path.lstrip('.')}: recorded {_short(old)} but the runs it names give "
                            f"{_short(new)}; the comparison was edited or a run changed (re-run `make aime-graft`)")
        if len(diffs) > _MAX_FIELD_MESSAGES:
            findings.append(f"comparison.json: ... and {len(diffs) - _MAX_FIELD_MESSAGES} more fields differ")
    return ComparisonCheck(ok=not findings, findings=findings, runs=checks,
                           pairs={g: p.to_json() for g, p in pairings.items()},
                           located={k: f"{p} ({how})" for k, (p, how) in located.items()}, compare=folder,
                           held=held)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


@dataclass(frozen=True)
class AuditedComparison:
    """A compare folder that re-checked (:func:`audited_comparison`): comparison.json as read, and each run it lists
    (label -> its records, read from the folder that was re-checked)."""

    path: Path
    raw: dict[str, Any]
    runs: dict[str, FinishedRun]


def audited_comparison(compare_dir: str | Path, reader: str) -> AuditedComparison:
    """comparison.json and the records of every run it lists, read only after :func:`audit_comparison` re-checks the
    whole (every run audited, bound to the comparison, every figure recomputed): what a reader that reports or logs
    a comparison's figures reads (log-run, the table scripts). A RunFolderError in one line naming the first
    difference (`reader` says who refuses) when it does not re-check, or when comparison.json is missing."""
    path = Path(compare_dir)
    if not path.joinpath(COMPARISON).is_file():
        raise RunFolderError(f"{path}: no {COMPARISON}; {reader} reads a finished compare folder "
                             "(runs/compare/<stamp>/, python -m harness.compare)")
    check = audit_comparison(path)
    if not check.ok:
        raise RunFolderError(refusal(path, check.findings, reader))
    raw = check.compare.read_json(COMPARISON)  # the bytes the check read, not a second read
    runs = {label: run.finished() for label, run in check.held.items()}
    return AuditedComparison(path, raw, runs)
