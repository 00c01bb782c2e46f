"""The terminal: text that comes from data (a problem id, a run folder's name, a finding quoting a row, a label given on
the command line) is shown, never obeyed. A forged problem file can carry an ANSI escape in an id (`\\x1b[2J` clears
the screen, `\\x1b[8m` hides what follows); Rich passes ESC through untouched, and so does print().

    from harness.terminal import console, plain
    console().print(f"problem {problem.id}: ...")   # every str Rich renders (print, table cells, titles) escaped
    print(plain(f"error: {exc}"))                    # plain print(): escape it at the call

`console(**kwargs)` is a `rich.console.Console` whose every rendered string has its control characters written as
escapes (`\\x1b`) before Rich reads its markup, so the project's own markup (`[red]...[/]`) still styles and Rich's
own escape codes still colour; every Rich console in harness/ and scripts/ comes from here
(tests/harness/test_terminal_escapes.py checks that none is built another way). `plain` is harness.errors.plain,
which `exit_on_error` applies to every error line. Warnings shown by Python's `warnings` module go through
`plain` as well once an entry point wrapped by `exit_on_error` runs (`escape_warnings`).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from harness.errors import plain

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["console", "escape_warnings", "plain"]

_CONSOLE_CLASS: type | None = None


def _console_class() -> type:
    """The Console subclass, built on first use (rich is imported lazily: `make rescore` starts without it)."""
    global _CONSOLE_CLASS
    if _CONSOLE_CLASS is None:
        from rich.console import Console

        class PlainConsole(Console):
            """A Console that escapes control characters in every string it renders (module docstring)."""

            def render_str(self, text: str, **kwargs: Any) -> Any:
                return super().render_str(plain(text), **kwargs)

        _CONSOLE_CLASS = PlainConsole
    return _CONSOLE_CLASS


def console(**kwargs: Any) -> Console:
    """A `rich.console.Console(**kwargs)` that shows control characters in what it renders as escapes."""
    return _console_class()(**kwargs)


_formatwarning = warnings.formatwarning


def _plain_formatwarning(message: Any, category: type[Warning], filename: str, lineno: int,
                         line: str | None = None) -> str:
    return plain(_formatwarning(message, category, filename, lineno, line))


def escape_warnings() -> None:
    """Show every later warning (`warnings.warn`: a pending MLflow log naming a folder, a trace not logged) with its
    control characters escaped (idempotent)."""
    warnings.formatwarning = _plain_formatwarning  # type: ignore[assignment]
