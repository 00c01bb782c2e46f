"""`python -m harness -m` sweeps: every job gets its own run folder with a manifest that re-scores, and all
jobs land in one MLflow sqlite store."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from harness.record.audit import audit
from harness.record.folder import RunFolder

REPO = Path(__file__).resolve().parents[2]


def test_a_multirun_sweep_writes_one_verified_run_folder_per_job(tmp_path):
    cmd = [sys.executable, "-m", "harness", "-m", "model=tiny_gemma3", "dataset.limit=2",
           "decoding.max_new_tokens=3,5", f"runs_dir={tmp_path}/runs", f"tracking.uri=sqlite:///{tmp_path}/mlflow.db"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    subprocess.run(cmd, cwd=REPO, env=env, check=True, capture_output=True, text=True, timeout=600)
    jobs = sorted(p.parent for p in (tmp_path / "runs" / "multirun").glob("*/*/manifest.json"))
    assert [p.name for p in jobs] == ["0_baseline_dataset.limit=2,decoding.max_new_tokens=3,model=tiny_gemma3",
                                      "1_baseline_dataset.limit=2,decoding.max_new_tokens=5,model=tiny_gemma3"]
    for job in jobs:
        assert audit(RunFolder(job)).ok
        assert "run_id" in (job / "tracking.json").read_text()
