"""`make rescore RUN=runs/multirun/<stamp>` re-checks every job of a sweep, one line per job."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType


def _rescore(repo_root: Path, folder: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(repo_root / "scripts" / "rescore.py"), str(folder)],
                          capture_output=True, text=True, timeout=120, check=False)


def test_a_sweep_folder_rechecks_every_job_and_names_a_tampered_one(tmp_path: Path, fakerun: ModuleType,
                                                                    repo_root: Path) -> None:
    sweep = tmp_path / "multirun" / "2026-12-01_11-00-00"
    jobs = [fakerun.build_fake_run(sweep / f"{i}_baseline_decoding.max_new_tokens={n}") for i, n in ((0, 3), (1, 5))]
    done = _rescore(repo_root, sweep)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "OK  0_baseline_decoding.max_new_tokens=3" in done.stdout and "all 2 jobs re-check" in done.stdout

    rows = (jobs[1] / "outputs.jsonl").read_text().splitlines()
    first = json.loads(rows[0])
    first["completion"] = "So the answer is \\boxed{8}."
    (jobs[1] / "outputs.jsonl").write_text("\n".join([json.dumps(first), *rows[1:]]) + "\n")
    tampered = _rescore(repo_root, sweep)
    assert tampered.returncode == 1
    assert "FAILED  1_baseline_decoding.max_new_tokens=5" in tampered.stdout
    assert "1_baseline_decoding.max_new_tokens=5: " in tampered.stdout  # each finding names its job

    (tmp_path / "empty").mkdir()
    empty = _rescore(repo_root, tmp_path / "empty")
    assert empty.returncode == 2 and "no run folder" in empty.stderr
