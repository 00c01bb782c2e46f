"""Tests for harness.record.metrics: Wilson intervals, unbiased pass@k and run summaries."""

from __future__ import annotations

import json
import random
from math import comb

import numpy as np
import pytest

from harness.record.metrics import pass_at_k, summarize_scores, wilson_interval


def _rows(flags_by_problem: dict[str, list[bool]]) -> list[dict]:
    return [
        {"problem_id": pid, "sample": i, "correct": flag}
        for pid, flags in flags_by_problem.items()
        for i, flag in enumerate(flags)
    ]


# --- wilson_interval ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("successes", "n", "low", "high"),
    [(8, 10, 0.4902, 0.9433), (0, 10, 0.0, 0.2775), (10, 10, 0.7225, 1.0), (50, 100, 0.4038, 0.5962)],
)
def test_wilson_known_values(successes: int, n: int, low: float, high: float) -> None:
    got = wilson_interval(successes, n)
    assert got == pytest.approx((low, high), abs=5e-4)
    assert 0.0 <= got[0] <= successes / n <= got[1] <= 1.0


def test_wilson_wider_with_larger_z() -> None:
    narrow, wide = wilson_interval(8, 10, z=1.0), wilson_interval(8, 10, z=2.576)
    assert wide[0] < narrow[0] and narrow[1] < wide[1]


@pytest.mark.parametrize(("successes", "n"), [(0, 0), (-1, 10), (11, 10)])
def test_wilson_rejects_bad_input(successes: int, n: int) -> None:
    with pytest.raises(ValueError):
        wilson_interval(successes, n)


# --- pass_at_k ---------------------------------------------------------------------------------------


def _exact_pass_at_k(n: int, c: int, k: int) -> float:
    return 1.0 - comb(n - c, k) / comb(n, k)


@pytest.mark.parametrize(
    ("n", "c", "k"), [(n, c, k) for n in (1, 2, 5, 10, 16) for c in range(n + 1) for k in (1, 2, n) if k <= n]
)
def test_pass_at_k_matches_combinatorial_formula(n: int, c: int, k: int) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(_exact_pass_at_k(n, c, k), abs=1e-12)


def test_pass_at_k_edge_cases() -> None:
    assert pass_at_k(10, 0, 1) == 0.0
    assert pass_at_k(10, 0, 10) == 0.0
    assert pass_at_k(10, 10, 1) == 1.0
    assert pass_at_k(10, 8, 3) == 1.0  # n - c < k: every k-subset holds a correct sample
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)
    assert pass_at_k(200, 1, 100) == pytest.approx(0.5)


@pytest.mark.parametrize(("n", "c", "k"), [(0, 0, 1), (5, 6, 1), (5, -1, 1), (5, 2, 0), (5, 2, 6)])
def test_pass_at_k_rejects_bad_input(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


# --- summarize_scores --------------------------------------------------------------------------------


def test_summary_single_sample() -> None:
    rows = _rows({"a": [True], "b": [True], "c": [False], "d": [True], "e": [False]})
    summary = summarize_scores(rows)
    low, high = wilson_interval(3, 5)
    assert summary == {
        "n_problems": 5,
        "n_samples": 1,
        "n_rows": 5,
        "correct": 3,
        "accuracy": pytest.approx(0.6),
        "accuracy_ci_low": pytest.approx(low),
        "accuracy_ci_high": pytest.approx(high),
        "pass@1": pytest.approx(0.6),
        "avg@1": pytest.approx(0.6),
    }
    assert list(summary) == [
        "n_problems",
        "n_samples",
        "n_rows",
        "correct",
        "accuracy",
        "accuracy_ci_low",
        "accuracy_ci_high",
        "pass@1",
        "avg@1",
    ]


def test_summary_three_samples() -> None:
    rows = _rows(
        {
            "p1": [True, True, True],
            "p2": [True, False, False],
            "p3": [False, False, False],
            "p4": [False, True, True],
        }
    )
    summary = summarize_scores(rows)
    assert summary["n_problems"] == 4
    assert summary["n_samples"] == 3
    assert summary["n_rows"] == 12
    assert summary["correct"] == 6
    assert summary["accuracy"] == pytest.approx(0.5)  # (1 + 1/3 + 0 + 2/3) / 4
    assert summary["avg@3"] == summary["accuracy"]
    assert summary["pass@1"] == pytest.approx(0.5)
    assert summary["pass@3"] == pytest.approx(0.75)  # three of four problems solved at least once
    assert set(summary) == {
        "n_problems",
        "n_samples",
        "n_rows",
        "correct",
        "accuracy",
        "accuracy_ci_low",
        "accuracy_ci_high",
        "pass@1",
        "pass@3",
        "avg@3",
    }
    assert 0.0 <= summary["accuracy_ci_low"] < 0.5 < summary["accuracy_ci_high"] <= 1.0


def test_summary_bootstrap_matches_reference() -> None:
    flags = {"p1": [True, True, True], "p2": [True, False, False], "p3": [False, False, False]}
    fractions = np.array([1.0, 1 / 3, 0.0])
    idx = np.random.default_rng(0).integers(0, 3, size=(2000, 3))
    low, high = np.percentile(fractions[idx].mean(axis=1), [2.5, 97.5])
    summary = summarize_scores(_rows(flags))
    assert (summary["accuracy_ci_low"], summary["accuracy_ci_high"]) == (float(low), float(high))


def test_summary_is_deterministic_and_order_independent() -> None:
    rng = random.Random(1)
    flags = {f"p{i:02d}": [rng.random() < 0.4 for _ in range(4)] for i in range(30)}
    rows = _rows(flags)
    first = json.dumps(summarize_scores(rows), sort_keys=False)
    shuffled = rows[:]
    random.Random(7).shuffle(shuffled)
    assert json.dumps(summarize_scores(rows)) == first
    assert json.dumps(summarize_scores(shuffled)) == first
    for value in summarize_scores(rows).values():
        assert type(value) in (int, float)


def test_summary_unequal_sample_counts() -> None:
    rows = _rows({"a": [True, False], "b": [False, False, True]})
    summary = summarize_scores(rows)
    assert summary["n_samples"] == 2
    assert summary["n_rows"] == 5
    assert summary["accuracy"] == pytest.approx((1 / 2 + 1 / 3) / 2)
    assert summary["pass@2"] == pytest.approx((1.0 + _exact_pass_at_k(3, 1, 2)) / 2)
    assert "avg@2" in summary


@pytest.mark.parametrize(
    "rows",
    [
        [],
        [{"problem_id": "a", "sample": 0}],
        [{"problem_id": "a", "sample": 0, "correct": "False"}],
        [{"problem_id": "a", "sample": -1, "correct": True}],
        [
            {"problem_id": "a", "sample": 0, "correct": True},
            {"problem_id": "a", "sample": 0, "correct": False},
        ],
    ],
)
def test_summary_rejects_bad_rows(rows: list[dict]) -> None:
    with pytest.raises((ValueError, TypeError)):
        summarize_scores(rows)


@pytest.mark.parametrize("n", [1, 2, 3, 6, 7, 10, 40, 1000])
def test_wilson_interval_always_holds_the_observed_proportion(n):
    for successes in range(n + 1):
        low, high = wilson_interval(successes, n)
        assert 0.0 <= low <= successes / n <= high <= 1.0, (successes, n, low, high)
    assert wilson_interval(n, n)[1] == 1.0 and wilson_interval(0, n)[0] == 0.0
