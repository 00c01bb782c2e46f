"""Declarations on config schema fields and the one walk that checks them: a range (`bounded`), a hint
(`choice`; an enum field's members are its allowed values) or a form (a `pattern`, e.g. model.device). A leaf:
harness/config/schema.py declares its fields with these, `validate` runs `check_fields` over the whole typed config, and
`field_note` adds a field's range and hint to OmegaConf's one-line refusal at composition.

    max_new_tokens: int = bounded(64, at_least=1, hint="the token budget of each answer")
    check_fields(config)   # ConfigError: decoding.max_new_tokens=0: must be an integer >= 1 (the token budget ...)
"""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from dataclasses import field
from enum import Enum
from typing import Any

from harness.errors import ConfigError

__all__ = ["bounded", "check_choice", "check_fields", "choice", "field_note", "lookup"]


# Ranges and hints live on the fields too (field metadata): `validate` walks the whole schema once and refuses a
# value outside its field's range in one line naming the key, the range and the hint; `compose_config` and `typed`
# add the hint to OmegaConf's refusal of a wrong type or an enum value that is not a member.
def bounded(default: Any, *, at_least: float | None = None, above: float | None = None, at_most: float | None = None,
            hint: str) -> Any:
    """A schema field whose value must lie in a range (`at_least` <= value, `above` < value, value <= `at_most`;
    an int field must hold an integer, a float field a finite number); `hint` says what the value is."""
    bounds = {"at_least": at_least, "above": above, "at_most": at_most}
    return field(default=default, metadata={**{k: v for k, v in bounds.items() if v is not None}, "hint": hint})


def choice(default: Any, hint: str) -> Any:
    """A schema field with a hint; for an enum field its members are the allowed values."""
    return field(default=default, metadata={"hint": hint})


def check_fields(obj: Any, prefix: str = "") -> None:
    """Walk a config dataclass and the dataclasses under it (lists of them included) and refuse, in one
    ConfigError line naming the full key, a value its field's declaration does not allow: outside the field's
    range (`bounded`), not a member of the field's enum (a Config built in Python is not checked by OmegaConf), or
    not of the field's form (model.device)."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        key, value = prefix + f.name, getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            check_fields(value, key + ".")
            continue
        if isinstance(value, list):
            for i, item in enumerate(value):
                if dataclasses.is_dataclass(item):
                    check_fields(item, f"{key}[{i}].")
        kind, optional = _base_type(hints[f.name])
        if value is None and optional:
            continue
        note = f" ({f.metadata['hint']})" if f.metadata.get("hint") else ""
        if isinstance(kind, type) and issubclass(kind, Enum):
            allowed = [m.value for m in kind]
            if value not in allowed:  # a StrEnum member equals its value
                raise ConfigError(f"{key}={value!r}: use one of {', '.join(allowed)}{note}")
        if bounds := _bounds(f):
            _check_range(key, value, kind, bounds, note)
        if "pattern" in f.metadata and not (isinstance(value, str) and re.fullmatch(f.metadata["pattern"], value)):
            raise ConfigError(f"{key}={value!r}: use one of {f.metadata['forms']}{note}")


def _base_type(kind: Any) -> tuple[Any, bool]:
    """`int | None` -> (int, True); `int` -> (int, False)."""
    args = typing.get_args(kind)
    if type(None) in args and len(args) == 2:
        return next(a for a in args if a is not type(None)), True
    return kind, False


def _bounds(f: dataclasses.Field) -> dict[str, float]:
    return {k: f.metadata[k] for k in ("at_least", "above", "at_most") if k in f.metadata}


def _range_text(kind: Any, bounds: dict[str, float]) -> str:
    """What a `bounded` field of type `kind` must be: "an integer >= 1", "a finite number in (0, 1]", ..."""
    low, above, high = bounds.get("at_least"), bounds.get("above"), bounds.get("at_most")
    if high is not None and (low is not None or above is not None):
        span = f"in [{low}, {high}]" if low is not None else f"in ({above}, {high}]"
    else:
        span = f">= {low}" if low is not None else f"> {above}" if above is not None else f"<= {high}"
    return f"{'an integer' if kind is int else 'a finite number'} {span}"


def _check_range(key: str, value: Any, kind: Any, bounds: dict[str, float], note: str) -> None:
    if isinstance(value, bool):
        number = False
    elif kind is int:
        number = isinstance(value, int)
    else:
        number = isinstance(value, int | float) and math.isfinite(value)
    if not (number and _within(value, bounds)):
        raise ConfigError(f"{key}={value!r}: must be {_range_text(kind, bounds)}{note}")


def _within(value: float, bounds: dict[str, float]) -> bool:
    low, above, high = bounds.get("at_least"), bounds.get("above"), bounds.get("at_most")
    return (low is None or value >= low) and (above is None or value > above) and (high is None or value <= high)


def lookup(root: type, key: str) -> tuple[dataclasses.Field, Any] | None:
    """The schema field at dotted `key` under the dataclass `root` and its type (Optional removed), or None."""
    cls: Any = root
    found = None
    for part in key.split("."):
        fields = {f.name: f for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else {}
        if part not in fields:
            return None
        found, cls = fields[part], typing.get_type_hints(cls)[part]
    return (found, _base_type(cls)[0]) if found is not None else None


def check_choice(root: type, key: str, values: list[str]) -> None:
    """Refuse, in one ConfigError line naming the key, the allowed values and the hint, a value of `values` (an
    override's, each of a sweep's) that is not a member of the enum field at `key`; other fields pass."""
    got = lookup(root, key)
    if got is None or not (isinstance(got[1], type) and issubclass(got[1], Enum)):
        return
    allowed = [m.value for m in got[1]]
    for value in values:
        if value not in allowed and value != "null" and "${" not in value:
            hint = got[0].metadata.get("hint")
            raise ConfigError(f"{key}={value}: use one of {', '.join(allowed)}" + (f" ({hint})" if hint else ""))


def field_note(root: type, key: str) -> str:
    """What the schema declares for the field at dotted `key`, its range and hint (`; decoding.max_new_tokens: an
    integer >= 1 (the token budget of each answer)`) in the schema rooted at `root`, or "" when it declares nothing
    or has no such field."""
    got = lookup(root, key)
    if got is None:
        return ""
    found, kind = got
    hint = found.metadata.get("hint")
    if bounds := _bounds(found):
        return f"; {key}: {_range_text(kind, bounds)}" + (f" ({hint})" if hint else "")
    return f"; {key}: {hint}" if hint else ""
