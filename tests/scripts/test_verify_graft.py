"""scripts/verify_graft.py end to end on the tiny random-weight models: every graft restored in the separate
worker process is SHA-256-equal to its fresh reference, and the JSON report says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "verify_graft.py"

PROBLEMS = [
    {"id": "t-1", "problem": "What is $2 + 3$?", "solution": "Adding gives $2 + 3 = 5$, so \\boxed{5}.", "answer": "5"},
    {"id": "t-2", "problem": "Solve $4x = 20$.", "solution": "Divide both sides by 4: $x = 5$.", "answer": "5"},
    {"id": "t-3", "problem": "How many sides does a hexagon have?", "solution": "Six: \\boxed{6}.", "answer": "6"},
]


def _problems(tmp_path: Path) -> Path:
    path = tmp_path / "problems.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PROBLEMS), encoding="utf-8")
    return path


def _run(tmp_path: Path, model: str, samples: int, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / f"{model}.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--model", model, "--samples", str(samples), "--problems",
         str(_problems(tmp_path)), "--out", str(out), *extra],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, f"verify_graft exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc, json.loads(out.read_text())


def _assert_all_exact(proc: subprocess.CompletedProcess, report: dict, model: str, samples: int) -> None:
    assert report["samples"] == samples
    assert report["sha256_equal"] == samples
    assert report["kl_max"] == 0
    assert report["max_abs_diff"] == 0
    assert report["argmax_agreement"] == 1.0
    assert report["model"] == model
    assert report["worker_model_fingerprint"] == report["model_fingerprint"]
    assert report["worker_pid"] != report["parent_pid"]  # restored in another process
    assert len(report["per_sample"]) == samples
    for row in report["per_sample"]:
        assert row["equal"] and row["sha256_reference"] == row["sha256_graft"]
        assert row["kl"] == 0 and row["argmax_agreement"] == 1.0
        assert row["suffix_tokens"] == 16
    # the one-shot forward is reported, not hidden: present and small
    assert 0 <= report["oneshot_max_abs_diff"] < 1e-3
    assert report["determinism"]["threads"] >= 1 and report["environment"]["torch"]
    assert proc.stdout.strip().splitlines()[-1].startswith(f"graft: {samples}/{samples} SHA-256 equal, KL max 0")


def test_grafts_across_the_sliding_window_are_byte_identical_on_tiny_gemma3(tmp_path):
    proc, report = _run(tmp_path, "tiny-gemma3", 8)
    _assert_all_exact(proc, report, "tiny-gemma3", 8)
    assert report["sliding_window"] == 16
    lengths = [r["prefix_tokens"] for r in report["per_sample"]]
    assert {15, 16, 17} <= set(lengths)  # where the window-16 sliding layers start dropping positions
    assert min(lengths) < 16 < max(lengths)
    assert any(r["crosses_window"] for r in report["per_sample"])


def test_grafts_are_byte_identical_on_tiny_llama(tmp_path):
    proc, report = _run(tmp_path, "tiny-llama", 6, "--max-prefix-tokens", "60")
    _assert_all_exact(proc, report, "tiny-llama", 6)
    assert report["sliding_window"] is None
