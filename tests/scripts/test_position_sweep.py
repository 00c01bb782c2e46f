"""scripts/position_sweep.py end to end on the tiny Gemma 3 model, default and batch-invariant mode: own position
(offset 0) is exact, the report and the plot are written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = "scripts.position_sweep"  # run as `python -m scripts.position_sweep` from the checkout


@pytest.mark.parametrize("mode", [[], ["--batch-invariant"]], ids=["default", "batch-invariant"])
@pytest.mark.slow
def test_position_sweep_offset_zero_is_exact_and_plot_is_written(tmp_path, mode):
    problems = tmp_path / "problems.jsonl"
    problems.write_text(json.dumps({"id": "t-1", "problem": "What is $6 \\times 7$?",
                                    "solution": "Six sevens are $42$, so \\boxed{42}.", "answer": "42"}) + "\n")
    out = tmp_path / "sweep"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(
        [sys.executable, "-m", SCRIPT, "--model", "tiny-gemma3", "--out", str(out), "--offsets", "1,7,100,4096",
         "--prefix-tokens", "8", "--suffix-tokens", "4", "--problems", str(problems), *mode],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    report = json.loads((out / "position_sweep.json").read_text())
    png = out / "position_sweep.png"
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert report["model"] == "tiny-gemma3" and report["model_fingerprint"]
    assert report["determinism"].get("batch_invariant", False) is bool(mode)  # the mode the sweep ran in, recorded
    assert [r["offset"] for r in report["offsets"]] == [0, 1, 7, 100, 4096]  # 0 is always included
    zero = report["offsets"][0]
    assert zero["sha256_equal"] and zero["max_abs_diff"] == 0 and zero["kl_max"] == 0
    assert zero["argmax_agreement"] == 1.0
    assert 0 in report["exact_offsets"] and report["offset0_exact"] is True
    for r in report["offsets"][1:]:  # re-rotation: reported as measured, and never far off
        assert r["max_abs_diff"] < 1e-3 and r["argmax_agreement"] == 1.0
    assert "position sweep: exact offsets" in proc.stdout.strip().splitlines()[-1]
