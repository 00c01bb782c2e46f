"""A row's cpu_s counts the harness's process and its child processes (harness.run.loop.cpu_seconds): an engine that
computes in a child of its own (vLLM's engine core) is not left out of the run's CPU figures."""

from __future__ import annotations

import subprocess
import sys
import time

from harness.run.loop import cpu_seconds


def test_a_busy_child_process_counts_in_cpu_seconds() -> None:
    before, own_before = cpu_seconds(), time.process_time()
    child = subprocess.Popen([sys.executable, "-c", "import time\nt = time.process_time()\n"
                              "while time.process_time() - t < 1.0: pass\ntime.sleep(30)"])
    try:
        time.sleep(2.5)  # the child burns 1 s of CPU, then sleeps; this process mostly sleeps
        used = cpu_seconds() - before
        own = time.process_time() - own_before
    finally:
        child.kill()
        child.wait()
    assert used >= 0.9, f"{used:.2f} CPU s counted; the child alone used about 1 s"
    assert used <= own + 1.5  # and no more than this process and the child (about 1 s, polling) used
