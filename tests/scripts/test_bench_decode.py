"""scripts/bench/decode.py as a command, on the tiny random-weight model at smoke sizes: every figure present
and sane."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bench_decode_reports_every_figure_and_writes_json(tmp_path):
    out = tmp_path / "decode.json"
    proc = subprocess.run([
        sys.executable, "-m", "scripts.bench.decode",
        "--model", "tiny-gemma3", "--problems", "2", "--n", "3", "--max-new-tokens", "6",
        "--prefill-tokens", "40", "--decode-tokens", "6", "--long-tokens", "128", "--out", str(out),
    ], capture_output=True, text=True, timeout=600, cwd=ROOT, env=dict(os.environ, HF_HUB_OFFLINE="1"), check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert json.loads(proc.stdout) == result
    b = result["batched_sampling"]
    assert (b["problems"], b["n"], b["max_new_tokens"], b["decoding"]) == (2, 3, 6, "sample")
    assert b["tokens_per_s_bs1"] > 0 and b["tokens_per_s_batched"] > 0
    # speedup is the unrounded ratio rounded; recomputed from the rounded rates it may differ in the last digit
    assert b["speedup"] == pytest.approx(b["tokens_per_s_batched"] / b["tokens_per_s_bs1"], abs=0.011)
    assert isinstance(b["met"], bool) and b["goal"] == 4.0
    assert set(result["dtype"]) == {"float32", "bfloat16"}
    for d in result["dtype"].values():
        assert d["prefill_tokens"] == 40 and d["prefill_tokens_per_s"] > 0
        assert d["decode_tokens"] == 6 and d["decode_tokens_per_s"] > 0  # eos ignored: a fixed length
    long = result["long_budget"]
    assert (long["tokens"], long["stop_reason"], long["sliding_window"]) == (128, "length", 16)
    assert len(long["rss_mb_every_64_tokens"]) == 2
    try:
        import llama_cpp  # noqa: F401

        assert isinstance(result["llama_cpp"], str)  # no GGUF for the tiny model
    except ImportError:
        assert result["llama_cpp"] == "not installed"
    assert result["harness_vs_llama_cpp"] is None
    assert result["machine"]["torch_threads"] == 2
