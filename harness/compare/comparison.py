"""comparison.json as a typed record (`Comparison`), computed from a compare job's runs' Summaries (pure, no model)
and read back by the views (terminal, summary page, MLflow) and the re-check. Its layout is harness/RUN_FORMAT.md.

    plan = Plan.of_config(c.compare)                                          # harness.compare.plan
    result = comparison(key, folders, summaries, pairings, manifests, plan)   # harness/compare/job.py, in memory
    result.summaries["graft (held-out)"].comparison.token_reduction           # baseline / run
    result.pairs["recurring"].pairing.identical                               # rows identical to the twin
    Comparison.from_json(json.loads(path.read_text()))                        # scripts/show_comparison.py

The re-check of a written comparison (`make rescore RUN=runs/compare/<stamp>`) is harness.compare.audit: it
recomputes `comparison(...)` from the run folders and diffs the JSON field by field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.compare.pairing import Pairing
from harness.compare.plan import Plan
from harness.record.figures import Energy, FlatJson, GroupScores, Scores, Times, Tokens
from harness.record.folder import RunFolder
from harness.record.rows import Summary

__all__ = ["COMPARISON", "Comparison", "Factors", "JobLoad", "LibraryRecord", "PairResult", "RunFigures",
           "VsBaseline", "compare_summaries", "comparison"]

COMPARISON = "comparison.json"

@dataclass(frozen=True)
class Factors(FlatJson):
    """What a graft saves against reading the same entry in context: incontext / graft (above 1: cheaper)."""

    prefill_factor: float | None = None
    ttft_factor: float | None = None
    wall_factor: float | None = None
    cpu_factor: float | None = None


@dataclass(frozen=True)
class VsBaseline(FlatJson):
    """A run against the comparison's baseline (factors are baseline / run; None where a side has no figure)."""

    baseline_run: str
    baseline_rows: int
    baseline_accuracy: float
    accuracy: float
    accuracy_delta: float
    baseline_decode_tokens: int
    decode_tokens: int
    energy_status: str  # "measured" | "estimated (<method>)" | "unavailable (<why>)"
    baseline_accuracy_ci_low: float | None = None
    baseline_accuracy_ci_high: float | None = None
    # rows where the baseline ran out of budget: a token reduction against them is against cut-off answers
    baseline_budget_hit_rows: int | None = None
    token_reduction: float | None = None
    token_reduction_note: str | None = None
    prefill_factor: float | None = None
    ttft_factor: float | None = None
    wall_factor: float | None = None
    cpu_factor: float | None = None
    energy_factor: float | None = None


@dataclass(frozen=True)
class RunFigures:
    """One run's figures in comparison.json `summaries`: its Summary's, and (not the baseline) its comparison."""

    scores: Scores
    tokens: Tokens
    time: Times
    energy: Energy
    stop_reasons: dict[str, int] | None = None
    groups: dict[str, GroupScores] | None = None
    comparison: VsBaseline | None = None  # None for the baseline

    @classmethod
    def of(cls, s: Summary, vs: VsBaseline | None) -> RunFigures:
        return cls(s.scores, s.tokens, s.time, s.energy, s.stop_reasons, s.groups, vs)

    def to_json(self) -> dict[str, Any]:
        return {
            "scores": self.scores.to_json(), "tokens": self.tokens.to_json(), "time": self.time.to_json(),
            "energy": self.energy.to_json(), "stop_reasons": self.stop_reasons,
            **({"groups": {g: v.to_json() for g, v in self.groups.items()}} if self.groups is not None else {}),
            "comparison": None if self.comparison is None else self.comparison.to_json(),
        }

    @classmethod
    def from_json(cls, d: Any) -> RunFigures:
        groups, vs = d.get("groups"), d.get("comparison")
        return cls(Scores.from_json(d["scores"]), Tokens.from_json(d["tokens"]), Times.from_json(d["time"]),
                   Energy.from_json(d["energy"]), d.get("stop_reasons"),
                   None if groups is None else {g: GroupScores.from_json(v) for g, v in groups.items()},
                   None if vs is None else VsBaseline.from_json(vs))


@dataclass(frozen=True)
class PairResult:
    """One pair of the plan (key: its group): the run (`graft_run`) and its twin (`incontext_run`: format 1's
    names, whatever the conditions), how many of their rows are identical, and the run's factors over its twin."""

    graft_run: str
    incontext_run: str
    pairing: Pairing
    graft_vs_incontext: Factors | None = None

    @property
    def rows(self) -> int:
        return self.pairing.identical + self.pairing.differing

    def to_json(self) -> dict[str, Any]:
        f = self.graft_vs_incontext
        return {"graft_run": self.graft_run, "incontext_run": self.incontext_run, **self.pairing.to_json(),
                **({} if f is None else {"graft_vs_incontext": f.to_json()})}

    @classmethod
    def from_json(cls, d: Any) -> PairResult:
        f = d.get("graft_vs_incontext")
        return cls(d["graft_run"], d["incontext_run"],
                   Pairing(d["identical_rows"], d["differing_rows"], list(d.get("differences") or [])),
                   None if f is None else Factors.from_json(f))


@dataclass(frozen=True)
class RunLoad(FlatJson):
    """The 1-minute load average when a run of the job started and ended."""

    start: float | None = None
    end: float | None = None


@dataclass(frozen=True)
class JobLoad:
    """How loaded the machine was while the job ran (comparison.json `load`; not re-checked: not recomputable)."""

    cores: int | None = None
    runs: dict[str, RunLoad] | None = None  # label -> its load (runs the job made; not a reused baseline)

    @property
    def highest(self) -> tuple[float, str] | None:
        """(the highest load average seen, during which run), or None without a figure."""
        seen = [(x, label) for label, r in (self.runs or {}).items() for x in (r.start, r.end) if x is not None]
        return max(seen) if seen else None

    def to_json(self) -> dict[str, Any]:
        return {"cores": self.cores, "runs": {k: v.to_json() for k, v in (self.runs or {}).items()}}

    @classmethod
    def from_json(cls, d: Any) -> JobLoad:
        return cls(d.get("cores"), {k: RunLoad.from_json(v) for k, v in (d.get("runs") or {}).items()})


@dataclass(frozen=True)
class LibraryRecord(FlatJson):
    """The library the job opened or built (comparison.json `library`; not re-checked): which, how big, how long."""

    name: str | None = None
    version: int | None = None
    path: str | None = None  # the library folder
    entries: int | None = None
    tokens: int | None = None  # tokens_total of its manifest
    bytes: int | None = None  # its artifacts' size in the store
    built: bool | None = None  # true: this job built it; false: opened
    seconds: float | None = None  # this job's time opening or building it
    started_at: float | None = None  # when that began (seconds since the epoch)
    manifest_sha256: str | None = None


@dataclass(frozen=True)
class Comparison:
    """comparison.json. `plan` is the recorded plan, or for a file written before plans its legacy plan
    (`plan_recorded` false: then not written back); `load` and `library` describe the machine and the job, not
    the runs (harness.compare.audit.MACHINE_FIELDS)."""

    comparable_key: str | None
    runs: dict[str, str]  # label -> run folder
    summaries: dict[str, RunFigures]  # label -> its figures
    plan: Plan
    plan_recorded: bool = True
    run_manifests: dict[str, str] | None = None  # label -> its manifest_sha256: binds the comparison to the runs
    pairs: dict[str, PairResult] | None = None  # pair key (the group) -> the pair's result
    load: JobLoad | None = None
    library: LibraryRecord | None = None
    run_links: dict[str, str] | None = None  # label -> its run folder relative to the compare folder (moved together)

    def ordered(self) -> dict[str, RunFigures]:
        """`summaries` in the plan's order (the file sorts its keys), runs the plan lacks last."""
        order = self.plan.labels
        rank = {k: (k not in order, order.index(k) if k in order else 0, k) for k in self.summaries}
        return {k: self.summaries[k] for k in sorted(self.summaries, key=rank.__getitem__)}

    def identical(self) -> dict[str, str]:
        """The label of each pair's run -> "k/n" rows identical to its twin."""
        return {self.plan.pairs[g][0]: f"{p.pairing.identical}/{p.rows}"
                for g, p in (self.pairs or {}).items() if g in self.plan.pairs}

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"plan": self.plan.to_json()} if self.plan_recorded else {}
        out.update({"comparable_key": self.comparable_key, "runs": dict(self.runs)})
        if self.run_manifests is not None:
            out["run_manifests"] = dict(self.run_manifests)
        if self.run_links is not None:
            out["run_links"] = dict(self.run_links)
        if self.pairs is not None:
            out["pairs"] = {k: p.to_json() for k, p in self.pairs.items()}
        out["summaries"] = {k: s.to_json() for k, s in self.summaries.items()}
        if self.load is not None:
            out["load"] = self.load.to_json()
        if self.library is not None:
            out["library"] = self.library.to_json()
        return out

    @classmethod
    def from_json(cls, d: Any) -> Comparison:
        """The comparison of a comparison.json object; a missing required key raises KeyError naming it."""
        pairs, load, library = d.get("pairs"), d.get("load"), d.get("library")
        return cls(
            d.get("comparable_key"), dict(d["runs"]), {k: RunFigures.from_json(v) for k, v in d["summaries"].items()},
            Plan.of_comparison(d), "plan" in d, d.get("run_manifests"),
            None if pairs is None else {k: PairResult.from_json(v) for k, v in pairs.items()},
            None if load is None else JobLoad.from_json(load),
            None if library is None else LibraryRecord.from_json(library),
            d.get("run_links"),
        )


def _factor(a: float | None, b: float | None) -> float | None:
    return (a / b) if a is not None and b not in (None, 0) else None


def compare_summaries(baseline: Summary, other: Summary) -> VsBaseline:
    """Side-by-side figures of a run against its matching baseline (factors are baseline / other)."""
    be, oe = baseline.energy, other.energy
    both_measured = be.measured and oe.measured
    # estimates compare only with estimates of the same method, never with a measurement
    same_estimate = be.estimated and oe.estimated and be.status == oe.status
    if both_measured or same_estimate:
        energy_status = "measured" if both_measured else oe.label
    elif be.joules is not None and oe.joules is not None:
        energy_status = f"unavailable (not comparable: baseline {be.label}, this run {oe.label})"
    else:
        energy_status = f"unavailable ({oe.status if oe.joules is None else be.status})"
    budget_hit = (baseline.stop_reasons or {}).get("length")
    bs, bt, bm, os_, ot, om = baseline.scores, baseline.tokens, baseline.time, other.scores, other.tokens, other.time
    return VsBaseline(
        baseline_run=baseline.run_dir, baseline_budget_hit_rows=budget_hit, baseline_rows=bs.n_rows,
        baseline_accuracy=bs.accuracy, baseline_accuracy_ci_low=bs.accuracy_ci_low,
        baseline_accuracy_ci_high=bs.accuracy_ci_high, accuracy=os_.accuracy,
        accuracy_delta=os_.accuracy - bs.accuracy, baseline_decode_tokens=bt.decode, decode_tokens=ot.decode,
        token_reduction=_factor(bt.decode, ot.decode),
        token_reduction_note=(f"against truncated answers: the baseline hit its token budget on {budget_hit} of "
                              f"{bs.n_rows} rows" if budget_hit else None),
        prefill_factor=_factor(bt.prefill, ot.prefill), ttft_factor=_factor(bm.ttft_s, om.ttft_s),
        wall_factor=_factor(bm.wall_s, om.wall_s), cpu_factor=_factor(bm.cpu_s, om.cpu_s),
        energy_factor=_factor(be.joules, oe.joules) if both_measured or same_estimate else None,
        energy_status=energy_status,
    )


def _vs_incontext(c: Summary, g: Summary) -> Factors:
    """What the graft saves against reading the same entry in context (factors are incontext / graft)."""
    return Factors(_factor(c.tokens.prefill, g.tokens.prefill), _factor(c.time.ttft_s, g.time.ttft_s),
                   _factor(c.time.wall_s, g.time.wall_s), _factor(c.time.cpu_s, g.time.cpu_s))


def comparison(key: str | None, folders: dict[str, RunFolder], summaries: dict[str, Summary],
               pairings: dict[str, Pairing] | None = None, manifests: dict[str, str] | None = None,
               plan: Plan | None = None) -> Comparison:
    """The comparison, computed in memory: each run's figures and, for the others, the comparison with the
    baseline (`plan.baseline`); `pairings` (pair key -> Pairing of plan.pairs[key]) adds `pairs`: per pair the
    two run folders, the pairing and the run's factors over its twin; `manifests` (label -> the run's
    manifest_sha256) adds `run_manifests`, which binds the comparison to exactly those runs. `plan` (default: the
    legacy plan of the labels) is recorded when given."""
    recorded_plan = plan is not None
    plan = plan or Plan.of_comparison({"runs": folders, "pairs": pairings or {}})
    base = summaries[plan.baseline]
    pairs = None if pairings is None else {
        k: PairResult(str(folders[plan.pairs[k][0]].path), str(folders[plan.pairs[k][1]].path), p,
                      _vs_incontext(summaries[plan.pairs[k][1]], summaries[plan.pairs[k][0]]))
        for k, p in pairings.items()
    }
    return Comparison(
        comparable_key=key, runs={k: str(f.path) for k, f in folders.items()},
        summaries={k: RunFigures.of(s, None if k == plan.baseline else compare_summaries(base, s))
                   for k, s in summaries.items()},
        plan=plan, plan_recorded=recorded_plan, run_manifests=None if manifests is None else dict(manifests),
        pairs=pairs,
    )
