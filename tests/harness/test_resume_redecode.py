"""A resumed run re-decodes the rows it resumes (issue 41, finding 1): a killed run's outputs.partial.jsonl is
unsigned input, and a row forged consistently (the gold answer's own token ids, its text, an eos stop, its score:
every cheap check passes) is not reproduced by re-decoding it, so the recomputed row replaces it and the run says
so. Greedy and seeded sampling, on the tiny random-weight model (its answers are noise: none is correct)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.config.schema import compose_config
from harness.errors import RunInterrupted
from harness.record.audit import audit
from harness.record.folder import RunFolder
from harness.run.loop import run
from harness.task.answers import score
from kvstore import load_backend

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def fm():
    return load_backend("transformers", source="tiny-gemma3")


def _cfg(tmp: Path, name: str, *extra: str):
    return compose_config(["model=tiny_gemma3", "determinism.batch_invariant=false", f"project_root={REPO}",
                           f"runs_dir={tmp}/{name}", "dataset.limit=3",
                           "decoding.max_new_tokens=8", "prompt.stop=[]", "tracking=off", *extra])


def _killed_after(tmp: Path, n: int, fm, monkeypatch, *extra: str) -> Path:
    append, calls = RunFolder.append, []

    def append_then_stop(self, row):
        append(self, row)
        calls.append(row)
        if len(calls) == n:
            raise KeyboardInterrupt

    monkeypatch.setattr(RunFolder, "append", append_then_stop)
    with pytest.raises(RunInterrupted):
        run(_cfg(tmp, "runs", *extra), be=fm, progress=False)
    monkeypatch.setattr(RunFolder, "append", append)
    [partial] = (tmp / "runs").glob("*/*/outputs.partial.jsonl")
    return partial


def _forge(partial: Path, fm, which: list[int]) -> list[dict]:
    """The rows `which` replaced by consistent forgeries: the gold answer's token ids and text, eos, scored right."""
    rows = [json.loads(x) for x in partial.read_text().splitlines()]
    for i in which:
        r = rows[i]
        text = " " + r["gold_answer"]
        s = score(text, r["gold_answer"])
        r.update(completion=text, completion_token_ids=fm.fm.tokenizer.encode(text, add_special_tokens=False),
                 extracted=s.extracted, answer=s.answer, correct=s.correct, stop_reason="eos")
        r["decode_tokens"] = len(r["completion_token_ids"]) + 1
        assert s.correct
    partial.write_text("".join(json.dumps(x) + "\n" for x in rows))
    return rows


def _computed(rows) -> list[tuple]:
    return [(r.problem_id, r.sample, r.completion.token_ids, r.completion.text, r.correct) for r in rows]


@pytest.mark.parametrize("extra", [(), ("decoding=sample", "decoding.n_samples=2")], ids=["greedy", "sample"])
def test_consistently_forged_resumed_rows_are_re_decoded_and_replaced(extra, tmp_path, fm, monkeypatch, capsys):
    partial = _killed_after(tmp_path, 2, fm, monkeypatch, *extra)
    rows = _forge(partial, fm, [0, 1])
    capsys.readouterr()
    folder, summary = run(_cfg(tmp_path, "runs", *extra), be=fm, progress=False)
    said = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    assert "2 of" in said and "rows already done" in said  # the forgeries pass the cheap checks ...
    assert "does not check" not in said
    # ... and are not reproduced by re-decoding them: named, replaced
    assert "2 of the 2 resumed rows were not reproduced" in said and f"{rows[0]['problem_id']} sample 0" in said
    _, clean = run(_cfg(tmp_path, "clean", *extra), be=fm, progress=False)
    clean_rows = RunFolder(next((tmp_path / "clean").glob("*/*/outputs.jsonl")).parent).read_rows()
    assert _computed(folder.read_rows()) == _computed(clean_rows)
    assert summary.scores.accuracy == clean.scores.accuracy == 0.0
    assert audit(folder).ok


def test_reproduced_resumed_rows_are_kept_as_recorded(tmp_path, fm, monkeypatch, capsys):
    partial = _killed_after(tmp_path, 2, fm, monkeypatch)
    before = partial.read_text().splitlines()
    capsys.readouterr()
    folder, _ = run(_cfg(tmp_path, "runs"), be=fm, progress=False)
    said = " ".join(capsys.readouterr().out.split())
    assert "2 of 3 rows already done" in said and "not reproduced" not in said
    after = (folder.path / "outputs.jsonl").read_text().splitlines()
    assert [json.loads(x) for x in after[:2]] == [json.loads(x) for x in before]  # costs as recorded, too
