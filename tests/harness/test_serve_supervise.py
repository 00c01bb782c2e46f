"""The server's processes end with it (issue 60, item 6): a SIGKILL of the server leaves no engine behind
(harness/serve/supervise.py), measured here on a stand-in server that starts an 'engine' child, as vLLM's API
server starts its EngineCore."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SERVER = """
import subprocess, sys, time, os, signal
engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
signal.signal(signal.SIGTERM, lambda *_: (engine.terminate(), sys.exit(0)))  # as vLLM's server ends its engine
open(sys.argv[1], "w").write(f"{os.getpid()} {engine.pid}")
time.sleep(120)
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl subreaper and parent-death signal: Linux only")
@pytest.mark.parametrize("victim", ["server", "supervisor"])
def test_a_sigkill_leaves_no_engine_behind(tmp_path, victim):
    pids = tmp_path / "pids"
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    sup = subprocess.Popen([sys.executable, "-c", "import sys; from harness.serve.supervise import supervise; "
                            f"sys.exit(supervise([sys.executable, {str(script)!r}, {str(pids)!r}]))"],
                           cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        for _ in range(100):
            if pids.exists() and len(pids.read_text().split()) == 2:
                break
            time.sleep(0.1)
        server, engine = map(int, pids.read_text().split())
        os.kill(server if victim == "server" else sup.pid, signal.SIGKILL)
        t0 = time.monotonic()
        while alive(engine) and time.monotonic() - t0 < 20:
            time.sleep(0.1)
        assert not alive(engine) and (victim == "supervisor" or not alive(server))
        if victim == "server":
            assert sup.wait(20) == 128 + signal.SIGKILL
    finally:
        for pid in (sup.pid, *(map(int, pids.read_text().split()) if pids.exists() else ())):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
