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
