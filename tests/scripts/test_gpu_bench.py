"""scripts/gpu_bench.py as a CLI: the CPU dry run (--device cpu --small, tiny sizes) proves exactness in bf16 and
fp32 through kvstore's second-process restorer and prints and writes every figure the GPU run gives, marked [cpu]. No GPU here: the CUDA run itself is exercised only
on a device machine. (The configs themselves: tests/kvstore/test_random_models.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvstore.testing.random_models import kv_bytes, model_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_cpu_dry_run_is_exact_in_a_separate_process_and_writes_every_figure(tmp_path):
    out = tmp_path / "gpu.json"
    proc = subprocess.run([sys.executable, "-m", "scripts.gpu_bench", "--device", "cpu", "--small",
                           "--models", "gemma3-1b-class", "--samples", "2", "--sizes", "24", "--repeats", "1",
                           "--threads", "1", "--energy-window-s", "0.01", "--work", str(tmp_path), "--out", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT, check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})  # this checkout's code
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()[:-1]  # every figure line is marked with the device kind; the last names the file
    assert lines and all(line.startswith("[cpu] ") for line in lines), proc.stdout
    printed = "\n".join(lines)
    assert "exact, restored in another process: bfloat16 2/2, float32 2/2" in printed
    for figure in ("TTFT graft", "recompute", "verified restore", "vs raw read", "energy per graft", "per recompute",
                   "random weights", "recorded, not required"):
        assert figure in printed, figure
    r = json.loads(out.read_text())
    assert r["device_kind"] == "cpu" and r["format"] == "kvgraft-kv/2" and r["skipped"] == []
    assert r["environment"]["torch"] == r["torch"] and r["transformers"]
    m = r["models"]["gemma3-1b-class"]
    assert m["layers"] == "SSSSSF"
    for dtype in ("bfloat16", "float32"):
        ex = m["exactness"][dtype]
        assert ex["samples"] == 2 and ex["equal"] == 2 and ex["all_equal"], ex["failures"]
    (row,) = m["ttft"]
    assert row["tokens"] == 24 and row["argmax_equal"]
    assert row["artifact_bytes"] > kv_bytes(model_config("gemma3-1b-class", True), 24)
    assert row["read_GBps"] > 0 and row["restore_GBps"] > 0 and row["ratio_ceiling"] > 0
    assert set(row["graft_parts_median_s"]) == {"get", "graft", "forward"}
    for side in ("recompute", "graft"):
        e = row["energy"][side]
        assert e["calls"] >= 1 and (e["joules_per_call"] is None) == e["status"].startswith("unavailable")
        assert e["kind"] in ("measured", "estimated", "unavailable") and e["status"].startswith(e["kind"] + ":")
    assert list(tmp_path.glob("kvgraft-gpu-bench-*")) == []  # temporary stores removed


def test_the_paged_layout_probe_runs_on_device_tensors_and_round_trips_every_writer():
    # issue 59: what gpu_bench runs first when a GPU is lent, here with CPU tensors (the probe is device-agnostic)
    from scripts.gpu_bench import paged_probe

    r = paged_probe("cpu", 2, 32, 64, 96)
    assert set(r["writers"]) >= {"flash-HND", "flash-NHD", "amx"}
    for name, w in r["writers"].items():
        assert "error" not in w and w["round_trip"], (name, w)
        assert w["read_GBps"] > 0 and w["write_GBps"] > 0 and w["probe_s"] > 0
    assert r["writers"]["flash-NHD"]["fast_path"] and not r["writers"]["amx"]["fast_path"]
    assert r["writers"]["amx"]["layout"].startswith("cpu_attn/amx[")
