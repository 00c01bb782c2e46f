"""A compare job killed inside a condition, then run again, and a comparison logged to MLflow after the fact (issue
31, finding 10). Real processes: `python -m harness.compare` (tiny-gemma3, 2 problems) is killed with SIGKILL once
the graft (recurring) run, its third, has written a row; the same command then resumes: the runs the killed job
finished are re-checked and taken (no folder recomputed), the graft run resumes in its own folder (no orphaned
partial folder), and the job writes its comparison, which re-checks. That comparison, made with tracking off (as
when the MLflow server was down), is then logged by `scripts/log_run.py` with its six runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _argv(root: Path) -> list[str]:
    return ["model=tiny_gemma3", f"project_root={REPO}", f"runs_dir={root}/runs", "dataset.limit=2",
            "library.dataset.limit=3", "decoding.max_new_tokens=32", "prompt.stop=[]", "tracking=off",
            f"library.root={root}/library", f"library.store={root}/store"]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def _folders(runs: Path) -> dict[str, list[str]]:
    return {c: sorted(p.name for p in (runs / c).iterdir()) for c in ("baseline", "incontext", "graft", "truncated")
            if (runs / c).is_dir()}


@pytest.fixture(scope="module")
def resumed(tmp_path_factory) -> tuple[Path, dict, dict, str]:
    root = tmp_path_factory.mktemp("compare_resume")
    runs = root / "runs"
    job = subprocess.Popen([sys.executable, "-m", "harness.compare", *_argv(root)], cwd=REPO, env=_env(),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline, partial = time.monotonic() + 500, None
        while time.monotonic() < deadline and job.poll() is None:
            found = list(runs.glob("graft/*-recurring/outputs.partial.jsonl"))
            if found and found[0].read_text().count("\n") >= 1:
                partial = found[0]
                break
            time.sleep(0.02)
        assert partial is not None, f"the job exited ({job.returncode}) before its graft run wrote a row"
        os.kill(job.pid, signal.SIGKILL)
        job.wait(30)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    before = _folders(runs)
    again = subprocess.run([sys.executable, "-m", "harness.compare", *_argv(root)], cwd=REPO, env=_env(),
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    return root, before, _folders(runs), " ".join(again.stdout.split())


@pytest.mark.slow
def test_a_compare_job_killed_inside_a_condition_resumes_every_run_and_recomputes_none(resumed):
    root, before, after, out = resumed
    runs = root / "runs"
    assert before["incontext"] == [n for n in after["incontext"] if n in before["incontext"]]
    # the two runs finished before the kill are taken, not recomputed: no new incontext (recurring) folder
    assert [n for n in after["incontext"] if n.endswith("-recurring")] == \
        [n for n in before["incontext"] if n.endswith("-recurring")]
    assert "incontext (recurring): finished by the interrupted attempt of this job" in out, out[-2000:]
    # the graft run resumed in its own folder: one graft (recurring) folder, complete
    (graft,) = [n for n in after["graft"] if n.endswith("-recurring")]
    assert [n for n in before["graft"] if n.endswith("-recurring")] == [graft]
    assert "resuming the interrupted run in" in out and graft in out, out[-2000:]
    orphans = [str(p.parent) for p in runs.glob("*/*/resume.json") if not (p.parent / "manifest.json").is_file()]
    assert not orphans, orphans
    assert len(after["baseline"]) == 1 and not list((runs / "compare").glob(".unfinished-*"))
    (compare,) = (runs / "compare").glob("*/comparison.json")
    check = subprocess.run([sys.executable, str(REPO / "scripts" / "rescore.py"), str(compare.parent)], cwd=REPO,
                           env=_env(), capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, check.stdout[-2000:] + check.stderr[-2000:]


@pytest.mark.slow
def test_a_comparison_made_while_mlflow_was_down_is_logged_later_with_its_runs(resumed, sqlite_uri):
    from mlflow import MlflowClient

    root, _, _, _ = resumed
    (compare,) = (root / "runs" / "compare").glob("*/comparison.json")
    log = subprocess.run([sys.executable, str(REPO / "scripts" / "log_run.py"), str(compare.parent),
                          "--tracking-uri", sqlite_uri], cwd=REPO, env=_env(), capture_output=True, text=True,
                         timeout=300)
    assert log.returncode == 0, log.stdout[-2000:] + log.stderr[-2000:]
    client = MlflowClient(sqlite_uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    parents = [r for r in runs if r.data.tags.get("job") == "compare"]
    assert len(parents) == 1 and len(runs) >= 7, [r.data.tags.get("mlflow.runName") for r in runs]
    compared = [r for r in runs if r.data.tags.get("compare_run") == parents[0].info.run_id]
    assert len(compared) == 6
    again = subprocess.run([sys.executable, str(REPO / "scripts" / "log_run.py"), str(compare.parent),
                            "--tracking-uri", sqlite_uri], cwd=REPO, env=_env(), capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0 and "skip" in again.stdout, again.stdout + again.stderr
