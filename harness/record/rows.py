"""The typed record of a run: what a condition produced (`Completion`), one scored row of a run (`Row`) and
the run-level figures (`Summary`). Stages meet at these dataclasses; `harness.record.folder.RunFolder` writes
them to disk and reads them back. The JSON layout of each is harness/RUN_FORMAT.md.

    completion = condition.complete(problem, sample)       # harness.run.conditions
    row = Row.scored(problem.id, sample, "baseline", None, completion, problem.answer,
                     score(completion.text, problem.answer), wall_s=..., cpu_s=..., ...)
    summary = Summary.of(rows, condition="baseline", ...)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from harness.record.figures import Energy, GroupScores, Scores, Times, Tokens
from harness.task.answers import Score

SUMMARY_FORMAT = "kvgraft-summary/1"
STOP_REASONS = ("eos", "stop", "length")  # harness.run.decode: end of sequence, a stop string, the token budget


def stop_reason_counts(rows: Sequence[Row]) -> dict[str, int]:
    """How many rows ended at EOS, at a stop string and at their token budget ("length")."""
    return {k: sum(r.completion.stop_reason == k for r in rows) for k in STOP_REASONS}


class Group(StrEnum):
    """Recurring vs held-out, the one rule for a run and its rows: a library condition's run is `recurring`
    when it was configured with library.exclude_self=false (the library may hold the evaluated problem itself)
    and `held_out` with exclude_self=true (the evaluated problem never reaches the context); every row of the
    run has the run's group (`group_for`). Which rows of a recurring run found their own entry (an exact
    match) is counted apart (`Summary.own_entry_rows`), so a recurring run whose library lacks some problems
    says so instead of hiding held-out rows in it.

    The value is the on-disk spelling (rows' `group`, summary `groups` keys, comparison.json `pairs` keys,
    MLflow metric prefixes); `label` is how tables, run names and comparison labels spell it."""

    RECURRING = "recurring"
    HELD_OUT = "held_out"

    @property
    def label(self) -> str:
        """"recurring" / "held-out"."""
        return self.value.replace("_", "-")

    @classmethod
    def parse(cls, text: str) -> Group:
        """The group spelled either way ("held_out" on disk, "held-out" in labels and configs)."""
        try:
            return cls(str(text).replace("-", "_"))
        except ValueError:
            raise ValueError(f"group {text!r} is not one of recurring, held-out") from None


def group_for(exclude_self: bool) -> Group:
    """The group of a library condition's run, and so of each of its rows (the Group rule)."""
    return Group.HELD_OUT if exclude_self else Group.RECURRING


def legacy_row_group(match: str | None) -> Group:
    """The row rule of folders written before a run's group was recorded in its summary (`Summary.group`
    absent): `recurring` for an exact match, `held_out` otherwise. Only the audit of such folders uses it."""
    return Group.RECURRING if match == "exact" else Group.HELD_OUT


def own_entry_rows(rows: Sequence[Row]) -> int:
    """Rows whose retrieval found the evaluated problem's own entry (an exact fingerprint match)."""
    return sum(r.completion.retrieval is not None and r.completion.retrieval.match == "exact" for r in rows)


@dataclass(frozen=True)
class Retrieval:
    """What a library condition retrieved for a row: the entry, its artifact, how it matched."""

    entry_id: str
    artifact_id: str
    similarity: float  # 1.0 for an exact match, the BM25 score otherwise
    match: str  # "exact" | "bm25"


@dataclass(frozen=True)
class Completion:
    """What a condition produced for one (problem, sample). What only some conditions have is in optional parts:
    `retrieval` (a library condition that found an entry) and `extra` (a condition's own per-row figures, JSON
    values, written to the row's `extra` key)."""

    prompt: str  # the rendered query prompt
    context_ids: list[int]  # every token the model saw before decoding (grafted + prefilled)
    text: str  # the completion, cut before the first stop string
    token_ids: list[int]  # generated tokens
    stop_reason: str  # "eos" | "stop" | "length"
    prefill_tokens: int  # tokens computed in prefill
    grafted_tokens: int  # tokens restored from an artifact (0 without a graft)
    decode_tokens: int  # generated tokens (forward passes after prefill)
    first_logits_sha256: str | None = None  # SHA-256 of the logits that picked the first token, if recorded
    ttft_s: float | None = None  # time to first token, if recorded
    seed: int | None = None  # the sampling seed of this row (None for greedy)
    retrieval: Retrieval | None = None  # the library entry the condition read, if any
    extra: dict[str, Any] | None = None  # condition-specific per-row values (None: nothing)

    def __post_init__(self) -> None:
        if isinstance(self.retrieval, dict):  # rebuilt from dataclasses.asdict (harness/run/distributed.py)
            object.__setattr__(self, "retrieval", Retrieval(**self.retrieval))


@dataclass(frozen=True)
class Row:
    """One line of outputs.jsonl: a completion with its score and cost."""

    problem_id: str
    sample: int
    condition: str
    group: str | None  # Group value ("recurring" | "held_out") for conditions with a library, else None
    completion: Completion
    gold: str
    extracted: str | None
    answer: int | None
    correct: bool
    wall_s: float
    cpu_s: float
    energy_j: float | None
    energy_status: str  # "measured:<source>" | "unavailable:<reason>"
    # scored under a reasoning trace (model.trace, harness.task.trace): the closing delimiter the answer follows, and
    # whether the budget ran out inside the trace; both None (and absent from the JSON) without a trace
    trace_close: str | None = None
    overlong: bool | None = None

    @classmethod
    def scored(cls, problem_id: str, sample: int, condition: str, group: str | None, completion: Completion,
               gold: str, score: Score, *, wall_s: float, cpu_s: float, energy_j: float | None,
               energy_status: str, trace_close: str | None = None) -> Row:
        """A row from a completion and `harness.task.trace.score_traced(completion.text, gold, stop_reason,
        trace_close)` (`harness.task.answers.score(completion.text, gold)` without a trace)."""
        return cls(problem_id, sample, condition, None if group is None else Group.parse(group).value, completion,
                   gold, score.extracted, score.answer, score.correct, wall_s, cpu_s, energy_j,
                   energy_status, trace_close, None if trace_close is None else bool(score.overlong))

    def to_json(self) -> dict[str, Any]:
        c = self.completion
        return {
            "problem_id": self.problem_id, "sample": self.sample, "condition": self.condition, "group": self.group,
            "prompt": c.prompt, "prompt_token_ids": c.context_ids, "completion": c.text,
            "completion_token_ids": c.token_ids, "stop_reason": c.stop_reason,
            "gold_answer": self.gold, "extracted": self.extracted, "answer": self.answer, "correct": self.correct,
            "prompt_tokens": len(c.context_ids), "prefill_tokens": c.prefill_tokens,
            "grafted_tokens": c.grafted_tokens, "decode_tokens": c.decode_tokens,
            "first_logits_sha256": c.first_logits_sha256, "ttft_s": c.ttft_s, "seed": c.seed,
            "wall_s": self.wall_s, "cpu_s": self.cpu_s, "energy_j": self.energy_j,
            "energy_status": self.energy_status, **_retrieval_json(c.retrieval),
            **({"extra": c.extra} if c.extra is not None else {}),
            **({"trace_close": self.trace_close, "overlong": bool(self.overlong)} if self.trace_close is not None
               else {}),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Row:
        """The row of an outputs.jsonl line; keys added after format 1 began (group, first_logits_sha256,
        ttft_s, seed, extra) read as None when absent. A missing original key raises KeyError naming it."""
        completion = Completion(
            prompt=d["prompt"], context_ids=list(d["prompt_token_ids"]), text=d["completion"],
            token_ids=list(d["completion_token_ids"]), stop_reason=d["stop_reason"],
            prefill_tokens=d["prefill_tokens"], grafted_tokens=d["grafted_tokens"],
            decode_tokens=d["decode_tokens"], first_logits_sha256=d.get("first_logits_sha256"),
            ttft_s=d.get("ttft_s"), seed=d.get("seed"),
            retrieval=Retrieval(d["entry_id"], d["artifact_id"], d["similarity"], d["match"])
            if d.get("entry_id") is not None else None, extra=d.get("extra"),
        )
        return cls(d["problem_id"], d["sample"], d["condition"], d.get("group"), completion, d["gold_answer"],
                   d["extracted"], d["answer"], d["correct"], d["wall_s"], d["cpu_s"], d["energy_j"],
                   d["energy_status"], d.get("trace_close"), d.get("overlong"))


def _retrieval_json(r: Retrieval | None) -> dict[str, Any]:
    """The row's flat retrieval keys (outputs.jsonl format 1: present, null without a retrieval)."""
    return {"entry_id": r.entry_id if r else None, "artifact_id": r.artifact_id if r else None,
            "similarity": r.similarity if r else None, "match": r.match if r else None}


@dataclass(frozen=True)
class Summary:
    """summary.json: run-level figures, all derived from the rows except run_wall_s and the run's energy."""

    condition: str
    model: str
    dataset: str
    run_dir: str
    scores: Scores
    tokens: Tokens
    time: Times  # wall_s, cpu_s, ttft_s (sums over rows), run_wall_s (the whole run)
    energy: Energy
    comparable_key: str | None = None  # same key: same model, data, prompt, decoding, settings (harness.run.loop)
    groups: dict[str, GroupScores] | None = None  # scores per row group (Group value), for conditions with a library
    format: str = field(default=SUMMARY_FORMAT)
    exactness: str | None = None  # "not guaranteed exact: ..." when grafts may cross compute environments
    stop_reasons: dict[str, int] | None = None  # stop_reason_counts of the rows
    started_at: str | None = None  # when the run began and ended (ISO 8601, UTC); MLflow's start/end time
    finished_at: str | None = None
    group: str | None = None  # the run's Group value (group_for(library.exclude_self)), library conditions only
    own_entry_rows: int | None = None  # rows whose retrieval found their own entry (own_entry_rows), with group
    exact_default: str | None = None  # why the exact default (determinism.batch_invariant) was off for this run

    @classmethod
    def of(cls, rows: Sequence[Row], *, condition: str, model: str, dataset: str, run_dir: str,
           comparable_key: str | None, run_wall_s: float, energy_status: str, energy_j: float | None,
           group: Group | None, started_at: str | None = None, finished_at: str | None = None) -> Summary:
        """The summary of a finished run's rows; `group` (a library condition's run) adds it, its rows' groups
        and how many rows found their own entry."""
        return cls(
            condition=condition, model=model, dataset=dataset, run_dir=run_dir, scores=Scores.of(rows),
            tokens=Tokens.of(rows), time=Times.of(rows, run_wall_s), energy=Energy(energy_status, energy_j),
            comparable_key=comparable_key, groups=GroupScores.by_group(rows) if group is not None else None,
            stop_reasons=stop_reason_counts(rows),
            started_at=started_at, finished_at=finished_at, group=None if group is None else Group(group).value,
            own_entry_rows=None if group is None else own_entry_rows(rows),
        )

    def to_json(self) -> dict[str, Any]:
        out = {
            "format": self.format, "condition": self.condition, "model": self.model, "dataset": self.dataset,
            "run_dir": self.run_dir, "scores": self.scores.to_json(), "tokens": self.tokens.to_json(),
            "time": self.time.to_json(), "energy": self.energy.to_json(),
        }
        if self.comparable_key is not None:
            out["comparable_key"] = self.comparable_key
        if self.groups is not None:
            out["groups"] = {g: v.to_json() for g, v in self.groups.items()}
        if self.exactness is not None:
            out["exactness"] = self.exactness
        if self.stop_reasons is not None:
            out["stop_reasons"] = self.stop_reasons
        for key in ("started_at", "finished_at", "group", "own_entry_rows", "exact_default"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Summary:
        """The summary of a summary.json; a missing key raises KeyError naming it (optional keys read as None)."""
        groups = d.get("groups")
        return cls(d["condition"], d["model"], d["dataset"], d["run_dir"], Scores.from_json(d["scores"]),
                   Tokens.from_json(d["tokens"]), Times.from_json(d["time"]), Energy.from_json(d["energy"]),
                   d.get("comparable_key"), None if groups is None else {g: GroupScores.from_json(v) for g, v in
                   groups.items()}, d.get("format", ""),
                   d.get("exactness"), d.get("stop_reasons"), d.get("started_at"),
                   d.get("finished_at"), d.get("group"), d.get("own_entry_rows"), d.get("exact_default"))


def budget_of(config: dict[str, Any] | None) -> int | None:
    """The run's token budget (decoding.max_new_tokens of its recorded config), None when the config lacks it."""
    decoding = (config or {}).get("decoding")
    value = decoding.get("max_new_tokens") if isinstance(decoding, dict) else None
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def budget_label(tokens: int | None) -> str | None:
    """How a headline names the budget: "16 tokens" (published scores of the same model differ by budget)."""
    return None if tokens is None else f"{tokens} tokens"


def run_group(summary: Summary, config: dict[str, Any] | None = None) -> Group | None:
    """The run's group: summary.json `group`; for a folder written before it was recorded, the same rule from its
    config's library.exclude_self (None for a condition without a library: no `groups` in its summary)."""
    if summary.group is not None:
        return Group.parse(summary.group)
    if summary.groups is None:
        return None
    library = (config or {}).get("library")
    return group_for(bool(library.get("exclude_self")) if isinstance(library, dict) else False)


def run_label(summary: Summary, config: dict[str, Any] | None = None) -> str:
    """A run's name in titles and the runs table: the condition, its group, and the retrieval when it is not the
    related entry's (library.retrieval=random: the control of docs/models.md, "graft held-out random entry"), so two
    held-out runs that graft different entries are told apart."""
    group = run_group(summary, config)
    library = (config or {}).get("library")
    retrieval = library.get("retrieval") if isinstance(library, dict) and group is not None else None
    return " ".join([summary.condition, *([group.label] if group else []),
                     *(["random entry"] if retrieval == "random" else [])])


def group_note(summary: Summary) -> str | None:
    """A line saying how many rows of a recurring run had no entry of their own in the library (None when all
    did, or the run is held-out or has no library): those rows' figures are held-out-like."""
    group, own, n = summary.group, summary.own_entry_rows, summary.scores.n_rows
    if group != Group.RECURRING.value or own is None or own >= (n or 0):
        return None
    return (f"recurring run: {n - own} of {n} rows found no library entry of their own (retrieval read a "
            "neighbour); the library does not hold every evaluated problem")
