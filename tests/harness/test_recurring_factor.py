"""harness/experiments/recurring_factor.py's table (make recurring-factor): totals per problem and overall, each factor baseline / graft, computed
from the rows (hand-built rows here; the experiment itself is `make recurring-factor`)."""

from __future__ import annotations

import dataclasses
from types import ModuleType

import pytest

from harness.experiments.recurring_factor import factor_table


def test_the_factor_table_sums_rows_and_divides_baseline_by_graft(fakerun: ModuleType) -> None:
    base = fakerun.make_rows("baseline")
    graft = [dataclasses.replace(r, condition="graft", wall_s=r.wall_s / 4,
                                 completion=dataclasses.replace(r.completion, decode_tokens=2)) for r in base]
    table = factor_table(base, graft)
    total = table["total"]
    assert total["baseline"]["decode_tokens"] == sum(r.completion.decode_tokens for r in base)
    assert total["graft"]["decode_tokens"] == 2 * len(graft)
    assert total["factor"]["decode_tokens"] == pytest.approx(total["baseline"]["decode_tokens"] / (2 * len(graft)),
                                                             abs=0.01)
    assert total["factor"]["wall_s"] == pytest.approx(4.0, abs=0.01)
    assert total["factor"]["cpu_s"] == 1.0 and total["factor"]["energy_j"] is None  # no meter: no energy factor
    assert set(table["problems"]) == {r.problem_id for r in base}
    assert sum(p["baseline"]["rows"] for p in table["problems"].values()) == len(base)


def test_the_selection_rule_takes_the_first_never_solved_problems_the_library_holds(fakerun: ModuleType) -> None:
    from harness.experiments.recurring_factor import first_unsolved

    rows = fakerun.make_rows("baseline")  # toy-1: one of two samples correct; toy-2: correct
    wrong = [dataclasses.replace(r, correct=False) for r in rows if r.problem_id == "toy-2"]
    base = [*rows[:2], *[dataclasses.replace(r, problem_id=f"toy-{k}") for k in (3, 4, 5) for r in wrong]]
    assert [r.problem_id for r in base] == ["toy-1", "toy-1", "toy-3", "toy-4", "toy-5"]
    assert any(r.correct for r in base[:2])
    held = {"toy-1", "toy-3", "toy-4", "toy-5"}
    sel = first_unsolved(base, 2, held=held, skipped={})
    assert sel["chosen"] == ["toy-3", "toy-4"] and sel["solved_skipped"] == ["toy-1"] and sel["considered"] == 4
    # a never-solved problem without a library entry is skipped with the build's reason, the next one taken
    sel = first_unsolved(base, 2, held=held - {"toy-3"}, skipped={"toy-3": "entry too long"})
    assert sel["chosen"] == ["toy-4", "toy-5"] and sel["not_held_skipped"] == {"toy-3": "entry too long"}
    # fewer qualify than asked: all of them, and the caller warns
    assert first_unsolved(base, 5, held=held, skipped={})["chosen"] == ["toy-3", "toy-4", "toy-5"]
