"""Exception family for the kvgraft harness.

Every error the harness raises on purpose derives from :class:`HarnessError`, so callers (the CLI, tests)
can catch the whole family in one place and report a clean message instead of a traceback
(:func:`exit_on_error` does that for every entry point).
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

__all__ = [
    "AnswerError",
    "ConfigError",
    "HarnessError",
    "LibraryError",
    "ManifestError",
    "ProblemError",
    "PairingError",
    "RunFolderError",
    "TrackingError",
    "exit_on_error",
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

    Raised by harness.run_folder.RunFolder when reading a folder, and so by the audit, rescore and log-run.
    Pass a complete run folder (one with manifest.json), restore the named file, or re-run.
    """


class PairingError(HarnessError):
    """A graft row differs from its in-context twin (harness/pairing.py): the graft did not carry exactly what
    reading the entry in context carries. Raised by the compare job after comparison.json is written, and reported
    by the rescore of a compare folder. A defect of the engine or the environment, never noise: re-run
    `make verify-graft` and report the rows named.
    """


def exit_on_error(main: Callable[P, T]) -> Callable[P, T]:
    """Wrap an entry point: a HarnessError or KVStoreError prints one `error: <message>` line (the message
    names the file, row or field and the fix) and exits with status 1, without a traceback. Set
    KVGRAFT_DEBUG=1 (or HYDRA_FULL_ERROR=1) to get the traceback instead."""
    from kvstore import KVStoreError

    @functools.wraps(main)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return main(*args, **kwargs)
        except (HarnessError, KVStoreError) as exc:
            if any(os.environ.get(v, "") not in ("", "0") for v in ("KVGRAFT_DEBUG", "HYDRA_FULL_ERROR")):
                raise
            print(f"error: {exc}", file=sys.stderr)
            raise SystemExit(1) from None

    return wrapper
