"""scripts/harvest_table.py: the harvest loop's table (before = avg@n, ceiling = pass@n, after = graft from the
harvested library, held-out), each with its 95% interval, and recurring / held-out split by whether the library
holds the problem. Rows made here, with known outcomes."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from harness.record.metrics import wilson_interval

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "harness"))
import fakerun  # noqa: E402

from scripts import harvest_table  # noqa: E402


def _rows(outcomes: dict[str, list[bool]], condition: str) -> list:
    base = fakerun.make_rows(condition)[0]
    return [dataclasses.replace(base, problem_id=p, sample=i, correct=ok)
            for p, flags in outcomes.items() for i, ok in enumerate(flags)]


def test_before_after_ceiling_and_held_out_with_their_intervals():
    samples = _rows({"a": [True, False, False, False], "b": [False] * 4, "c": [True, True, True, False],
                     "d": [False] * 4}, "baseline")  # a and c solved: the library holds them
    runs = {"baseline": _rows({"a": [False], "b": [False], "c": [True], "d": [False]}, "baseline"),
            "graft (recurring)": _rows({"a": [True], "b": [False], "c": [True], "d": [True]}, "graft"),
            "graft (held-out)": _rows({"a": [False], "b": [True], "c": [False], "d": [False]}, "graft")}
    t = harvest_table.loop_table(samples, runs)
    assert t["problems"] == 4 and t["samples_per_problem"] == 4 and t["harvested"] == ["a", "c"]
    assert t["before"]["name"] == "avg@4" and t["before"]["accuracy"] == pytest.approx((1 / 4 + 3 / 4) / 4)
    lo, hi = t["before"]["ci95"]
    assert 0 <= lo <= t["before"]["accuracy"] <= hi <= 1
    assert t["ceiling"]["name"] == "pass@4" and (t["ceiling"]["correct"], t["ceiling"]["n"]) == (2, 4)
    assert t["ceiling"]["ci95"] == [round(x, 4) for x in wilson_interval(2, 4)]
    rec = t["runs"]["graft (recurring)"]
    assert (rec["correct"], rec["n"]) == (3, 4) and rec["correct_problems"] == ["a", "c", "d"]
    assert (rec["on_solved"]["correct"], rec["on_solved"]["n"]) == (2, 2)
    assert (rec["on_unsolved"]["correct"], rec["on_unsolved"]["n"]) == (1, 2)
    held = t["runs"]["graft (held-out)"]
    assert (held["on_solved"]["correct"], held["on_unsolved"]["correct"]) == (0, 1)
    text = harvest_table.markdown(t)
    assert "| before: avg@4 of the CoT samples | 0.250 [" in text
    assert "| graft (recurring) | 3/4 = 0.750 [" in text and "harvested 2: a, c" in text


def test_a_folder_that_is_not_a_compare_folder_is_named(tmp_path):
    with pytest.raises(SystemExit, match="no comparison.json"):
        harvest_table.read_compare(tmp_path)
