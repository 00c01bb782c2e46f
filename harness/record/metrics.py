"""Accuracy metrics for scored runs: Wilson intervals, unbiased pass@k and a per-run summary.

Rows are `harness.record.rows.Row`s or mappings with the same outputs.jsonl keys (``problem_id``, ``sample``,
``correct``; ``group``, ``decode_tokens`` for groups). Pure and deterministic: the same rows (in any
order) give the same summary, down to the bytes of its JSON encoding. The bootstrap uses a fixed seed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "BOOTSTRAP_RESAMPLES", "BOOTSTRAP_SEED", "LATE_SCORE_KEYS", "majority_vote", "pass_at_k", "summarize_groups",
    "summarize_scores", "wilson_interval",
]

#: score keys added within format 1 (maj@k, the overlong count and rate): a summary written before them lacks them,
#: and its audit (harness.record.audit) does not count their absence as a difference
LATE_SCORE_KEYS = re.compile(r"^(maj@\d+|overlong|overlong_rate)$")

BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
_CI_LEVEL = 0.95
_Z_95 = 1.96


def wilson_interval(successes: int, n: int, z: float = _Z_95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion ``successes / n`` (z=1.96 gives ~95%)."""
    if n <= 0:
        raise ValueError(f"wilson_interval needs n >= 1 trials, got n={n}")
    if not 0 <= successes <= n:
        raise ValueError(f"wilson_interval needs 0 <= successes <= n, got successes={successes}, n={n}")
    p = successes / n
    z2 = z * z
    denom = 1.0 + z2 / n
    center = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1.0 - p) / n + z2 / (4.0 * n * n)) / denom
    # the interval always holds p; rounding can put it a last ulp outside (6/6 gave a high of 0.9999999999999999,
    # which made a plot's error bar negative), so clamp it to p as well as to [0, 1]
    return max(0.0, min(center - half, p)), min(1.0, max(center + half, p))


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples with ``c`` correct (Chen et al. 2021): 1 - C(n-c, k) / C(n, k).

    Computed in the numerically stable product form 1 - prod_{i=n-c+1}^{n} (1 - k / i).
    """
    if n < 1 or not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs n >= 1, 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def majority_vote(answers: Sequence[Any], correct: Sequence[bool]) -> bool:
    """Whether the majority answer of one problem's samples (in sample order) is correct: each sample with an answer
    (not None) casts one vote; a sample without one (no answer, or overlong) casts none (NeMo-Skills'
    majority@k); among the answers tied for most votes the one sampled first wins (lighteval's MajAtK,
    ``max(answers, key=answers.count)``, keeps the earliest of the tied); no answer at all is wrong."""
    counts: dict[Any, int] = {}
    for a in answers:
        if a is not None:
            counts[a] = counts.get(a, 0) + 1
    if not counts:
        return False
    best = max(counts.values())
    for a, ok in zip(answers, correct, strict=True):
        if a is not None and counts[a] == best:
            return bool(ok)
    return False  # unreachable: some answer has the best count


def _field(row: Any, key: str) -> Any:
    """``row[key]`` for a mapping, ``row.key`` for a typed row; KeyError when it has neither."""
    if isinstance(row, Mapping):
        return row[key]
    if key == "decode_tokens":
        return row.completion.decode_tokens
    try:
        return getattr(row, key)
    except AttributeError:
        raise KeyError(key) from None


def _group_by_problem(rows: Sequence[Any]) -> dict[str, list[bool]]:
    """Correctness flags per problem, problems sorted by id and samples by index; validates rows."""
    seen: dict[str, dict[int, bool]] = {}
    for i, row in enumerate(rows):
        missing = [key for key in ("problem_id", "sample", "correct") if isinstance(row, Mapping) and key not in row]
        if missing:
            raise ValueError(f"row {i} is missing key(s) {missing}; rows need problem_id, sample, correct")
        pid, sample, correct = str(_field(row, "problem_id")), _field(row, "sample"), _field(row, "correct")
        if not isinstance(correct, (bool, np.bool_)):
            raise TypeError(f"row {i}: 'correct' must be a bool, got {correct!r}")
        if isinstance(sample, bool) or not isinstance(sample, (int, np.integer)) or sample < 0:
            raise ValueError(f"row {i}: 'sample' must be a non-negative int, got {sample!r}")
        samples = seen.setdefault(pid, {})
        if int(sample) in samples:
            raise ValueError(f"row {i}: duplicate row for problem_id={pid!r}, sample={sample}")
        samples[int(sample)] = bool(correct)
    return {pid: [samples[s] for s in sorted(samples)] for pid, samples in sorted(seen.items())}


def _votes_by_problem(rows: Sequence[Any]) -> dict[str, tuple[list[Any], list[bool]]] | None:
    """Answers and correctness per problem in sample order (problems sorted by id), or None when a row carries no
    ``answer`` (a mapping without the key: bare rows of correctness flags have no votes to count)."""
    seen: dict[str, dict[int, tuple[Any, bool]]] = {}
    for row in rows:
        try:
            answer = _field(row, "answer")
        except KeyError:
            return None
        seen.setdefault(str(_field(row, "problem_id")), {})[int(_field(row, "sample"))] = (
            answer, bool(_field(row, "correct")))
    return {pid: ([v[s][0] for s in sorted(v)], [v[s][1] for s in sorted(v)]) for pid, v in sorted(seen.items())}


def _overlong(row: Any) -> bool:
    """The row's overlong flag (harness.task.trace): its budget ran out inside a reasoning trace; False without one."""
    value = row.get("overlong") if isinstance(row, Mapping) else getattr(row, "overlong", None)
    return bool(value)


def _bootstrap_ci(fractions: list[float]) -> tuple[float, float]:
    """Percentile bootstrap (over problems) of the mean per-problem accuracy, fixed seed."""
    values = np.asarray(fractions, dtype=np.float64)
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    idx = rng.integers(0, len(values), size=(BOOTSTRAP_RESAMPLES, len(values)))
    means = values[idx].mean(axis=1)
    tail = (1.0 - _CI_LEVEL) / 2.0 * 100.0
    low, high = np.percentile(means, [tail, 100.0 - tail])
    return float(low), float(high)


def summarize_scores(rows: Sequence[Any]) -> dict[str, float | int]:
    """Summarise scored rows (keys ``problem_id``, ``sample``, ``correct``) into a flat metrics dict.

    Keys: ``n_problems``, ``n_samples`` (samples per problem; the minimum if problems differ), ``n_rows``,
    ``correct``, ``accuracy`` (mean over problems of the fraction correct, i.e. avg@n),
    ``accuracy_ci_low``/``accuracy_ci_high`` (95%: Wilson when every problem has one sample, else a
    percentile bootstrap over problems, seed 0, 2000 resamples), ``pass@1``, ``pass@{n}`` (n > 1 only)
    and ``avg@{n}``; when the rows carry their ``answer`` (every recorded row does), ``maj@{n}`` (the fraction of
    problems whose majority answer over their first n samples is correct: `majority_vote` states the vote and its
    tie rule), ``overlong`` (rows whose token budget ran out inside a reasoning trace, harness.task.trace) and
    ``overlong_rate`` (overlong / n_rows). Raises ValueError (TypeError for a non-bool ``correct``) on empty or
    malformed rows.
    """
    if not rows:
        raise ValueError("summarize_scores needs at least one row")
    groups = _group_by_problem(rows)
    counts = [len(flags) for flags in groups.values()]
    corrects = [sum(flags) for flags in groups.values()]
    n_samples = min(counts)
    n_rows = sum(counts)
    n_correct = sum(corrects)
    fractions = [c / n for c, n in zip(corrects, counts, strict=True)]
    accuracy = math.fsum(fractions) / len(fractions)
    if max(counts) == 1:
        ci_low, ci_high = wilson_interval(n_correct, n_rows)
    else:
        ci_low, ci_high = _bootstrap_ci(fractions)

    summary: dict[str, float | int] = {
        "n_problems": len(groups),
        "n_samples": n_samples,
        "n_rows": n_rows,
        "correct": n_correct,
        "accuracy": accuracy,
        "accuracy_ci_low": ci_low,
        "accuracy_ci_high": ci_high,
    }
    for k in sorted({1, n_samples}):
        estimates = [pass_at_k(n, c, k) for c, n in zip(corrects, counts, strict=True)]
        summary[f"pass@{k}"] = math.fsum(estimates) / len(estimates)
    summary[f"avg@{n_samples}"] = accuracy
    votes = _votes_by_problem(rows)
    if votes is not None:
        majority = [majority_vote(a[:n_samples], c[:n_samples]) for a, c in votes.values()]
        summary[f"maj@{n_samples}"] = sum(majority) / len(majority)
        overlong = sum(_overlong(r) for r in rows)
        summary["overlong"] = overlong
        summary["overlong_rate"] = overlong / n_rows
    return summary


def summarize_groups(rows: Sequence[Any]) -> dict[str, dict[str, Any]]:
    """summarize_scores per row ``group`` (recurring / held_out, set once by the condition: see
    ``harness.record.rows.group_for``), plus each group's decode-token total; rows without a group are left out."""
    groups: dict[str, list[Any]] = {}
    for r in rows:
        group = r.get("group") if isinstance(r, Mapping) else r.group
        if group is not None:
            groups.setdefault(str(group), []).append(r)
    return {
        name: {**summarize_scores(g), "decode_tokens": sum(int(_field(r, "decode_tokens")) for r in g)}
        for name, g in sorted(groups.items())
    }
