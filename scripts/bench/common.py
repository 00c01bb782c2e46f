"""What the benchmarks share (scripts/bench/): the goals, timing with repeats and
their summary, the machine (CPU name, cores, load average at start and end), the token stream cut from real text,
and writing a summary JSON (`from scripts.bench.common import ...`)."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import time
from pathlib import Path

import psutil
import torch

from harness.experiments.text import problem_texts
from harness.record.manifest import code_state
from kvstore import Backend, Determinism, atomic_write
from kvstore.environment import current_environment

REPO = Path(__file__).resolve().parents[2]

GOALS = {"ttft_ratio": 100.0, "ttft_at": 2048, "restore_fraction": 0.8, "overhead": 0.05,
         "ceiling_fraction": 0.9, "ceiling_from": 512}
MAX_REPEAT_TOKENS = 2048  # above this the recompute side is timed fewer times (it takes tens of seconds)


def clock() -> float:
    return time.perf_counter()


def timed(fn, repeats: int) -> tuple[list[float], object]:
    out, result = [], None
    for _ in range(repeats):
        t0 = clock()
        result = fn()
        out.append(clock() - t0)
    return out, result


def argmax(logits: torch.Tensor) -> int:
    return int(torch.argmax(logits[0, -1]))


def machine_info(det: Determinism) -> dict:
    env = current_environment().to_dict()  # the compute environment an artifact records
    return {
        "cpu": env["device_name"], "cpu_isa": env.get("cpu_isa", env.get("aten_cpu_capability")),
        "logical_cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)), "torch_threads": torch.get_num_threads(),
        "dtype": det.dtype, "ram_bytes": psutil.virtual_memory().total, "platform": platform.platform(),
        "python": platform.python_version(), "torch": env["torch"], "transformers": env["transformers"],
        "loadavg_start": os.getloadavg(), "git_commit": code_state()["commit"] or "unknown",
    }


def token_stream(be: Backend, text_path: Path, need: int) -> tuple[list[int], dict]:
    """`need` token ids of real text: problem + solution of every row, concatenated, repeated as needed."""
    rows = problem_texts(text_path)
    text = "\n\n".join(t for _, t in rows)
    ids = be.encode(text)
    body = be.encode("\n\n" + text, add_bos=False)
    while len(ids) < need:
        ids += body
    info = {"source": str(text_path.relative_to(REPO) if text_path.is_relative_to(REPO) else text_path),
            "rows": len(rows), "text_sha256": hashlib.sha256(text.encode()).hexdigest(),
            "text_tokens": len(body), "repeated": need > len(body) + 1}
    return ids[:need], info


def stats(xs: list[float]) -> dict:
    """median, min, max and count of repeated measurements."""
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def load_note(start: tuple[float, ...], end: tuple[float, ...]) -> str | None:
    """A warning when the load average (1 min) exceeded the core count at the start or end of a run."""
    if max(start[0], end[0]) > (os.cpu_count() or 1):
        return ("load average above the core count during the run: other processes shared the CPUs, so absolute "
                "timings are noisy (ratios are timed side by side)")
    return None


def write_summary(path: Path, summary: dict) -> None:
    """The benchmark's JSON, written through the one atomic write."""
    atomic_write(path, (json.dumps(summary, indent=2, default=float) + "\n").encode())


def goal_row(rows: list[dict], n: int) -> dict:
    exact = [r for r in rows if r["tokens"] == n]
    return exact[0] if exact else max(rows, key=lambda r: r["tokens"])
