"""Prompt rendering. Templates use `{field}` placeholders replaced literally (LaTeX braces in problem text
and in templates need no escaping). The same query template is used in every condition."""

from __future__ import annotations

import re

_FIELD = re.compile(r"\{(problem|solution|answer|id)\}")


def render(template: str, **fields: str) -> str:
    """Replace {problem}, {solution}, {answer}, {id} in `template`; other braces are left as they are."""

    def sub(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in fields or fields[name] is None:
            raise KeyError(f"template needs {{{name}}} but no value was given")
        return str(fields[name])

    return _FIELD.sub(sub, template)
