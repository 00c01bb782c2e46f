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
