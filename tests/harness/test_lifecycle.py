"""The run lifecycle with real processes (docs/reliability.md): folders that cannot collide, kill -9 then resume
with rows identical to an uninterrupted run, SIGTERM stopping in one line with a resumable folder, failed runs
leaving no folder. Every run is `python -m harness` on the tiny random-weight model (model=tiny_gemma3)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from harness.record.audit import audit
from harness.record.folder import LOCK, MANIFEST, PARTIAL, RESUME, RunFolder, claim

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO)}
#: Row fields that measure the machine, not the computation: they differ between any two runs.
TIMING = {"wall_s", "cpu_s", "energy_j", "energy_status", "ttft_s"}
#: 6 problems x 2 seeded samples, ~1 s a row on 2 cores: long enough to kill mid-run.
SAMPLED = ["model=tiny_gemma3", "dataset.limit=6", "decoding=sample", "decoding.n_samples=2",
           "decoding.max_new_tokens=40", "tracking=off"]


def harness(runs: Path, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "harness", *overrides, f"runs_dir={runs}"]


def computed(path: Path) -> list[dict]:
    """A run's rows without their timing fields."""
    return [{k: v for k, v in json.loads(x).items() if k not in TIMING} for x in path.read_text().splitlines()]


def wait_for_rows(path: Path, n: int, proc: subprocess.Popen, timeout: float = 300) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if path.is_file() and path.read_bytes().count(b"\n") >= n:
            return
        assert proc.poll() is None, f"the run ended before writing {n} rows: {proc.communicate()}"
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"no {n} rows in {path} after {timeout} s")


def folders(runs: Path, condition: str = "baseline") -> list[Path]:
    return sorted(p for p in (runs / condition).iterdir() if p.is_dir()) if (runs / condition).is_dir() else []


def test_claim_takes_the_next_suffix_and_never_shares_a_name(tmp_path):
    got: list[Path] = []
    threads = [threading.Thread(target=lambda: got.append(claim(tmp_path, "2026-01-01_00-00-00"))) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    names = sorted(p.name for p in got)
    assert len(set(names)) == 16 and "2026-01-01_00-00-00" in names and "2026-01-01_00-00-00-16" in names


@pytest.mark.slow
def test_two_sweeps_started_in_the_same_second_land_in_two_folders(tmp_path):
    runs = tmp_path / "runs"
    # both name their sweep folder "same-second": the collision that two sweeps started in one second meet
    sweep = f"hydra.sweep.dir=${{kvgraft.claim_dir:{runs}/multirun,same-second}}"
    common = ["-m", "model=tiny_gemma3", "dataset.limit=1", "decoding.max_new_tokens=2", "tracking=off", sweep]
    procs = [subprocess.Popen(harness(runs, *common, f"decoding.seed={s}"), cwd=REPO, env=ENV, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for s in (1, 2)]
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-2000:]
    jobs = sorted(p.parent for p in (runs / "multirun").glob(f"*/*/{MANIFEST}"))
    assert [j.parent.name for j in jobs] == ["same-second", "same-second-2"]
    seeds = sorted(RunFolder(j).read_config()["decoding"]["seed"] for j in jobs)
    assert seeds == [1, 2]  # each folder holds its own sweep: nothing overwritten
    for j in jobs:  # Hydra's record agrees with ours in each folder
        assert (j / ".hydra" / "config.yaml").read_text().count(f"seed: {RunFolder(j).read_config()['decoding']['seed']}")
        assert audit(RunFolder(j)).ok


@pytest.mark.slow
def test_kill_9_then_the_same_command_resumes_with_the_rows_of_an_uninterrupted_run(tmp_path):
    runs = tmp_path / "runs"
    proc = subprocess.Popen(harness(runs, *SAMPLED), cwd=REPO, env=ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    (first,) = _wait_for_folder(runs, proc)
    wait_for_rows(first / PARTIAL, 3, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    killed_rows = (first / PARTIAL).read_bytes().count(b"\n")
    assert not (first / MANIFEST).exists() and (first / RESUME).is_file() and 3 <= killed_rows < 12

    again = subprocess.run(harness(runs, *SAMPLED), cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    said = " ".join(again.stdout.split())
    assert f"resuming the interrupted run in {first}" in said and "rows already done" in said
    assert folders(runs) == [first]  # same folder; Hydra's new one for the second attempt is gone
    assert audit(RunFolder(first)).ok
    assert not any((first / n).exists() for n in (PARTIAL, RESUME, LOCK))

    clean = subprocess.run(harness(runs, *SAMPLED, "run.fresh=true"), cwd=REPO, env=ENV, capture_output=True,
                           text=True, timeout=600)
    assert clean.returncode == 0, clean.stderr[-2000:]
    (other,) = [p for p in folders(runs) if p != first]
    resumed, uninterrupted = computed(first / "outputs.jsonl"), computed(other / "outputs.jsonl")
    assert len(resumed) == 12 and [r["seed"] for r in resumed] == [0, 1] * 6
    assert resumed == uninterrupted  # token ids, first-logits hashes, answers: all identical


def _wait_for_folder(runs: Path, proc: subprocess.Popen, timeout: float = 120) -> list[Path]:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        found = folders(runs)
        if found:
            return found
        assert proc.poll() is None, "the run ended before making its folder"
        time.sleep(0.05)
    raise AssertionError("no run folder")


@pytest.mark.slow
def test_sigterm_stops_between_rows_with_one_line_and_a_resumable_folder(tmp_path):
    runs = tmp_path / "runs"
    proc = subprocess.Popen(harness(runs, *SAMPLED), cwd=REPO, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    (folder,) = _wait_for_folder(runs, proc)
    wait_for_rows(folder / PARTIAL, 2, proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM
    assert "Traceback" not in err + out
    stopped = [line for line in err.splitlines() if line.startswith("stopped:")]
    assert len(stopped) == 1 and "SIGTERM" in stopped[0] and "re-run the same command to resume" in stopped[0]
    assert str(folder) in stopped[0]
    f = RunFolder(folder)
    assert not f.is_complete() and f.resume_info()["resume_key"] and f.lock()  # lock released, rows kept
    f.release()
    n = int(stopped[0].split("after ")[1].split(" of")[0])
    assert n >= 2 and (folder / PARTIAL).read_bytes().count(b"\n") == n


def test_a_run_that_fails_leaves_no_folder(tmp_path):
    runs = tmp_path / "runs"
    bad = subprocess.run(harness(runs, "model=tiny_gemma3", "dataset=file", f"dataset.path={tmp_path}/none.jsonl",
                                 "tracking=off"), cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1 and bad.stderr.strip().splitlines()[-1].startswith("error:")
    assert folders(runs) == []
    sweep = subprocess.run(harness(runs, "-m", "model=tiny_gemma3", "dataset=file", "dataset.path=/nowhere.jsonl",
                                   "tracking=off"), cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    assert sweep.returncode == 1
    assert not (runs / "multirun").exists() or not any((runs / "multirun").iterdir())


@pytest.mark.parametrize("entry", ["harness", "harness.compare", "harness.library"])
def test_every_entry_point_refuses_a_misspelt_key_in_one_line_with_the_near_miss(entry, tmp_path):
    r = subprocess.run([sys.executable, "-m", entry, "decoding.max_new_token=8", f"runs_dir={tmp_path}"], cwd=REPO,
                       env=ENV, capture_output=True, text=True, timeout=300)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1, r.stderr
    assert "decoding.max_new_token" in lines[0] and "did you mean decoding.max_new_tokens?" in lines[0]
    assert not any(tmp_path.iterdir())  # refused before any folder was made


@pytest.mark.slow
def test_project_root_holds_the_run_folder_and_the_resume_finds_it_from_another_directory(tmp_path):
    """`project_root=` moves Hydra's run folder with it (configs/config.yaml: `kvgraft.under`), so a run started
    from another working directory lands under project_root/runs_dir, where its resume looks, not under the cwd."""
    root, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    root.mkdir()
    elsewhere.mkdir()
    cmd = [sys.executable, "-m", "harness", *SAMPLED, f"project_root={root}",
           f"dataset.path={REPO / 'problems' / 'kvgraft_original.jsonl'}"]
    proc = subprocess.Popen(cmd, cwd=elsewhere, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    (first,) = _wait_for_folder(root / "runs", proc)
    wait_for_rows(first / PARTIAL, 3, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    again = subprocess.run(cmd, cwd=elsewhere, env=ENV, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"resuming the interrupted run in {first}" in " ".join(again.stdout.split())
    assert folders(root / "runs") == [first] and audit(RunFolder(first)).ok
    assert list(elsewhere.iterdir()) == []  # nothing written under the working directory
