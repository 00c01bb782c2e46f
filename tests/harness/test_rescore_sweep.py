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


MULTIRUN_YAML = """hydra:
  sweeper:
    params: null
  overrides:
    hydra: [hydra.mode=MULTIRUN]
    task: [model=fake, 'decoding.max_new_tokens=3,5', 'condition=baseline,graft', tracking=off]
"""


def test_a_killed_sweep_names_the_jobs_multirun_yaml_lists_that_are_missing(tmp_path: Path, fakerun: ModuleType,
                                                                           repo_root: Path) -> None:
    """Issue 31, finding 6: 1 of 4 jobs present re-checked "all 1 jobs re-check"; now the 3 others are named."""
    sweep = tmp_path / "multirun" / "2026-12-01_11-00-00"
    fakerun.build_fake_run(sweep / "0_baseline_decoding.max_new_tokens=3")
    (sweep / "multirun.yaml").write_text(MULTIRUN_YAML)
    (sweep / "2_baseline_decoding.max_new_tokens=5").mkdir()  # killed before it finished: no manifest.json
    done = _rescore(repo_root, sweep)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "OK  0_baseline_decoding.max_new_tokens=3" in done.stdout and "FAILED: 3 finding(s)" in done.stdout
    assert "MISSING job 1 (decoding.max_new_tokens=3, condition=graft): no folder" in done.stdout
    assert "MISSING job 2 (decoding.max_new_tokens=5, condition=baseline): 2_baseline_decoding.max_new_tokens=5 " \
           "holds no finished run" in done.stdout
    assert "MISSING job 3 (decoding.max_new_tokens=5, condition=graft): no folder" in done.stdout

    from harness.compare.report import main as report_main

    report_main([str(sweep), "--no-mlflow"])
    head = (sweep / "report" / "report.md").read_text().splitlines()[2]
    assert head.startswith("**partial: 1 of the 4 jobs multirun.yaml lists have a finished run; missing job 1")

    for i, n in ((1, 3), (2, 5), (3, 5)):  # the sweep completed: every listed job re-checks
        fakerun.build_fake_run(sweep / f"{i}_x_decoding.max_new_tokens={n}")
    import shutil
    shutil.rmtree(sweep / "2_baseline_decoding.max_new_tokens=5")
    done = _rescore(repo_root, sweep)
    assert done.returncode == 0 and "all 4 jobs re-check (all 4 jobs multirun.yaml lists)" in done.stdout, done.stdout
