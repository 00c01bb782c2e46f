"""A row's cpu_s counts the harness's process and its child processes (harness.run.loop.cpu_seconds): an engine that
computes in a child of its own (vLLM's engine core) is not left out of the run's CPU figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# Measured in a fresh interpreter whose only child is the busy one: pytest's own children (the background vLLM
# cases) would count too, and their seconds are not this test's.
PROBE = """
import json, subprocess, sys, time
from harness.run.loop import cpu_seconds
before, own_before = cpu_seconds(), time.process_time()
child = subprocess.Popen([sys.executable, "-c", "import time\\nt = time.process_time()\\n"
                          "while time.process_time() - t < 1.0: pass\\ntime.sleep(30)"])
try:
    time.sleep(2.5)  # the child burns 1 s of CPU, then sleeps; this process mostly sleeps
    used = cpu_seconds() - before
    own = time.process_time() - own_before
finally:
    child.kill()
    child.wait()
print(json.dumps({"used": used, "own": own}))
"""


def test_a_busy_child_process_counts_in_cpu_seconds() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["used"] >= 0.9, f"{got['used']:.2f} CPU s counted; the child alone used about 1 s"
    assert got["used"] <= got["own"] + 1.5, got  # no more than the probe and its child (about 1 s, polling) used
