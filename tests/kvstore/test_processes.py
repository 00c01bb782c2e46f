"""kvstore.LocalServer, the one lifecycle of the servers the project starts (LocalS3, MlflowServer, vLLM's serve.Server):
ready once its check answers, an early exit or a timeout raised with the end of its log, and stop ending the whole
process group (a server's own children too). Plain `python -c` servers: no S3, MLflow or vLLM needed."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from kvstore import LocalServer
from kvstore.errors import KVStoreError, StoreUnavailableError

# A "server" that starts a child of its own (as uvicorn's workers and vLLM's engine core do), writes the child's pid,
# then says it is up by creating a file; it ignores nothing, so SIGTERM to the group ends both.
SERVER = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open(sys.argv[1] + ".child", "w").write(str(child.pid))
print("starting", flush=True)
time.sleep(float(sys.argv[2]))
open(sys.argv[1], "w").write("up")
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return not (status.exists() and "State:\tZ" in status.read_text())  # a zombie is not running


def test_start_returns_once_ready_and_stop_ends_the_whole_group(tmp_path: Path) -> None:
    flag = tmp_path / "up"
    with LocalServer([sys.executable, "-c", SERVER, str(flag), "0.3"], tmp_path / "server.log",
                     ready=flag.exists, what="test server", timeout_s=30, poll_s=0.05, grace_s=5) as server:
        assert flag.exists() and server.started_s is not None and server.started_s >= 0.3
        child = int(Path(f"{flag}.child").read_text())
        assert _alive(server.proc.pid) and _alive(child)
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:  # the child is reparented: init reaps it
        time.sleep(0.05)
    assert server.proc.poll() is not None and not _alive(child)
    server.stop()  # idempotent


def test_a_server_that_exits_at_start_raises_the_callers_error_with_its_log(tmp_path: Path) -> None:
    code = "import sys; print('port 123 is not available'); sys.exit(3)"
    server = LocalServer([sys.executable, "-c", code], tmp_path / "server.log", ready=lambda: False,
                         what="test server", error=StoreUnavailableError, timeout_s=30, poll_s=0.05)
    with pytest.raises(StoreUnavailableError, match=r"(?s)test server exited with 3 at start; the end of "
                                                    r".*server\.log:\n.*port 123 is not available"):
        server.start()


def test_a_server_not_ready_in_time_is_stopped_and_the_error_says_why(tmp_path: Path) -> None:
    flag = tmp_path / "never"
    server = LocalServer([sys.executable, "-c", SERVER, str(flag), "600"], tmp_path / "server.log",
                         ready=flag.exists, what="test server", timeout_s=1, poll_s=0.05, grace_s=5,
                         not_ready=lambda: "no flag file")
    with pytest.raises(KVStoreError, match=r"(?s)test server not ready within 1 s \(no flag file\); the end of "
                                           r".*server\.log:\nstarting"):
        server.start()
    assert server.proc is not None and server.proc.poll() is not None  # stopped, not left running


def test_a_readiness_check_that_raises_stops_the_server_first(tmp_path: Path) -> None:
    flag = tmp_path / "never"

    def refuse() -> bool:
        raise StoreUnavailableError("could not bind its ports")

    server = LocalServer([sys.executable, "-c", SERVER, str(flag), "600"], tmp_path / "server.log", ready=refuse,
                         what="test server", timeout_s=30, poll_s=0.05, grace_s=5)
    with pytest.raises(StoreUnavailableError, match="could not bind its ports"):
        server.start()
    assert server.proc.poll() is not None
