"""A full disk (ENOSPC) or a read-only runs folder while a run folder is made or written: one line naming the
path and what to do, nothing corrupt left, and the rows written before the disk filled resume once space is
freed. The faults are real: a small tmpfs mounted for the test (we run as root in the sandbox); where mounting is
not allowed the tests are skipped with the reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.config.schema import compose_config
from harness.errors import StorageError
from harness.record.audit import audit
from harness.record.folder import MANIFEST, PARTIAL
from harness.run.loop import run
from kvstore import load_backend

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO)}
PAGE = 4096
TIMING = {"wall_s", "cpu_s", "energy_j", "energy_status", "ttft_s"}


def _mount(point: Path, options: str) -> None:
    point.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip() or r.returncode}); needs root / CAP_SYS_ADMIN")


def _umount(point: Path) -> None:
    subprocess.run(["umount", "-l", str(point)], capture_output=True)


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs (64 pages) at tmp_path/disk."""
    point = tmp_path / "disk"
    _mount(point, f"size={64 * PAGE}")
    yield point
    _umount(point)


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[Path]:
    point = tmp_path / "ro"
    _mount(point, "size=64k,ro")
    yield point
    _umount(point)


def fill(disk: Path, leave_pages: int) -> Path:
    """Fill `disk` so that `leave_pages` pages stay free; returns the filler file (delete it to free the space)."""
    filler = disk / "filler"
    st = os.statvfs(disk)
    free = st.f_bavail * st.f_frsize
    with filler.open("wb") as f:
        f.write(b"\0" * max(0, free - leave_pages * PAGE))
    assert os.statvfs(disk).f_bavail == leave_pages
    return filler


@pytest.fixture(scope="module")
def fm():
    return load_backend("transformers", source="tiny-gemma3")


def _cfg(runs: Path, *extra: str):
    return compose_config(["model=tiny_gemma3", "determinism.batch_invariant=false", "dataset.limit=10",
                           "decoding.max_new_tokens=4", "tracking=off",
                           f"runs_dir={runs}", f"project_root={REPO}", *extra])


def _computed(folder) -> list[dict]:
    return [{k: v for k, v in r.to_json().items() if k not in TIMING} for r in folder.read_rows()]


def test_hydra_entry_on_a_full_disk_is_one_line(tmpfs):
    fill(tmpfs, 0)
    r = subprocess.run([sys.executable, "-m", "harness", "model=tiny_gemma3", "tracking=off",
                        f"runs_dir={tmpfs}/runs"], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1, r.stderr
    assert lines[0].startswith(f"error: {tmpfs}/runs") and "no space left" in lines[0] and "runs_dir=" in lines[0]


def test_hydra_entry_on_a_read_only_runs_folder_is_one_line(read_only):
    r = subprocess.run([sys.executable, "-m", "harness", "model=tiny_gemma3", "tracking=off",
                        f"runs_dir={read_only}/runs"], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1, r.stderr
    assert lines[0].startswith(f"error: {read_only}/runs") and "read-only (EROFS)" in lines[0]


def test_run_in_a_read_only_runs_folder_names_it(read_only, fm):
    with pytest.raises(StorageError, match=f"{read_only}/runs.*read-only \\(EROFS\\).*runs_dir="):
        run(_cfg(read_only / "runs"), be=fm, progress=False)


@pytest.mark.parametrize("free_pages", [0, 1, 2, 3, 4, 6, 8, 12, 16, 24])
def test_disk_full_at_any_point_is_one_line_then_the_run_resumes_once_space_is_freed(tmpfs, tmp_path, fm, free_pages):
    clean, _ = run(_cfg(tmp_path / "clean"), be=fm, progress=False)
    runs = tmpfs / "runs"
    runs.mkdir()
    filler = fill(tmpfs, free_pages)
    try:
        folder, _ = run(_cfg(runs), be=fm, progress=False)
        outcome = "completed"
    except StorageError as exc:
        message = str(exc)
        assert "\n" not in message and str(tmpfs) in message and "no space left on the device (ENOSPC)" in message
        left = [p for p in (runs / "baseline").iterdir()] if (runs / "baseline").is_dir() else []
        assert all(not (p / MANIFEST).exists() for p in left)  # never a folder that claims to be complete
        kept = sum(p.joinpath(PARTIAL).read_bytes().count(b"\n") for p in left if p.joinpath(PARTIAL).is_file())
        assert len(left) <= 1 and (left or kept == 0)  # a folder only when it holds rows; none left empty
        outcome = f"ENOSPC while {message.split(' while ')[1].split(';')[0]}, {kept} rows kept"
        filler.unlink()
        folder, _ = run(_cfg(runs), be=fm, progress=False)  # the same config, space freed: resumes
        if left:
            assert folder.path == left[0]
    assert audit(folder).ok
    assert _computed(folder) == _computed(clean)
    (tmp_path / "outcome.json").write_text(json.dumps({"free_pages": free_pages, "outcome": outcome}))
    print(f"free pages {free_pages}: {outcome}")
