"""The benchmarks (scripts/bench/) as commands, end to end on the tiny random-weight model (smoke sizes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(script: str, *args: str) -> None:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run([sys.executable, "-m", f"scripts.bench.{script.removesuffix('.py')}", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


def test_bench_writes_summary_with_every_figure_and_plots(tmp_path):
    _run("run.py", "--model", "tiny-gemma3", "--sizes", "16,64", "--repeats", "2", "--quick", "--out", str(tmp_path))
    s = json.loads((tmp_path / "summary.json").read_text())
    assert {"machine", "model", "tokens", "settings", "figures", "goals", "runtime_s"} <= set(s)
    assert {"cpu", "logical_cores", "torch_threads", "dtype", "ram_bytes"} <= set(s["machine"])
    f = s["figures"]
    assert {"graft_vs_recompute", "restore_vs_read", "tier", "peer_llama_cpp", "harness_overhead"} <= set(f)
    rows = f["graft_vs_recompute"]["rows"]
    assert [r["tokens"] for r in rows] == [16, 64]
    for r in rows:
        assert {"median", "min", "max"} <= set(r["graft_s"]) and {"median", "min", "max"} <= set(r["recompute_s"])
        assert r["ratio"] > 0 and r["logits_identical"] is True
    for name in ("graft_vs_recompute", "restore_vs_read", "harness_overhead"):
        assert isinstance(f[name]["met"], bool) and f[name]["goal"] and f[name]["note"]
    assert all(r["ratio"] > 0 for r in f["restore_vs_read"]["rows"])
    assert f["tier"]["hits"] > 0 and isinstance(f["tier"]["pays"], bool)
    assert f["peer_llama_cpp"]["available"] is False and f["peer_llama_cpp"]["reason"]
    assert f["harness_overhead"]["same_tokens"] is True
    assert len(s["goals"]) == 9  # five of bench.py, two of the decode figures, two of the batch-invariant cost
    g = f["graft_vs_recompute"]
    assert isinstance(g["ceiling_met"], bool) and "64: " in g["ceiling_note"]
    for r in rows:  # read ahead, the graft needs only the rebuild and the forward
        assert r["graft_prefetched_s"]["median"] > 0 and r["prefetched_over_ceiling"] > 0
    assert f["batched_sampling"]["speedup"] > 0 and set(f["dtype"]) == {"float32", "bfloat16"}
    assert all(d["decode_tokens_per_s"] > 0 for d in f["dtype"].values())
    assert "llama_cpp" in f["decode_vs_llama_cpp"]
    for png in s["plots"]:
        assert (tmp_path / png).stat().st_size > 1000
    assert not (tmp_path / "_bench_store").exists()


@pytest.mark.slow
def test_bench_context_writes_the_curve(tmp_path):
    _run("context.py", "--model", "tiny-gemma3", "--artifacts", "200", "--total-tokens", "5000",
         "--checkpoints", "10,100,200", "--out", str(tmp_path))
    c = json.loads((tmp_path / "context.json").read_text())
    assert c["store"]["artifacts"] == 200 and c["store"]["tokens"] >= 5000
    assert c["model"]["random_weights"] is True
    assert [p["artifacts"] for p in c["checkpoints"]] == [10, 100, 200]
    for p in c["checkpoints"]:
        assert {"median", "min", "max"} <= set(p["lookup_s"]) and {"median", "min", "max"} <= set(p["restore_s"])
        assert p["peak_rss_bytes"] > 0
    assert isinstance(c["flat"], bool) and c["note"]
    assert (tmp_path / "context.png").stat().st_size > 1000


def test_bf16_restore_deposits_and_restores_in_bf16(tmp_path):
    _run("bf16_restore.py", "--model", "tiny-gemma3", "--sizes", "16,32,64", "--repeats", "2", "--max-tokens", "32",
         "--work", str(tmp_path / "s"), "--out", str(tmp_path / "bf16.json"))
    out = json.loads((tmp_path / "bf16.json").read_text())
    assert out["dtype"] == "bfloat16" and out["skipped_sizes"] == [64]
    assert [r["tokens"] for r in out["rows"]] == [16, 32]
    from harness.experiments.text import DEFAULT_PROBLEMS, joined_text
    from kvstore import LocalStore
    from kvstore.backends.transformers import TransformersBackend, load_frozen_model

    fm = load_frozen_model("tiny-gemma3")  # the same 32 tokens deposited in float32
    fp32 = LocalStore(tmp_path / "fp32")
    full = fp32.info(fp32.put(TransformersBackend.of(fm).deposit(fm.encode(joined_text(DEFAULT_PROBLEMS))[:32]))).size
    for r in out["rows"]:
        assert r["restore_s"]["n"] >= 5 and r["restore_s"]["median"] > 0
        assert r["bytes_per_token"] == r["artifact_bytes"] / r["tokens"]
    assert out["rows"][1]["artifact_bytes"] < full  # 2 bytes per value against 4 (the header is the same size)
    assert not (tmp_path / "s").exists()
