"""What a compare job runs and checks, as data: the baseline, the runs in table order (each a condition and, for a
library condition, its group) and the pairs whose rows must be identical. Built from the typed config
(`Plan.of_config`, configs/compare/graft.yaml) and recorded in comparison.json (`plan`), so adding a condition to
the comparison is a line of config, not code.

    plan = Plan.of_config(c.compare)     # harness/compare/job.py
    plan.labels                          # ["baseline", "incontext (recurring)", "graft (recurring)", ...]
    plan.pairs["held_out"]               # ("graft (held-out)", "incontext (held-out)")
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from harness.errors import ConfigError
from harness.record.rows import Group

__all__ = ["BASELINE_LABEL", "GROUPS", "PAIRS", "Plan", "PlannedRun"]

#: The plan of comparisons written before the plan was recorded (configs/compare/graft.yaml's first four runs):
#: each group's (incontext, graft) pair and its library.exclude_self.
BASELINE_LABEL = "baseline"
GROUPS = {g.value: (g.label, g is Group.HELD_OUT) for g in Group}
PAIRS = {g: (f"incontext ({name})", f"graft ({name})") for g, (name, _) in GROUPS.items()}

_LABEL = re.compile(r"^(?P<condition>[\w-]+)(?: \((?P<group>[\w-]+)\))?$")


@dataclass(frozen=True)
class PlannedRun:
    """One run of a comparison: a condition (harness.run.conditions registry name) and its group (library
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
           where: str = "compare") -> Plan:
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
        """From the typed `compare` config section (harness.config.schema.CompareConfig)."""
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
                       {k: (v[0], v[1]) for k, v in (recorded.get("pairs") or {}).items()})
        labels = list((comp.get("runs") or {}).keys())
        order = [BASELINE_LABEL, *(label for pair in PAIRS.values() for label in pair)]
        labels.sort(key=lambda k: (k not in order, order.index(k) if k in order else 0, k))
        pairs = {g: (graft, incontext) for g, (incontext, graft) in PAIRS.items()
                 if (graft in labels and incontext in labels) or g in (comp.get("pairs") or {})}
        return cls(BASELINE_LABEL, tuple(PlannedRun.of_label(x) for x in labels), pairs)
