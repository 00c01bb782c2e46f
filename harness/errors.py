"""Exception family for the kvgraft harness.

Every error the harness raises on purpose derives from :class:`HarnessError`, so callers (the CLI, tests)
can catch the whole family in one place and report a clean message instead of a traceback
(:func:`exit_on_error` does that for every entry point).
"""

from __future__ import annotations

import errno
import functools
import os
import signal
import sys
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

__all__ = [
    "plain",
    "AnswerError",
    "ConfigError",
    "HarnessError",
    "LibraryError",
    "ManifestError",
    "PairingError",
    "ProblemError",
    "RunFolderError",
    "RunInterrupted",
    "StorageError",
    "Terminated",
    "TrackingError",
    "console",
    "escape_warnings",
    "exit_on_error",
    "storage_error",
]


class HarnessError(Exception):
    """Base class of all deliberate harness errors; the message says what was wrong and how to fix it."""


class ProblemError(HarnessError):
    """A problem file, row or field is malformed or missing.

    Raised while loading problem sets. Fix the named file/row/field (or point the run at another
    problem set); the run cannot continue with partial problem data.
    """


class AnswerError(HarnessError):
    """A gold answer is not a valid AIME answer (an integer 0..999).

    Raised by gold-answer parsing. Correct the gold value in the problem data; model outputs never
    raise this (an unparsable model answer just scores as incorrect).
    """


class ConfigError(HarnessError):
    """The experiment configuration is invalid or inconsistent.

    Raised before any model work starts. Fix the named config key or override and rerun.
    """


class ManifestError(HarnessError):
    """A run's recorded hashes do not match the current inputs (problems, config, code or outputs).

    Raised when resuming or verifying a run. Start a fresh run directory, or restore the inputs the
    manifest was written for; do not mix outputs from different inputs.
    """


class TrackingError(HarnessError):
    """Experiment tracking (MLflow) is unavailable or failed.

    Raised when tracking was requested but cannot be used. Install/configure MLflow, fix the tracking
    URI, or disable tracking for the run.
    """


class LibraryError(HarnessError):
    """The solution library is missing, corrupt or inconsistent.

    Raised when reading or writing the library. Rebuild the library or point the run at a valid one.
    """


class RunFolderError(HarnessError):
    """A run folder is missing a file, or a file cannot be parsed (harness/RUN_FORMAT.md).

    Raised by harness.record.folder.RunFolder when reading a folder, and so by the audit, rescore and log-run.
    Pass a complete run folder (one with manifest.json), restore the named file, or re-run.
    """


class StorageError(HarnessError):
    """The file system refused a write the harness needs: the disk is full (ENOSPC, EDQUOT) or the folder is
    read-only (EROFS, EACCES). Raised by harness.record.folder while a run folder is created or written; the message
    names the path. Free space, or point `runs_dir=` at a writable folder; rows already written stay in
    outputs.partial.jsonl, so re-running the same command resumes the run.
    """


class RunInterrupted(HarnessError):
    """A run was stopped by Ctrl-C (SIGINT) or SIGTERM. Raised by harness.run.loop after the rows so far are on disk
    (outputs.partial.jsonl) and the folder is unlocked: re-run the same command to resume, `run.fresh=true` to
    start over. `exit_code` is 128 + the signal number, as a shell reports a process the signal killed.
    """

    def __init__(self, message: str, signum: int = signal.SIGINT) -> None:
        super().__init__(message)
        self.exit_code = 128 + int(signum)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is (as Ctrl-C raises KeyboardInterrupt) by the handler every entry point
    installs (`exit_on_error`): a run stops between rows exactly as it does on Ctrl-C. Not a HarnessError, so no
    `except HarnessError` (or `except Exception`) swallows it."""


_DISK_FULL = {errno.ENOSPC, errno.EDQUOT}
_READ_ONLY = {errno.EROFS, errno.EACCES, errno.EPERM}


def storage_error(exc: OSError, path: str | Path, doing: str) -> HarnessError | None:
    """The one-line StorageError for a full disk or a read-only folder met while `doing` (e.g. "writing the run
    folder") at `path` (the file named by the OSError when it names one); None for any other OSError."""
    where = exc.filename or path
    if exc.errno in _DISK_FULL:
        return StorageError(
            f"{where}: no space left on the device ({errno.errorcode[exc.errno]}) while {doing}; free space there or "
            "point runs_dir= at another disk, then re-run the same command (the rows written so far are kept)"
        )
    if exc.errno in _READ_ONLY:
        return StorageError(
            f"{where}: the folder is read-only ({errno.errorcode[exc.errno]}) while {doing}; make it writable or "
            "point runs_dir= at a writable folder"
        )
    return None


class PairingError(HarnessError):
    """A graft row differs from its in-context twin (harness/compare/pairing.py): the graft did not carry exactly what
    reading the entry in context carries. Raised by the compare job after comparison.json is written, and reported
    by the rescore of a compare folder. A defect of the engine or the environment, never noise: re-run
    `make verify-graft` and report the rows named.
    """


def _on_sigterm(signum: int, frame: object) -> None:
    raise Terminated()


def debugging() -> bool:
    """KVGRAFT_DEBUG=1 or HYDRA_FULL_ERROR=1: errors keep their traceback."""
    return any(os.environ.get(v, "") not in ("", "0") for v in ("KVGRAFT_DEBUG", "HYDRA_FULL_ERROR"))


def plain(text: str) -> str:
    """`text` with its control characters (an ANSI escape in a problem id from a forged file) written as escapes
    (`\\x1b`), never obeyed by the terminal; newlines kept (a message may have more than one line)."""
    return "".join(c if c.isprintable() or c == "\n" else c.encode("unicode_escape").decode("ascii") for c in text)


_CONSOLE_CLASS: type | None = None


def console(**kwargs: Any) -> Any:
    """A `rich.console.Console(**kwargs)` whose every rendered string (print, table cells, titles) has its control
    characters written as escapes (`plain`) before Rich reads its markup: text that comes from data (a problem id, a
    run folder's name, a finding quoting a row, a label from the command line) is shown, never obeyed by the terminal
    (Rich passes ESC through untouched; `\\x1b[2J` clears the screen, `\\x1b[8m` hides what follows). The project's own
    markup still styles and Rich's own escape codes still colour. Every Rich console in harness/ and scripts/ comes
    from here (tests/harness/test_terminal_escapes.py checks that none is built another way); plain print() calls
    escape data with `plain` at the call. rich is imported on first use (`make rescore` starts without it)."""
    global _CONSOLE_CLASS
    if _CONSOLE_CLASS is None:
        from rich.console import Console

        class PlainConsole(Console):
            def render_str(self, text: str, **kw: Any) -> Any:
                return super().render_str(plain(text), **kw)

        _CONSOLE_CLASS = PlainConsole
    return _CONSOLE_CLASS(**kwargs)


_formatwarning = warnings.formatwarning


def _plain_formatwarning(message: Any, category: type[Warning], filename: str, lineno: int,
                         line: str | None = None) -> str:
    return plain(_formatwarning(message, category, filename, lineno, line))


def escape_warnings() -> None:
    """Show every later warning (`warnings.warn`: a pending MLflow log naming a folder, a trace not logged) with its
    control characters escaped, as `plain` writes them (idempotent; `exit_on_error` calls it)."""
    warnings.formatwarning = _plain_formatwarning  # type: ignore[assignment]


def exit_on_error(main: Callable[P, T]) -> Callable[P, T]:
    """Wrap an entry point: a HarnessError or KVStoreError prints one `error: <message>` line (the message
    names the file, row or field and the fix) and exits with status 1, without a traceback; an interrupted run
    (Ctrl-C, or SIGTERM, which the wrapper turns into `Terminated`) prints one `stopped:` line and exits with
    128 + the signal number. Set KVGRAFT_DEBUG=1 (or HYDRA_FULL_ERROR=1) to get the traceback instead."""
    from kvstore import KVStoreError

    @functools.wraps(main)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        escape_warnings()  # a warning quoting a folder or a row is shown escaped too (as `console` shows data)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, _on_sigterm)
        try:
            return main(*args, **kwargs)
        except RunInterrupted as exc:
            if debugging():
                raise
            print(f"stopped: {plain(str(exc))}", file=sys.stderr)
            raise SystemExit(exc.exit_code) from None
        except (HarnessError, KVStoreError) as exc:
            if debugging():
                raise
            print(f"error: {plain(str(exc))}", file=sys.stderr)
            raise SystemExit(1) from None
        except KeyboardInterrupt as exc:  # outside a run's row loop (loading, composing): nothing was written
            if debugging():
                raise
            signum = signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT
            print(f"stopped: {signal.Signals(signum).name} (no run was writing rows; re-run the same command)",
                  file=sys.stderr)
            raise SystemExit(128 + int(signum)) from None

    return wrapper
