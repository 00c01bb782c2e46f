"""A job whose problem file is missing refuses before it loads a model or opens or builds a library (issue 51, item
9: `harness.compare dataset=file dataset.path=<missing>` built the library first, then refused). The class: every job
entry point that reads a problem set (the compare job, the library build, the recurring-factor experiment) reads and
validates it first. The tiny random model (never loaded here)."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _common(tmp: Path) -> list[str]:
    return ["model=tiny_gemma3", f"project_root={REPO}", f"runs_dir={tmp}/runs", f"library.root={tmp}/library",
            f"library.store={tmp}/store", "tracking=off", "dataset.limit=2", "library.dataset.limit=2"]


def _refused(tmp: Path, capsys: pytest.CaptureFixture, main, argv: list[str], missing: Path) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 1 and str(missing) in err and "Traceback" not in err, err
    assert not (tmp / "library").exists() and not (tmp / "store").exists()  # nothing built, nothing opened
    assert not (tmp / "runs").exists() or not any((tmp / "runs").rglob("manifest.json"))


def test_the_compare_job_refuses_a_missing_problem_file_before_the_library(tmp_path, capsys, monkeypatch):
    from harness.compare import job

    monkeypatch.setattr(job, "load_model", lambda c: pytest.fail("the model was loaded before the refusal"))
    missing = tmp_path / "nowhere.jsonl"
    _refused(tmp_path, capsys, job.main, [*_common(tmp_path), "dataset=file", f"dataset.path={missing}"], missing)


def test_the_library_build_refuses_a_missing_problem_file_before_the_model(tmp_path, capsys, monkeypatch):
    from harness.library import build

    monkeypatch.setattr(build, "load_model", lambda c: pytest.fail("the model was loaded before the refusal"))
    missing = tmp_path / "nowhere.jsonl"
    _refused(tmp_path, capsys, build.main, [*_common(tmp_path), f"library.dataset.path={missing}"], missing)
