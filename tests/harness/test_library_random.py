"""The random-other-entry control (harness/library/random_entry.py, library.retrieval=random): never the problem
itself, the same entry for a problem in every run and order, spread over the library, None when nothing else is
left."""

from __future__ import annotations

from types import SimpleNamespace

from harness.library.random_entry import random_other_entry


def _entry(i: int) -> SimpleNamespace:
    return SimpleNamespace(problem_id=f"p{i}", problem_fingerprint=f"fp{i}")


def _problem(i: int) -> SimpleNamespace:
    return SimpleNamespace(id=f"p{i}", fingerprint=f"fp{i}")


def test_never_the_problem_itself_and_the_same_choice_in_any_order() -> None:
    entries = [_entry(i) for i in range(50)]
    picks = {i: random_other_entry(entries, _problem(i)) for i in range(50)}
    assert all(e.problem_id != f"p{i}" for i, e in picks.items())
    again = {i: random_other_entry(list(entries), _problem(i)) for i in reversed(range(50))}
    assert {i: e.problem_id for i, e in again.items()} == {i: e.problem_id for i, e in picks.items()}
    assert len({e.problem_id for e in picks.values()}) > 20  # spread, not one entry for every problem
    assert random_other_entry(entries, _problem(3), seed=1) is not None


def test_self_is_excluded_by_fingerprint_as_well_as_by_id() -> None:
    same_text = SimpleNamespace(problem_id="other-id", problem_fingerprint="fp7")  # the problem under another id
    assert random_other_entry([same_text, _entry(7)], _problem(7)) is None
    assert random_other_entry([], _problem(1)) is None


def test_a_random_entry_run_is_named_apart_from_the_held_out_run_in_titles_and_the_runs_table(tmp_path) -> None:
    import dataclasses
    import sys
    from pathlib import Path

    from harness.record.folder import RunFolder
    from harness.record.rows import Summary, run_label
    from harness.tracking.views import run_name

    sys.path.insert(0, str(Path(__file__).parent))
    import fakerun

    s = Summary.of(fakerun.make_rows("graft")[0:2], condition="graft", model="m", dataset="d", run_dir=str(tmp_path),
                   comparable_key="k", run_wall_s=1.0, energy_status="unavailable:none", energy_j=None,
                   group="held_out")
    bm25 = {"library": {"exclude_self": True, "retrieval": "bm25"}}
    rand = {"library": {"exclude_self": True, "retrieval": "random"}}
    assert run_label(s, bm25) == "graft held-out" and run_label(s, rand) == "graft held-out random entry"
    assert run_name(s, "held-out", RunFolder(tmp_path), 1024, rand).startswith("graft held-out random entry | d n=")
    assert run_name(s, "held-out", RunFolder(tmp_path), 1024).startswith("graft held-out | d n=")  # no config
    base = dataclasses.replace(s, condition="baseline", group=None, groups=None)
    assert run_label(base, rand) == "baseline"  # no library condition: no group, no retrieval
