"""The local servers the project starts (SeaweedFS for the S3 store, the MLflow server): tied to their parent's
life, and stopped as a whole process group, politely first."""

from __future__ import annotations

import os
import signal
import subprocess


def die_with_parent() -> None:
    """In a child before exec: ask Linux to SIGTERM it when its parent dies (PR_SET_PDEATHSIG), so a server
    started by a test or benchmark that is killed does not outlive it. A no-op elsewhere."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def stop_process_group(proc: subprocess.Popen | None, grace_s: float) -> None:
    """SIGTERM `proc`'s process group, SIGKILL it after `grace_s` seconds. Idempotent: a process that already
    exited (or a group already gone) is left alone."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(grace_s)
    except ProcessLookupError:
        pass
