"""The server's processes end with it, whatever signal ends it (issue 60, item 6): vLLM's API server starts its
EngineCore (and workers) as child processes, which a SIGKILL of the server used to leave running, re-parented to
init (6.8 GB resident).

    sys.exit(supervise([python, "-m", server, ...]))    # what `python -m harness.serve` runs instead of exec

The supervisor (this process) marks itself a child subreaper (prctl PR_SET_CHILD_SUBREAPER), so the server's orphans
become its children; it starts the server with a parent-death signal (PR_SET_PDEATHSIG: SIGTERM), so a SIGKILL of the
supervisor stops the server, which stops its engine; it forwards SIGTERM, SIGINT and SIGHUP to the server; when the
server ends (any signal, SIGKILL included) it ends every process left under it (SIGTERM, then SIGKILL after GRACE_S)
and exits with the server's status. Linux only (prctl); elsewhere the server is exec'd as before.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

__all__ = ["GRACE_S", "supervise"]

GRACE_S = 10.0
_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER = 1, 36


def _prctl(option: int, value: int) -> bool:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _children(pid: int) -> list[int]:
    """The live processes whose parent is `pid` (from /proc)."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", encoding="utf-8", errors="replace") as f:
                    stat = f.read()
            except OSError:
                continue
            fields = stat[stat.rfind(")") + 2:].split()
            if len(fields) > 1 and int(fields[1]) == pid and fields[0] != "Z":
                out.append(int(name))
    return out


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def end_descendants(grace_s: float = GRACE_S) -> int:
    """SIGTERM every process left under this one (its own and the orphans it adopted), SIGKILL what is left after
    `grace_s`; how many there were."""
    me, seen = os.getpid(), set()
    deadline = time.monotonic() + grace_s
    sig = signal.SIGTERM
    while True:
        _reap()
        left = _children(me)
        if not left:
            return len(seen)
        if time.monotonic() > deadline:
            sig = signal.SIGKILL
        for pid in left:
            seen.add(pid)
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        time.sleep(0.2)


def supervise(command: list[str]) -> int:
    """Run `command` (the server) under this process as the module docstring says; its exit status (128 + the
    signal when a signal ended it)."""
    if not sys.platform.startswith("linux") or not _prctl(_PR_SET_CHILD_SUBREAPER, 1):
        os.execv(command[0], command)
    parent = os.getpid()
    child = os.fork()
    if child == 0:
        _prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))
        if os.getppid() != parent:  # the supervisor died before the signal was armed
            os._exit(1)
        os.execv(command[0], command)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, _f: os.kill(child, s))
    while True:
        try:
            pid, status = os.waitpid(child, 0)
            break
        except InterruptedError:
            continue
    end_descendants()
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)
