"""kill -9 of the driver of an `execution=ray` run, then the same command again: it resumes in the same folder from
the rows already written, and the finished folder holds every row once, equal to a single-process run of the same
config. Real processes only: the driver is `python -m harness ... execution=ray execution.workers=2` (tiny-gemma3,
a private local Ray it starts itself), killed with SIGKILL once its outputs.partial.jsonl holds two rows; the
partial folder is refused by rescore (it is not a complete run); the re-run prints that it resumes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="needs ray: make setup-ray")

REPO = Path(__file__).resolve().parents[2]
# 12 problems of up to 120 tokens each (no stop string: the random-weight model never stops early), one thread per
# worker: long enough that the kill lands mid-run, a few seconds of compute in all
CONFIG = ["model=tiny_gemma3", "condition=baseline", "dataset.limit=12", "decoding.max_new_tokens=120",
          "prompt.stop=[]", "determinism.threads=1", "tracking=off", f"project_root={REPO}"]
RAY = ["execution=ray", "execution.workers=2"]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
            "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def _harness(*args: str) -> list[str]:
    return [sys.executable, "-m", "harness", *CONFIG, *args]


def _content(folder: Path, name: str = "outputs.jsonl") -> list[dict]:
    """The rows without their measured cost (wall, cpu, ttft, energy): what the model computed, and the score."""
    rows = [json.loads(line) for line in (folder / name).read_text().splitlines() if line.strip()]
    cost = ("wall_s", "cpu_s", "ttft_s", "energy_j", "energy_status")  # an estimate may read 0 J over a short window
    return [{k: v for k, v in r.items() if k not in cost} for r in rows]


def _stop_group(proc: subprocess.Popen) -> None:
    """Whatever the killed driver's session still holds (its private Ray shares the driver's fate; this makes sure)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        time.sleep(1)


@pytest.mark.slow
def test_a_driver_killed_mid_run_resumes_from_its_rows_with_none_lost_or_duplicated(tmp_path, still_running):
    import psutil

    runs = tmp_path / "ray"
    driver = subprocess.Popen(_harness(*RAY, f"runs_dir={runs}"), cwd=REPO, env=_env(), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    seen: dict[int, tuple[str, float]] = {}  # every process the driver started: its private Ray
    try:
        deadline, partial = time.monotonic() + 400, None
        while time.monotonic() < deadline and driver.poll() is None:
            try:
                for k in psutil.Process(driver.pid).children(recursive=True):
                    seen.setdefault(k.pid, (k.name(), k.create_time()))
            except psutil.NoSuchProcess:
                pass
            found = list(runs.glob("baseline/*/outputs.partial.jsonl"))
            if found and len(found[0].read_text().splitlines()) >= 2:
                partial = found[0]
                break
            time.sleep(0.02)
        assert partial is not None, f"the driver exited ({driver.returncode}) or wrote no rows in time"
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(30)
        killed = time.monotonic()
        while still_running(seen) and time.monotonic() - killed < 20:
            time.sleep(0.25)
        assert not still_running(seen), f"outlived the killed driver by 20 s: {still_running(seen)}"
    finally:
        _stop_group(driver)
    folder = partial.parent
    kept = len(partial.read_text().splitlines())
    assert not (folder / "manifest.json").exists() and 2 <= kept < 12, kept  # killed mid-run, not after it

    # a partial folder is never taken for a run: rescore refuses it (no manifest), naming what it looked for
    partial_check = subprocess.run([sys.executable, str(REPO / "scripts" / "rescore.py"), str(folder)], cwd=REPO,
                                   env=_env(), capture_output=True, text=True, timeout=300)
    assert partial_check.returncode == 2 and "no run folder" in partial_check.stderr, partial_check.stderr

    again = subprocess.run(_harness(*RAY, f"runs_dir={runs}"), cwd=REPO, env=_env(), capture_output=True, text=True,
                           timeout=600, start_new_session=True)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resuming the interrupted run in {folder}" in again.stdout.replace("\n", " "), again.stdout[-2000:]
    assert sorted(runs.glob("baseline/*")) == [folder]  # the same folder, no second one
    assert (folder / "manifest.json").is_file() and not partial.exists()

    single = subprocess.run(_harness(f"runs_dir={tmp_path}/single"), cwd=REPO, env=_env(), capture_output=True,
                            text=True, timeout=600)
    assert single.returncode == 0, single.stderr[-3000:]
    (alone,) = (tmp_path / "single" / "baseline").glob("*")
    rows = _content(folder)
    assert len(rows) == 12 and len({(r["problem_id"], r["sample"]) for r in rows}) == 12  # none lost or duplicated
    assert rows == _content(alone)
    rescore = subprocess.run([sys.executable, str(REPO / "scripts" / "rescore.py"), str(folder)], cwd=REPO,
                             env=_env(), capture_output=True, text=True, timeout=300)
    assert rescore.returncode == 0, rescore.stdout + rescore.stderr
