"""scripts/gpu_bench.py: the real-architecture configs build and describe their KV state, and the CPU dry run
(--device cpu --small, tiny sizes) proves exactness through a separate worker process and writes every figure.
No GPU here: the CUDA run itself is exercised only on a device machine."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gpu_bench():
    spec = importlib.util.spec_from_file_location("gpu_bench", ROOT / "scripts" / "gpu_bench.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_full_configs_have_their_families_layouts_and_kv_sizes(gpu_bench):
    from kvstore.model import layer_layout

    g1 = gpu_bench.model_config("gemma3-1b-class", small=False)
    lay = layer_layout(g1)
    assert len(lay) == 26 and [x["kind"] for x in lay].count("full") == 4
    assert {x["window"] for x in lay if x["kind"] == "sliding"} == {512}
    assert gpu_bench.kv_bytes(g1, 1) == 26 * 2 * 1 * 256 * 2  # bf16: 26 layers x K+V x 1 head x 256
    g12 = gpu_bench.model_config("gemma3-12b-class", small=False)
    full, sliding = 8, 40  # every 6th of 48 layers is full attention
    assert gpu_bench.kv_bytes(g12, 32768) == (full * 32768 + sliding * 1023) * 2 * 8 * 256 * 2  # ~2.5 GB
    llama = gpu_bench.model_config("llama3-8b-class", small=False)
    assert all(x["kind"] == "full" for x in layer_layout(llama)) and gpu_bench.kv_bytes(llama, 1) == 32 * 2 * 8 * 128 * 2


def test_the_cpu_dry_run_is_exact_in_a_separate_process_and_writes_every_figure(gpu_bench, tmp_path):
    out = tmp_path / "gpu.json"
    rc = gpu_bench.main(["--device", "cpu", "--small", "--models", "gemma3-1b-class", "--samples", "2",
                         "--sizes", "24", "--repeats", "1", "--threads", "1", "--energy-window-s", "0.01",
                         "--work", str(tmp_path), "--out", str(out)])
    assert rc == 0
    r = json.loads(out.read_text())
    assert r["device_kind"] == "cpu" and r["format"] == "kvgraft-kv/2" and r["skipped"] == []
    m = r["models"]["gemma3-1b-class"]
    assert m["layers"] == "SSSSSF"
    ex = m["exactness"]
    assert ex["samples"] == 2 and ex["equal"] == 2 and ex["all_equal"], ex["failures"]
    (row,) = m["ttft"]
    assert row["tokens"] == 24 and row["argmax_equal"]
    assert row["artifact_bytes"] > gpu_bench.kv_bytes(gpu_bench.model_config("gemma3-1b-class", True), 24)
    assert row["read_GBps"] > 0 and row["restore_GBps"] > 0 and row["ratio_ceiling"] > 0
    assert set(row["graft_parts_median_s"]) == {"get", "graft", "forward"}
    for side in ("recompute", "graft"):
        e = row["energy"][side]
        assert e["calls"] >= 1 and (e["joules_per_call"] is None) == e["status"].startswith("unavailable")
    assert list(tmp_path.glob("kvgraft-gpu-bench-*")) == []  # temporary stores removed
