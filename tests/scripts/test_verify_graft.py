"""scripts/verify_graft.py end to end on the tiny random-weight models: every graft restored in the separate
worker process is SHA-256-equal to its fresh reference, and the JSON report says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = "scripts.verify_graft"  # run as `python -m scripts.verify_graft` from the checkout

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
        [sys.executable, "-m", SCRIPT, "--model", model, "--samples", str(samples), "--problems",
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


@pytest.mark.slow
def test_grafts_are_byte_identical_on_tiny_llama(tmp_path):
    proc, report = _run(tmp_path, "tiny-llama", 6, "--max-prefix-tokens", "60")
    _assert_all_exact(proc, report, "tiny-llama", 6)
    assert report["sliding_window"] is None


# ---- architectures (issue 20): refusals are one line and non-zero; the attention implementation is settable


def _run_any(tmp_path: Path, model: str, *extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "KVGRAFT_DEBUG"}
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return subprocess.run(
        [sys.executable, "-m", SCRIPT, "--model", model, "--samples", "2", "--problems", str(_problems(tmp_path)),
         "--out", str(tmp_path / "report.json"), "--max-prefix-tokens", "30", "--suffix-tokens", "16", *extra],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )


@pytest.mark.slow
def test_an_architecture_that_needs_eager_is_refused_in_one_line_then_grafts_exactly_with_the_flag(tmp_path):
    from kvstore.backends.transformers.tiny import save_architecture

    folder = str(save_architecture("gemma2", tmp_path / "gemma2"))
    proc = _run_any(tmp_path, folder)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    [line] = proc.stderr.strip().splitlines()[-1:]
    assert line.startswith("verify_graft: error: ") and "--attn-implementation eager" in line
    assert not (tmp_path / "report.json").exists()
    proc = _run_any(tmp_path, folder, "--attn-implementation", "eager")
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["sha256_equal"] == 2 and report["determinism"]["attn_implementation"] == "eager"
    assert proc.stdout.strip().splitlines()[-1].startswith("graft: 2/2 SHA-256 equal")


@pytest.mark.slow
def test_an_architecture_whose_cache_cannot_be_captured_is_refused_in_one_line(tmp_path):
    from kvstore.backends.transformers.tiny import save_architecture

    proc = _run_any(tmp_path, str(save_architecture("jamba", tmp_path / "jamba")))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    lines = [x for x in proc.stderr.strip().splitlines() if x.startswith("verify_graft:")]
    assert len(lines) == 1 and proc.stderr.strip().splitlines()[-1] == lines[0]
    assert "cannot capture layer 0 (linear, LinearAttentionLayer)" in lines[0] and "conv_states[0]" in lines[0]
