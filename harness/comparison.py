"""comparison.json: the compare job's figures, computed from its runs' Summaries (pure, no model), and the re-check
that recomputes every one of them from the run folders it names.

    plan = Plan.of_config(c.compare)                                       # which runs, which pairs (configs/compare/)
    result = comparison(key, folders, summaries, pairings, manifests, plan)   # harness/compare.py, in memory
    check = audit_comparison("runs/compare/<stamp>")                      # scripts/rescore.py, no model, no torch

The re-check (`make rescore RUN=runs/compare/<stamp>`) audits every run listed (harness.audit), checks that each is
the run the comparison was made from (its manifest SHA-256, recorded in `run_manifests`), that it is the condition
and group its label says and shares the comparison's comparable key, re-pairs each group's graft and incontext rows
(harness.pairing), then recomputes the whole comparison from those runs and reports every field that differs
(`summaries.graft (held-out).comparison.token_reduction`, `pairs.recurring.graft_run` ...).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.audit import RunCheck, audit, diff_values
from harness.errors import ConfigError, RunFolderError
from harness.pairing import Pairing, pair_folders
from harness.record import Group, Summary, run_group
from harness.run_folder import RunFolder

__all__ = ["BASELINE_LABEL", "COMPARISON", "GROUPS", "MACHINE_FIELDS", "PAIRS", "ComparisonCheck", "Plan",
           "PlannedRun", "audit_comparison", "compare_summaries", "comparison"]  # fmt: skip

COMPARISON = "comparison.json"
#: The plan of comparisons written before the plan was recorded (configs/compare/graft.yaml's first four runs):
#: each group's (incontext, graft) pair and its library.exclude_self.
BASELINE_LABEL = "baseline"
GROUPS = {g.value: (g.label, g is Group.HELD_OUT) for g in Group}
PAIRS = {g: (f"incontext ({name})", f"graft ({name})") for g, (name, _) in GROUPS.items()}
_MAX_FIELD_MESSAGES = 30
#: What the machine was like while the job ran (load average per run, the library's build): recorded in
#: comparison.json for an honest reading of its timings, not recomputable from the runs, so not re-checked.
MACHINE_FIELDS = ("load", "library")


_LABEL = re.compile(r"^(?P<condition>[\w-]+)(?: \((?P<group>[\w-]+)\))?$")


@dataclass(frozen=True)
class PlannedRun:
    """One run of a comparison: a condition (harness.conditions registry name) and its group (library
    conditions). Its label, ``graft (held-out)``, names it in comparison.json, the tables and MLflow."""

    condition: str
    group: Group | None = None

    @property
    def label(self) -> str:
        return self.condition if self.group is None else f"{self.condition} ({self.group.label})"

    @classmethod
    def of_label(cls, label: str) -> PlannedRun:
        m = _LABEL.match(label)
        if m is None:
            raise ValueError(f"run label {label!r} is not '<condition>' or '<condition> (<group>)'")
        return cls(m["condition"], Group.parse(m["group"]) if m["group"] else None)


@dataclass(frozen=True)
class Plan:
    """What a compare job runs and checks: the baseline (every factor is against it), the runs in table order
    (baseline first) and the pairs whose rows must be identical: key (the pair's shared group) -> (run label,
    its twin's label). Built from the config (`of_config`, configs/compare/) and recorded in comparison.json
    (`plan`); a comparison written before that reads as the legacy plan of its labels (`of_comparison`)."""

    baseline: str
    runs: tuple[PlannedRun, ...]
    pairs: dict[str, tuple[str, str]]

    @property
    def labels(self) -> list[str]:
        return [r.label for r in self.runs]

    def run(self, label: str) -> PlannedRun | None:
        return next((r for r in self.runs if r.label == label), None)

    def to_json(self) -> dict[str, Any]:
        return {"baseline": self.baseline, "runs": self.labels, "pairs": {k: list(v) for k, v in self.pairs.items()}}

    @classmethod
    def of(cls, baseline: str, runs: Sequence[PlannedRun], identical: Sequence[Sequence[str]],
           where: str = "compare") -> Plan:  # fmt: skip
        """The plan, checked: labels unique, each pair two listed runs of one group, one pair per group; a
        ConfigError names the key (`where`.runs / .identical) otherwise."""
        listed = [PlannedRun(baseline), *runs]
        labels = [r.label for r in listed]
        dup = sorted({x for x in labels if labels.count(x) > 1})
        if dup:
            raise ConfigError(f"{where}.runs: {dup[0]!r} is listed twice; list each run once (configs/compare/)")
        pairs: dict[str, tuple[str, str]] = {}
        for i, pair in enumerate(identical):
            key = f"{where}.identical[{i}]"
            if len(pair) != 2 or any(x not in labels for x in pair):
                raise ConfigError(f"{key}={list(pair)!r}: needs two of the listed runs {labels} (configs/compare/)")
            a, b = (next(r for r in listed if r.label == x) for x in pair)
            if a.group is None or a.group != b.group:
                raise ConfigError(f"{key}={list(pair)!r}: twins share a group (the same retrieval); these do not")
            if a.group.value in pairs:
                raise ConfigError(f"{key}: a second pair in group {a.group.label}; one identical pair per group")
            pairs[a.group.value] = (a.label, b.label)
        return cls(baseline, tuple(listed), pairs)

    @classmethod
    def of_config(cls, compare: Any) -> Plan:
        """From the typed `compare` config section (harness.config.CompareConfig)."""
        runs = []
        for i, r in enumerate(compare.runs):
            r = r if isinstance(r, Mapping) else vars(r)
            try:
                group = Group.parse(r["group"]) if r.get("group") is not None else None
            except ValueError as exc:
                raise ConfigError(f"compare.runs[{i}].group: {exc} (configs/compare/)") from None
            runs.append(PlannedRun(str(r.get("condition")), group))
        return cls.of(compare.baseline, runs, [list(p) for p in compare.identical])

    @classmethod
    def legacy(cls) -> Plan:
        """The plan of every comparison written before plans were recorded: baseline, incontext and graft in
        each group, graft paired with incontext."""
        return cls.of_comparison({"runs": dict.fromkeys([BASELINE_LABEL, *(x for p in PAIRS.values() for x in p)])})

    @classmethod
    def of_comparison(cls, comp: Mapping[str, Any]) -> Plan:
        """The plan comparison.json records, or for one written before plans: its labels, baseline first, and
        format 1's pairs (graft and incontext of each group)."""
        recorded = comp.get("plan")
        if isinstance(recorded, Mapping):
            runs = [PlannedRun.of_label(x) for x in recorded.get("runs") or []]
            return cls(str(recorded.get("baseline")), tuple(runs),
                       {k: (v[0], v[1]) for k, v in (recorded.get("pairs") or {}).items()})  # fmt: skip
        labels = list((comp.get("runs") or {}).keys())
        order = [BASELINE_LABEL, *(label for pair in PAIRS.values() for label in pair)]
        labels.sort(key=lambda k: (k not in order, order.index(k) if k in order else 0, k))
        pairs = {g: (graft, incontext) for g, (incontext, graft) in PAIRS.items()
                 if (graft in labels and incontext in labels) or g in (comp.get("pairs") or {})}  # fmt: skip
        return cls(BASELINE_LABEL, tuple(PlannedRun.of_label(x) for x in labels), pairs)


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
               pairings: dict[str, Pairing] | None = None, manifests: dict[str, str] | None = None,
               plan: Plan | None = None) -> dict[str, Any]:  # fmt: skip
    """comparison.json, computed in memory: each run's figures and, for the others, the comparison with the
    baseline (`plan.baseline`); `pairings` (pair key -> Pairing of plan.pairs[key]) adds `pairs`: per pair
    the two run folders (the run as `graft_run`, its twin as `incontext_run`: format 1's names), `identical_rows`,
    `differing_rows` and what differs; `manifests` (label -> the run's manifest_sha256) adds `run_manifests`,
    which binds the comparison to exactly those runs. `plan` (default: the legacy plan of the labels) is recorded
    as `plan` when given."""
    recorded_plan = plan is not None
    plan = plan or Plan.of_comparison({"runs": folders, "pairs": pairings or {}})
    base = summaries[plan.baseline]
    pairs = {
        k: {"graft_run": str(folders[plan.pairs[k][0]].path), "incontext_run": str(folders[plan.pairs[k][1]].path),
            **p.to_json(),
            "graft_vs_incontext": _vs_incontext(summaries[plan.pairs[k][1]], summaries[plan.pairs[k][0]])}
        for k, p in (pairings or {}).items()
    }  # fmt: skip
    return {
        **({"plan": plan.to_json()} if recorded_plan else {}),
        "comparable_key": key,
        "runs": {k: str(f.path) for k, f in folders.items()},
        **({"run_manifests": dict(manifests)} if manifests is not None else {}),
        **({"pairs": pairs} if pairings is not None else {}),
        "summaries": {
            k: {
                "scores": s.scores, "tokens": s.tokens, "time": s.time, "energy": s.energy,
                "stop_reasons": s.stop_reasons,
                **({"groups": s.groups} if s.groups is not None else {}),
                "comparison": None if k == plan.baseline else compare_summaries(base, s),
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
               plan: Plan, findings: list[str]) -> tuple[Summary, str] | None:  # fmt: skip
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
    planned = plan.run(label)
    if planned is None:
        findings.append(f"comparison.json runs.{label}: not a run of the comparison's plan {plan.labels}")
        return summary, sha
    if summary.condition != planned.condition:
        findings.append(f"comparison.json runs.{label}: {where} is a {summary.condition!r} run, the label needs "
                        f"{planned.condition!r}")  # fmt: skip
    library = config.get("library") if isinstance(config.get("library"), dict) else {}
    if planned.group is not None and "exclude_self" in library and run_group(summary, config) is not planned.group:
        findings.append(f"comparison.json runs.{label}: {where} ran with library.exclude_self="
                        f"{str(bool(library['exclude_self'])).lower()}: it is not the {planned.group.label} run")
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
    try:
        plan = Plan.of_comparison(comp)
    except (ValueError, TypeError, IndexError) as exc:
        findings.append(f"comparison.json plan: unreadable ({exc}); the file is damaged")
        plan = Plan.of_comparison({k: v for k, v in comp.items() if k != "plan"})
    if set(plan.labels) != set(runs):
        findings.append(f"comparison.json plan.runs: {plan.labels} but 'runs' lists {sorted(runs)}; the file was "
                        "edited")  # fmt: skip
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
        got = _check_run(label, run, comp, recorded_manifests, plan, findings)
        if got is not None:
            folders[label], (summaries[label], manifests[label]) = run, got
    if "pairs" not in comp:
        findings.append(f"{folder.file(COMPARISON)}: no 'pairs' section: written before the incontext control "
                        "existed; re-run `make aime-graft` to get the graft-vs-incontext check")  # fmt: skip
    pairings: dict[str, Pairing] = {}
    for key, (first, twin) in plan.pairs.items():
        if first in runs and twin in runs:
            try:
                pairings[key] = pair_folders(RunFolder(runs[first]), RunFolder(runs[twin]))
            except RunFolderError as exc:
                findings.append(f"comparison.json pairs.{key}: cannot re-pair its runs ({exc})")
                continue
            findings.extend(f"pairs.{key}: {first} row differs from its twin {twin}: {d}"
                            for d in pairings[key].differences)  # fmt: skip
        else:
            findings.append(f"comparison.json pairs.{key}: 'runs' does not list {first} and {twin}")
    for key in sorted(set(comp.get("pairs") or {}) - set(plan.pairs)):
        findings.append(f"comparison.json pairs.{key}: not a pair of the comparison's plan; the file was edited")
    if plan.baseline not in runs:
        findings.append(f"comparison.json: 'runs' has no {plan.baseline!r}; every figure is against it")
    elif set(summaries) == set(runs):  # every run readable: recompute every figure from them
        recomputed = comparison(comp.get("comparable_key"), folders, summaries,
                                pairings if "pairs" in comp else None, manifests,
                                plan if "plan" in comp else None)  # fmt: skip
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
