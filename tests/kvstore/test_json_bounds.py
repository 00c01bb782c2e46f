"""Bounded strict JSON for artifact headers: each limit refused with the path of the offending value."""

import pytest

from kvstore.errors import FormatError
from kvstore.format.invariants import MAX_INT, MAX_JSON_DEPTH, MAX_STRING, loads_strict


def test_a_header_within_the_bounds_parses() -> None:
    assert loads_strict(b'{"a": [1, 2.5, true, null, "x"], "b": {"c": -3}}', "header") == {
        "a": [1, 2.5, True, None, "x"], "b": {"c": -3}}


@pytest.mark.parametrize(("raw", "match"), [
    ('{"layers": [{"kind": "s"}, {"kind": ' + str(MAX_INT + 1) + "}]}",
     r"header\.layers\[1\]\.kind: integer .* out of range"),
    ('{"a": {"b": ["' + "x" * (MAX_STRING + 1) + '"]}}', r"header\.a\.b\[0\]: a string of"),
    ("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1), r"nested deeper than"),
    ('{"a": 1, "a": 2}', r"duplicate key 'a'"),
    ('{"a": NaN}', r"not a JSON number"),
])
def test_each_bound_is_refused_naming_the_value(raw: str, match: str) -> None:
    with pytest.raises(FormatError, match=match):
        loads_strict(raw.encode(), "header")


def test_booleans_are_not_range_checked_as_integers() -> None:
    assert loads_strict(b"[true, false]", "header") == [True, False]
