"""The local servers the project starts (SeaweedFS for the S3 store, the MLflow tracking server, vLLM's OpenAI
server), one lifecycle for all of them: `LocalServer` starts a command in its own process group, tied to its parent's
life, with its output appended to a log; polls until the server answers; stops the whole group, politely first.

    with LocalServer(argv, "server.log", ready=answers, what="mlflow server", error=TrackingError) as server:
        ...                                   # server.started_s: how long it took to answer
    # stopped: SIGTERM to its process group, SIGKILL to what is left after `grace_s`
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from kvstore.errors import KVStoreError


def die_with_parent() -> None:
    """In a child before exec: ask Linux to SIGTERM it when its parent dies (PR_SET_PDEATHSIG), so a server
    started by a test or benchmark that is killed does not outlive it. A no-op elsewhere."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _group_alive(proc: subprocess.Popen) -> bool:
    """Whether any process of `proc`'s group is left (the leader reaped first, so a zombie leader does not count)."""
    proc.poll()
    try:
        os.killpg(proc.pid, 0)
    except ProcessLookupError:
        return False
    return True


def stop_process_group(proc: subprocess.Popen | None, grace_s: float) -> None:
    """SIGTERM `proc`'s process group, wait up to `grace_s` seconds for the whole group (a server's workers, vLLM's
    engine core) to exit, then SIGKILL what is left. Idempotent: a group already gone is left alone."""
    if proc is None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        proc.poll()
        return
    deadline = time.monotonic() + grace_s
    while _group_alive(proc) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _group_alive(proc):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        pass


class LocalServer:
    """One server process on this machine: `argv` started in its own process group (SIGTERMed when this process
    dies), stdout and stderr appended to `log`, polled every `poll_s` until `ready()` is true. A server that exits
    first, or is not ready within `timeout_s`, raises `error` (a class taking one message) naming `what` and ending
    with the end of its log; `ready` may raise `error` itself (a failure it recognises early), and the server is then
    stopped before the error propagates. `stop` (and leaving the `with`) ends the whole group."""

    def __init__(self, argv: list[str], log: str | os.PathLike, *, ready: Callable[[], bool], what: str,
                 error: type[Exception] = KVStoreError, timeout_s: float = 60.0, poll_s: float = 0.25,
                 grace_s: float = 10.0, env: Mapping[str, str] | None = None, cwd: str | os.PathLike | None = None,
                 not_ready: Callable[[], str] = lambda: "") -> None:
        self.argv, self.log = list(argv), Path(log)
        self.ready, self.what, self.error = ready, what, error
        self.timeout_s, self.poll_s, self.grace_s = timeout_s, poll_s, grace_s
        self.env, self.cwd, self.not_ready = (dict(env) if env is not None else None), cwd, not_ready
        self.proc: subprocess.Popen | None = None
        self.started_s: float | None = None

    def start(self) -> LocalServer:
        t0 = time.monotonic()
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=self.env, cwd=self.cwd, start_new_session=True,
                                         preexec_fn=die_with_parent)
        try:
            while time.monotonic() - t0 < self.timeout_s:
                if self.proc.poll() is not None:
                    raise self.error(f"{self.what} exited with {self.proc.returncode} at start; the end of "
                                     f"{self.log}:\n{self.tail()}")
                if self.ready():
                    self.started_s = time.monotonic() - t0
                    return self
                time.sleep(self.poll_s)
            why = self.not_ready()
            raise self.error(f"{self.what} not ready within {self.timeout_s:.0f} s{f' ({why})' if why else ''}; "
                             f"the end of {self.log}:\n{self.tail()}")
        except BaseException:
            self.stop()
            raise

    def tail(self, lines: int = 15) -> str:
        """The last lines the server wrote (its log outlives a test's temporary folder only as this text)."""
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError as e:
            return f"(no log: {e})"

    def stop(self) -> None:
        """SIGTERM the server's process group, SIGKILL what is left after `grace_s`. Idempotent."""
        stop_process_group(self.proc, self.grace_s)

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
