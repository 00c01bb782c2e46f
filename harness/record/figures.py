"""The run-level figures of a summary (summary.json's `scores`, `groups`, `tokens`, `time`, `energy`) as typed
records, each written and read by itself (`to_json` / `from_json`), in the layout harness/RUN_FORMAT.md gives.
`harness.record.rows.Summary` holds them; comparison.json repeats them per run (harness.compare.comparison).

    scores = Scores.of(rows)          # harness.record.metrics.summarize_scores, typed
    scores.accuracy, scores.pass_at[1], scores.to_json()["avg@1"]

JSON is byte-compatible with the dicts written before these types: the same keys in the same order, and an
optional key (`time.ttft_s`, `time.run_wall_s` of old folders) stays absent when it was absent.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any, TypeVar

from harness.record.metrics import summarize_groups, summarize_scores

__all__ = ["TOKEN_KINDS", "Energy", "FlatJson", "GroupScores", "Scores", "Times", "Tokens"]

_PASS = re.compile(r"^pass@(\d+)$")
_MAJ = re.compile(r"^maj@(\d+)$")
_T = TypeVar("_T")


class FlatJson:
    """A dataclass written as one JSON object, its fields as keys in field order (`to_json`), and read back
    (`from_json`): a field with a default may be absent (older files), a missing required one raises KeyError
    naming it. For records whose JSON is exactly their fields."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_json(cls: type[_T], d: Mapping[str, Any]) -> _T:
        missing = [f.name for f in fields(cls) if f.name not in d and f.default is MISSING]  # type: ignore[arg-type]
        if missing:
            raise KeyError(missing[0])
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})  # type: ignore[arg-type]


@dataclass(frozen=True)
class Scores:
    """Accuracy of a set of rows (harness.record.metrics.summarize_scores): accuracy is the mean over problems of the
    fraction of samples correct (avg@n), its 95% interval, unbiased pass@k for k in {1, n_samples}, maj@n_samples
    (majority vote, harness.record.metrics.majority_vote) and the rows cut by the budget inside a reasoning trace
    (overlong, overlong_rate). maj_at and overlong are None only in summaries written before they were recorded."""

    n_problems: int
    n_samples: int  # samples per problem (the minimum if problems differ)
    n_rows: int
    correct: int
    accuracy: float
    accuracy_ci_low: float
    accuracy_ci_high: float
    pass_at: dict[int, float]  # k -> pass@k
    maj_at: dict[int, float] | None = None  # k -> maj@k (k = n_samples)
    overlong: int | None = None  # rows whose budget ran out inside a reasoning trace (0 without model.trace)
    overlong_rate: float | None = None  # overlong / n_rows

    @classmethod
    def of(cls, rows: Sequence[Any]) -> Scores:
        return cls.from_json(summarize_scores(rows))

    def to_json(self) -> dict[str, Any]:
        return {
            "n_problems": self.n_problems, "n_samples": self.n_samples, "n_rows": self.n_rows,
            "correct": self.correct, "accuracy": self.accuracy, "accuracy_ci_low": self.accuracy_ci_low,
            "accuracy_ci_high": self.accuracy_ci_high, **{f"pass@{k}": v for k, v in sorted(self.pass_at.items())},
            f"avg@{self.n_samples}": self.accuracy, **{f"maj@{k}": v for k, v in sorted((self.maj_at or {}).items())},
            **({"overlong": self.overlong} if self.overlong is not None else {}),
            **({"overlong_rate": self.overlong_rate} if self.overlong_rate is not None else {}),
        }

    def maj(self) -> tuple[int, float] | None:
        """(k, maj@k) for the largest k recorded, or None (a summary written before maj@k)."""
        return max(self.maj_at.items()) if self.maj_at else None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Scores:
        """The scores of a summary's `scores` (a subclass's fields too); a missing key raises KeyError naming it
        (avg@n is accuracy, so it is not read; maj@k and overlong may be absent: older summaries)."""
        pass_at = {int(m[1]): v for k, v in d.items() if (m := _PASS.match(k))}
        maj_at = {int(m[1]): v for k, v in d.items() if (m := _MAJ.match(k))} or None
        missing = [f.name for f in fields(cls) if f.default is MISSING and f.name != "pass_at" and f.name not in d]
        if missing:
            raise KeyError(missing[0])
        skip = ("pass_at", "maj_at")
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name not in skip and f.name in d}, pass_at=pass_at,
                   maj_at=maj_at)


@dataclass(frozen=True)
class GroupScores(Scores):
    """The scores of one row group (recurring / held_out) and its decode-token total (summary.json `groups`)."""

    decode_tokens: int = 0

    @classmethod
    def by_group(cls, rows: Sequence[Any]) -> dict[str, GroupScores]:
        """harness.record.metrics.summarize_groups, typed: group value -> its scores (rows without a group left out)."""
        return {g: cls.from_json(d) for g, d in summarize_groups(rows).items()}

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "decode_tokens": self.decode_tokens}


@dataclass(frozen=True)
class Tokens(FlatJson):
    """Token totals over a run's rows: the prompt the model saw = prefill (computed) + grafted (restored)."""

    prompt: int
    prefill: int
    grafted: int
    decode: int

    @classmethod
    def of(cls, rows: Sequence[Any]) -> Tokens:
        cs = [r.completion for r in rows]
        return cls(sum(len(c.context_ids) for c in cs), sum(c.prefill_tokens for c in cs),
                   sum(c.grafted_tokens for c in cs), sum(c.decode_tokens for c in cs))



TOKEN_KINDS = tuple(f.name for f in fields(Tokens))  # summary.json tokens keys; rows' <kind>_tokens


@dataclass(frozen=True)
class Times:
    """Seconds: wall, CPU and time-to-first-token summed over rows, and the whole run's wall clock. ttft_s and
    run_wall_s are None only in folders written before they were recorded."""

    wall_s: float
    cpu_s: float
    ttft_s: float | None = None
    run_wall_s: float | None = None

    @classmethod
    def of(cls, rows: Sequence[Any], run_wall_s: float) -> Times:
        return cls(sum(r.wall_s for r in rows), sum(r.cpu_s for r in rows),
                   sum(r.completion.ttft_s or 0.0 for r in rows), round(run_wall_s, 3))

    def to_json(self) -> dict[str, float]:
        out = {"wall_s": self.wall_s, "cpu_s": self.cpu_s}
        if self.ttft_s is not None:
            out["ttft_s"] = self.ttft_s
        if self.run_wall_s is not None:
            out["run_wall_s"] = self.run_wall_s
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Times:
        return cls(d["wall_s"], d["cpu_s"], d.get("ttft_s"), d.get("run_wall_s"))


@dataclass(frozen=True)
class Energy(FlatJson):
    """The run's energy: `status` is "measured:<source>", "estimated:<method>" or "unavailable:<reason>"
    (harness.run.energy); joules None when unavailable. An estimate is never shown or compared as a measurement."""

    status: str
    joules: float | None = None

    @property
    def kind(self) -> str:
        """"measured", "estimated" or "unavailable" (the status's prefix; unavailable whenever joules is None)."""
        kind = self.status.split(":", 1)[0]
        return kind if self.joules is not None and kind in ("measured", "estimated") else "unavailable"

    @property
    def measured(self) -> bool:
        return self.kind == "measured"

    @property
    def estimated(self) -> bool:
        return self.kind == "estimated"

    @property
    def label(self) -> str:
        """The status in words: "measured (nvml)", "estimated (<method>)", "unavailable (<reason>)"."""
        detail = self.status.split(":", 1)[1] if ":" in self.status else self.status
        return f"{self.kind} ({detail})"

    def text(self) -> str:
        """The figure for a table cell: "12.3 J", "12.3 J est." (the label goes in a line below) or "unavailable"."""
        if self.joules is None:
            return "unavailable"
        return f"{self.joules:.1f} J" + (" est." if self.estimated else "")
