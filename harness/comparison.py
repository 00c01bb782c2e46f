"""comparison.json: the compare job's figures, computed from its runs' Summaries (pure, no model), and the re-check
that recomputes every one of them from the run folders it names.

    result = comparison(key, folders, summaries, pairings, manifests)   # harness/compare.py, in memory
    check = audit_comparison("runs/compare/<stamp>")                      # scripts/rescore.py, no model, no torch

The re-check (`make rescore RUN=runs/compare/<stamp>`) audits every run listed (harness.audit), checks that each is
the run the comparison was made from (its manifest SHA-256, recorded in `run_manifests`), that it is the condition
and group its label says and shares the comparison's comparable key, re-pairs each group's graft and incontext rows
(harness.pairing), then recomputes the whole comparison from those runs and reports every field that differs
(`summaries.graft (held-out).comparison.token_reduction`, `pairs.recurring.graft_run` ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.audit import RunCheck, audit, diff_values
from harness.errors import RunFolderError
from harness.pairing import Pairing, pair_folders
from harness.record import Group, Summary
from harness.run_folder import RunFolder

__all__ = ["BASELINE_LABEL", "COMPARISON", "GROUPS", "MACHINE_FIELDS", "PAIRS", "ComparisonCheck",
           "audit_comparison", "compare_summaries", "comparison"]  # fmt: skip

COMPARISON = "comparison.json"
#: Labels of the runs in the table and in comparison.json; each group's (incontext, graft) pair and its
#: library.exclude_self. The order is the table's. The condition names are harness.conditions' registry names.
BASELINE_LABEL = "baseline"
GROUPS = {g.value: (g.label, g is Group.HELD_OUT) for g in Group}
PAIRS = {g: (f"incontext ({name})", f"graft ({name})") for g, (name, _) in GROUPS.items()}
_CONDITION = {BASELINE_LABEL: "baseline", **{label: label.split(" ")[0] for p in PAIRS.values() for label in p}}
_MAX_FIELD_MESSAGES = 30
#: What the machine was like while the job ran (load average per run, the library's build): recorded in
#: comparison.json for an honest reading of its timings, not recomputable from the runs, so not re-checked.
MACHINE_FIELDS = ("load", "library")


def _factor(a: float | None, b: float | None) -> float | None:
    return (a / b) if a is not None and b not in (None, 0) else None


def compare_summaries(baseline: Summary, other: Summary) -> dict[str, Any]:
    """Side-by-side figures of a run against its matching baseline (factors are baseline / other)."""
    be, oe = baseline.energy, other.energy
    both_measured = be.get("joules") is not None and oe.get("joules") is not None
    budget_hit = (baseline.stop_reasons or {}).get("length")
    return {
        "baseline_run": baseline.run_dir,
        # rows where the baseline ran out of budget: a token reduction against them is against cut-off answers
        "baseline_budget_hit_rows": budget_hit,
        "baseline_rows": baseline.scores["n_rows"],
        "baseline_accuracy": baseline.scores["accuracy"],
        "baseline_accuracy_ci_low": baseline.scores["accuracy_ci_low"],
        "baseline_accuracy_ci_high": baseline.scores["accuracy_ci_high"],
        "accuracy": other.scores["accuracy"],
        "accuracy_delta": other.scores["accuracy"] - baseline.scores["accuracy"],
        "baseline_decode_tokens": baseline.tokens["decode"],
        "decode_tokens": other.tokens["decode"],
        "token_reduction": _factor(baseline.tokens["decode"], other.tokens["decode"]),
        "token_reduction_note": (
            f"against truncated answers: the baseline hit its token budget on {budget_hit} of "
            f"{baseline.scores['n_rows']} rows" if budget_hit else None),
        "prefill_factor": _factor(baseline.tokens["prefill"], other.tokens["prefill"]),
        "ttft_factor": _factor(baseline.time.get("ttft_s"), other.time.get("ttft_s")),
        "wall_factor": _factor(baseline.time["wall_s"], other.time["wall_s"]),
        "cpu_factor": _factor(baseline.time["cpu_s"], other.time["cpu_s"]),
        "energy_factor": _factor(be["joules"], oe["joules"]) if both_measured else None,
        "energy_status": "measured" if both_measured else f"unavailable ({oe.get('status')})",
    }  # fmt: skip


def _vs_incontext(c: Summary, g: Summary) -> dict[str, float | None]:
    """What the graft saves against reading the same entry in context (factors are incontext / graft)."""
    return {"prefill_factor": _factor(c.tokens["prefill"], g.tokens["prefill"]),
            "ttft_factor": _factor(c.time.get("ttft_s"), g.time.get("ttft_s")),
            "wall_factor": _factor(c.time["wall_s"], g.time["wall_s"]),
            "cpu_factor": _factor(c.time["cpu_s"], g.time["cpu_s"])}  # fmt: skip


def comparison(key: str, folders: dict[str, RunFolder], summaries: dict[str, Summary],
               pairings: dict[str, Pairing] | None = None, manifests: dict[str, str] | None = None) -> dict[str, Any]:
    """comparison.json, computed in memory: each run's figures and, for the others, the comparison with the
    baseline (`summaries[BASELINE_LABEL]`); `pairings` (group -> Pairing of PAIRS[group]) adds `pairs`: per group
    the two run folders, `identical_rows`, `differing_rows` and what differs; `manifests` (label -> the run's
    manifest_sha256) adds `run_manifests`, which binds the comparison to exactly those runs."""
    base = summaries[BASELINE_LABEL]
    pairs = {
        group: {"graft_run": str(folders[PAIRS[group][1]].path), "incontext_run": str(folders[PAIRS[group][0]].path),
                **p.to_json(),
                "graft_vs_incontext": _vs_incontext(summaries[PAIRS[group][0]], summaries[PAIRS[group][1]])}
        for group, p in (pairings or {}).items()
    }  # fmt: skip
    return {
        "comparable_key": key,
        "runs": {k: str(f.path) for k, f in folders.items()},
        **({"run_manifests": dict(manifests)} if manifests is not None else {}),
        **({"pairs": pairs} if pairings is not None else {}),
        "summaries": {
            k: {
                "scores": s.scores, "tokens": s.tokens, "time": s.time, "energy": s.energy,
                "stop_reasons": s.stop_reasons,
                **({"groups": s.groups} if s.groups is not None else {}),
                "comparison": None if k == BASELINE_LABEL else compare_summaries(base, s),
            }
            for k, s in summaries.items()
        },
    }  # fmt: skip


@dataclass
class ComparisonCheck:
    """Result of :func:`audit_comparison`: each listed run's audit (label -> RunCheck), each group's pairing
    re-derived from the recorded rows (group -> Pairing.to_json()), and findings (empty when ok)."""

    ok: bool
    findings: list[str]
    runs: dict[str, RunCheck]
    pairs: dict[str, Any]


def _check_run(label: str, folder: RunFolder, comp: dict[str, Any], recorded_manifests: dict[str, Any],
               findings: list[str]) -> tuple[Summary, str] | None:  # fmt: skip
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
                        "replaced); restore it or re-run `make aime-graft`")  # fmt: skip
    if summary.comparable_key != comp.get("comparable_key"):
        key = str(comp.get("comparable_key"))[:16]
        findings.append(f"comparison.json runs.{label}: {where} has comparable_key "
                        f"{str(summary.comparable_key)[:16]}.., the comparison {key}..: a run with another model, "
                        "dataset, prompt or decoding cannot be compared")  # fmt: skip
    want = _CONDITION.get(label)
    if want is not None and summary.condition != want:
        findings.append(f"comparison.json runs.{label}: {where} is a {summary.condition!r} run, the label needs "
                        f"{want!r}")  # fmt: skip
    library = config.get("library") if isinstance(config.get("library"), dict) else {}
    for group, labels in PAIRS.items():
        if label in labels and "exclude_self" in library and bool(library["exclude_self"]) != GROUPS[group][1]:
            findings.append(f"comparison.json runs.{label}: {where} ran with library.exclude_self="
                            f"{str(bool(library['exclude_self'])).lower()}: it is not the {GROUPS[group][0]} run")
    return summary, sha


def audit_comparison(compare_dir: str | Path) -> ComparisonCheck:
    """Re-check a compare job's folder without the model (module docstring). Raises RunFolderError when
    comparison.json is missing or unreadable; every other discrepancy is a finding naming the field."""
    folder = RunFolder(compare_dir)
    comp = folder.read_json(COMPARISON)
    findings: list[str] = []
    runs = comp.get("runs") if isinstance(comp.get("runs"), dict) else {}
    if not runs:
        findings.append(f"{folder.file(COMPARISON)}: no 'runs' listed; the file is damaged")
    recorded_manifests = comp.get("run_manifests")
    if not isinstance(recorded_manifests, dict):
        findings.append("comparison.json: no 'run_manifests' (the manifest SHA-256 of each run compared): written "
                        "before comparisons were bound to their runs, so they cannot be re-checked; re-run "
                        "`make aime-graft`")  # fmt: skip
        recorded_manifests = {}
    for label in sorted(set(recorded_manifests) - set(runs)):
        findings.append(f"comparison.json: run_manifests.{label} names a run that 'runs' does not list")
    checks: dict[str, RunCheck] = {}
    folders: dict[str, RunFolder] = {}
    summaries: dict[str, Summary] = {}
    manifests: dict[str, str] = {}
    for label, path in runs.items():
        run = RunFolder(path)
        try:
            checks[label] = audit(run)
        except RunFolderError as exc:
            findings.append(f"run {label!r} ({path}): {exc}")
            continue
        findings.extend(f"run {label!r} ({path}): {f}" for f in checks[label].findings)
        got = _check_run(label, run, comp, recorded_manifests, findings)
        if got is not None:
            folders[label], (summaries[label], manifests[label]) = run, got
    if "pairs" not in comp:
        findings.append(f"{folder.file(COMPARISON)}: no 'pairs' section: written before the incontext control "
                        "existed; re-run `make aime-graft` to get the graft-vs-incontext check")  # fmt: skip
    pairings: dict[str, Pairing] = {}
    for group, labels in PAIRS.items():
        if all(lbl in runs for lbl in labels):
            try:
                pairings[group] = pair_folders(RunFolder(runs[labels[1]]), RunFolder(runs[labels[0]]))
            except RunFolderError as exc:
                findings.append(f"comparison.json pairs.{group}: cannot re-pair its runs ({exc})")
                continue
            findings.extend(f"pairs.{group}: graft row differs from its incontext twin: {d}"
                            for d in pairings[group].differences)  # fmt: skip
        elif isinstance(comp.get("pairs"), dict) and group in comp["pairs"]:
            findings.append(f"comparison.json pairs.{group}: 'runs' does not list {' and '.join(labels)}")
    if BASELINE_LABEL not in runs:
        findings.append(f"comparison.json: 'runs' has no {BASELINE_LABEL!r}; every figure is against it")
    elif set(summaries) == set(runs):  # every run readable: recompute every figure from them
        recomputed = comparison(comp.get("comparable_key"), folders, summaries,
                                pairings if "pairs" in comp else None, manifests)  # fmt: skip
        recorded = {k: v for k, v in comp.items() if k != "run_manifests" and k not in MACHINE_FIELDS}
        recomputed.pop("run_manifests", None)
        diffs = diff_values(recorded, recomputed, "")
        for path, old, new in diffs[:_MAX_FIELD_MESSAGES]:
            findings.append(f"comparison.json {path.lstrip('.')}: recorded {_short(old)} but the runs it names give "
                            f"{_short(new)}; the comparison was edited or a run changed (re-run `make aime-graft`)")
        if len(diffs) > _MAX_FIELD_MESSAGES:
            findings.append(f"comparison.json: ... and {len(diffs) - _MAX_FIELD_MESSAGES} more fields differ")
    return ComparisonCheck(ok=not findings, findings=findings, runs=checks,
                           pairs={g: p.to_json() for g, p in pairings.items()})  # fmt: skip


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."
