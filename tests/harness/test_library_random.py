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
