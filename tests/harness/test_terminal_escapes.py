"""ANSI escapes in problem ids never reach the terminal from the library build (issue 41, finding 7): its progress
bar and its error lines show them escaped. The scripted fake model, a two-problem file whose ids carry escapes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.config.model import load_model
from harness.config.schema import compose_config, typed
from harness.errors import LibraryError, exit_on_error
from harness.library.build import build_library

REPO = Path(__file__).resolve().parents[2]
EVIL = "kvg-\x1b[2J\x1b[31m001"


def test_the_library_builds_progress_bar_and_errors_show_escapes_escaped(tmp_path, capsys):
    rows = [json.loads(x) for x in (REPO / "problems" / "kvgraft_original.jsonl").read_text().splitlines()[:2]]
    rows[0]["id"] = EVIL
    data = tmp_path / "evil.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = typed(compose_config(["model=fake", f"project_root={REPO}", f"library.root={tmp_path}/library",
                                f"library.store={tmp_path}/store", f"library.dataset.path={data}", "tracking=off"]))
    build_library(cfg.library, load_model(cfg), REPO, progress=True)
    out, err = capsys.readouterr()
    assert "\x1b[2J" not in out + err and "\x1b[31m" not in out + err
    assert "entry kvg-\\x1b[2J\\x1b[31m001" in err  # the bar names the entry, escaped

    @exit_on_error
    def fails() -> None:
        raise LibraryError(f"depositing the entry for problem {EVIL} failed")

    with pytest.raises(SystemExit):
        fails()
    err = capsys.readouterr().err
    assert "\x1b" not in err and "problem kvg-\\x1b[2J\\x1b[31m001 failed" in err


# --- issue 51, item 9: every place a problem id or other run-derived text reaches the terminal ------------------------

def _evil_problems(tmp_path: Path, n: int = 2) -> Path:
    rows = [json.loads(x) for x in (REPO / "problems" / "kvgraft_original.jsonl").read_text().splitlines()[:n]]
    rows[0]["id"] = EVIL
    data = tmp_path / "evil.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return data


def test_the_resume_warning_shows_a_forged_rows_problem_id_escaped(tmp_path, monkeypatch, capsys):
    """A run stopped after 2 rows whose first partial row (problem id EVIL) was forged: the resume drops it and says
    so, naming the problem, escaped."""
    from harness.errors import RunInterrupted
    from harness.record.folder import RunFolder
    from harness.run.loop import run
    from kvstore.backends.fake import FakeBackend

    data = _evil_problems(tmp_path)
    cfg = compose_config(["model=fake", f"project_root={REPO}", f"runs_dir={tmp_path}/runs", f"dataset.path={data}",
                          "decoding.n_samples=2", "decoding.strategy=sample", "decoding.max_new_tokens=16",
                          "tracking=off"])
    fake = FakeBackend({"Final answer:": " 42"})
    append, calls = RunFolder.append, []

    def append_then_stop(self, row):
        append(self, row)
        calls.append(row)
        if len(calls) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(RunFolder, "append", append_then_stop)
    with pytest.raises(RunInterrupted):
        run(cfg, be=fake)
    monkeypatch.setattr(RunFolder, "append", append)
    [partial] = (tmp_path / "runs").glob("*/*/outputs.partial.jsonl")
    rows = [json.loads(line) for line in partial.read_text().splitlines()]
    assert rows[0]["problem_id"] == EVIL
    rows[0].update(extracted=rows[0]["gold_answer"], answer=rows[0]["gold_answer"], correct=True)
    partial.write_text("".join(json.dumps(r) + "\n" for r in rows))
    capsys.readouterr()
    run(cfg, be=fake, progress=False)
    out, err = capsys.readouterr()
    assert "\x1b[2J" not in out + err and "\x1b[31m" not in out + err
    assert "kvg-\\x1b[2J\\x1b[31m001 sample 0 does not check" in " ".join((out + err).split())


def test_rescore_and_the_report_show_a_run_folders_ids_and_names_escaped(tmp_path, capsys):
    """`make rescore` of an edited run whose problem id and folder name carry escapes, and `make report` over it."""
    from harness import rescore
    from harness.compare.report import main as report_main
    from harness.record.folder import RunFolder
    from harness.run.loop import run
    from kvstore.backends.fake import FakeBackend

    data = _evil_problems(tmp_path)
    cfg = compose_config(["model=fake", f"project_root={REPO}", f"runs_dir={tmp_path}/sweep", f"dataset.path={data}",
                          "decoding.max_new_tokens=8", "tracking=off"])
    done, _ = run(cfg, be=FakeBackend({"Final answer:": " 42"}), progress=False)
    runs = (tmp_path / "sweep").rename(tmp_path / "sweep\x1b[8m")  # a folder name the terminal must not obey
    folder = RunFolder(runs / done.path.relative_to(tmp_path / "sweep"))
    capsys.readouterr()
    assert report_main([str(runs), "--no-mlflow", "--out", str(tmp_path / "report")]) == 0
    out, err = capsys.readouterr()
    assert "\x1b" not in out + err and "sweep\\x1b[8m" in out + err
    lines = (folder.path / "outputs.jsonl").read_text().splitlines()
    row = json.loads(lines[0])
    row["gold_answer"] = "\x1b[2J" + row["gold_answer"]
    lines[0] = json.dumps(row)
    (folder.path / "outputs.jsonl").write_text("\n".join(lines) + "\n")
    assert rescore.main([str(folder.path)]) == 1
    out, err = capsys.readouterr()
    assert "\x1b" not in out + err and "FAILED" in out and "sweep\\x1b[8m" in out


def test_warnings_shown_by_an_entry_point_are_escaped():
    """Python's own warning printer writes the message raw; an entry point wrapped by exit_on_error shows it escaped
    (a pending MLflow log names the run folder). In a subprocess: pytest records warnings itself."""
    import subprocess
    import sys

    code = ("import warnings\nfrom harness.errors import exit_on_error\n"
            "exit_on_error(lambda: warnings.warn('MLflow logging of runs/kvg-\\x1b[2J001 failed', RuntimeWarning))()")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stderr and "runs/kvg-\\x1b[2J001 failed" in done.stderr


def test_no_rich_console_is_built_but_the_escaping_one():
    """The class, by construction: every rich Console in harness/ and scripts/ is harness.errors.console (which
    escapes what it renders); a `Console(...)` call anywhere else would print data raw."""
    import ast

    built = []
    for path in sorted([*(REPO / "harness").rglob("*.py"), *(REPO / "scripts").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "Console" \
                    and path != REPO / "harness" / "errors.py":
                built.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not built, f"rich Console built directly (use harness.errors.console): {built}"
