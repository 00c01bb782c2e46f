"""A resumed run checks the rows it resumes (issue 31, finding 5): each partial row's context is recomputed, its
completion re-decoded from its token ids and its score recomputed; a row edited between the kill and the resume is
dropped and recomputed (with the rows after it), the run says so, and the finished run equals an uninterrupted one.
The scripted fake backend, in process: a run interrupted after 4 of 6 rows by a KeyboardInterrupt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.config.schema import compose_config
from harness.errors import RunInterrupted
from harness.record.folder import RunFolder
from harness.run.loop import run
from kvstore.backends.fake import FakeBackend

REPO = Path(__file__).resolve().parents[2]
FAKE = FakeBackend({"Final answer:": " 42"})  # every problem answered 42


def _cfg(tmp: Path, name: str):
    return compose_config(["model=fake", f"project_root={REPO}",
                           f"runs_dir={tmp}/{name}", "dataset.limit=3", "decoding.n_samples=2",
                           "decoding.strategy=sample", "decoding.max_new_tokens=40", "tracking=off"])


def _interrupted(tmp: Path, monkeypatch) -> Path:
    """The folder of a run stopped after 4 rows (as Ctrl-C between rows stops it)."""
    append, calls = RunFolder.append, []

    def append_then_stop(self, row):
        append(self, row)
        calls.append(row)
        if len(calls) == 4:
            raise KeyboardInterrupt

    monkeypatch.setattr(RunFolder, "append", append_then_stop)
    with pytest.raises(RunInterrupted):
        run(_cfg(tmp, "runs"), be=FAKE)
    monkeypatch.setattr(RunFolder, "append", append)
    [partial] = (tmp / "runs").glob("*/*/outputs.partial.jsonl")
    return partial


def _computed(path: Path) -> list[tuple]:
    return [(r["problem_id"], r["sample"], r["completion"], r["completion_token_ids"], r["correct"], r["extracted"])
            for r in map(json.loads, path.read_text().splitlines())]


@pytest.mark.parametrize("forge", ["score", "text", "tokens"])
def test_a_resumed_row_that_does_not_check_is_recomputed(forge, tmp_path, monkeypatch, capsys):
    partial = _interrupted(tmp_path, monkeypatch)
    rows = [json.loads(line) for line in partial.read_text().splitlines()]
    assert len(rows) == 4
    r = rows[2]  # problem 2, sample 0: wrong (the scripted answer is 42)
    assert r["correct"] is False
    if forge == "score":  # the figure only: extracted, answer and correct edited to the gold answer
        r.update(extracted=r["gold_answer"], answer=r["gold_answer"], correct=True)
    elif forge == "text":  # a completion that says the gold answer, its score to match
        r.update(completion=" " + r["gold_answer"], extracted=r["gold_answer"], answer=r["gold_answer"],
                 correct=True)
    else:  # token ids that are not the completion's
        r["completion_token_ids"] = r["completion_token_ids"][:-1] + [r["completion_token_ids"][-1] ^ 1]
    partial.write_text("".join(json.dumps(x) + "\n" for x in rows))
    capsys.readouterr()
    folder, summary = run(_cfg(tmp_path, "runs"), be=FAKE)
    said = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    assert f"{r['problem_id']} sample 0 does not check" in said and "it and the 1 rows after it are dropped" in said
    assert "2 of 6 rows already done" in said
    _, clean = run(_cfg(tmp_path, "clean"), be=FAKE)
    assert _computed(folder.path / "outputs.jsonl") == _computed(next((tmp_path / "clean").glob("*/*/outputs.jsonl")))
    assert summary.scores.accuracy == clean.scores.accuracy


def test_resumed_rows_that_check_are_kept(tmp_path, monkeypatch, capsys):
    _interrupted(tmp_path, monkeypatch)
    capsys.readouterr()
    run(_cfg(tmp_path, "runs"), be=FAKE)
    said = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    assert "4 of 6 rows already done" in said and "does not check" not in said
