"""scripts/transfer_table.py: accuracy with Wilson intervals, per-problem wrong -> right / right -> wrong against
the model alone, rows stopped at the budget and overlong, decode tokens. Rows made here, with known outcomes."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from harness.record.metrics import wilson_interval

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO / "tests" / "harness"))
import fakerun  # noqa: E402
import transfer_table  # noqa: E402


def _rows(outcomes: dict[str, bool], condition: str, stop: str = "eos", overlong: bool | None = None) -> list:
    base = fakerun.make_rows(condition)[0]
    return [dataclasses.replace(base, problem_id=p, sample=0, correct=ok, overlong=overlong,
                                completion=dataclasses.replace(base.completion, stop_reason=stop))
            for p, ok in outcomes.items()]


def test_changes_against_the_model_alone_with_intervals_and_budget_stops():
    alone = _rows({"a": True, "b": False, "c": False, "d": False}, "baseline", stop="length")
    runs = {"held-out": _rows({"a": False, "b": True, "c": True, "d": False}, "graft"),
            "random-entry": _rows({"a": True, "b": False, "c": False, "d": False}, "graft", overlong=True)}
    t = transfer_table.table(alone, runs)
    assert t["problems"] == 4 and t["alone"]["length"] == 4 and "wrong_to_right" not in t["alone"]
    h = t["runs"]["held-out"]
    assert (h["correct"], h["n"], h["wrong_to_right"], h["right_to_wrong"]) == (2, 4, ["b", "c"], ["a"])
    assert h["ci95"] == [round(x, 4) for x in wilson_interval(2, 4)] and h["length"] == 0
    r = t["runs"]["random-entry"]
    assert (r["wrong_to_right"], r["right_to_wrong"], r["overlong"]) == ([], [], 4)
    text = transfer_table.markdown(t)
    assert "| held-out | 2/4 = 0.500 [" in text and "| b, c | a | 1.000 |" in text and "| alone | 1/4" in text
    assert h["mcnemar_p"] == 1.0 and r["mcnemar_p"] == 1.0  # 2 vs 1 changes, and none: no evidence either way


def test_mcnemar_exact_p_is_the_two_sided_binomial_on_the_changed_problems():
    assert transfer_table.mcnemar_exact_p(6, 0) == 2 / 2**6  # all six changes one way: 0.031
    assert transfer_table.mcnemar_exact_p(3, 0) == 0.25 and transfer_table.mcnemar_exact_p(0, 3) == 0.25
    assert transfer_table.mcnemar_exact_p(3, 1) == 2 * (1 + 4) / 16  # 0.625
    assert transfer_table.mcnemar_exact_p(0, 0) == 1.0 and transfer_table.mcnemar_exact_p(5, 5) == 1.0


def test_runs_over_other_problems_are_refused():
    with pytest.raises(SystemExit, match="same problems"):
        transfer_table.table(_rows({"a": True}, "baseline"), {"x": _rows({"b": True}, "graft")})
