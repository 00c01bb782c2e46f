"""scripts/transfer_table.py: accuracy with Wilson intervals, per-problem wrong -> right / right -> wrong against
the model alone, rows stopped at the budget and overlong, decode tokens. Rows made here, with known outcomes."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from harness.errors import LibraryError, RunFolderError
from harness.record.metrics import wilson_interval

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "harness"))
import fakerun  # noqa: E402

from scripts import transfer_table  # noqa: E402


def _rows(outcomes: dict[str, bool], condition: str, stop: str = "eos", overlong: bool | None = None) -> list:
    base = fakerun.make_rows(condition)[0]
    return [dataclasses.replace(base, problem_id=p, sample=0, correct=ok, overlong=overlong,
                                completion=dataclasses.replace(base.completion, stop_reason=stop))
            for p, ok in outcomes.items()]


def test_changes_against_the_model_alone_with_intervals_and_budget_stops():
    alone = _rows({"a": True, "b": False, "c": False, "d": False}, "baseline", stop="length")
    runs = {"held-out": _rows({"a": False, "b": True, "c": True, "d": False}, "graft"),
            "random-entry": _rows({"a": True, "b": False, "c": False, "d": False}, "graft", overlong=True)}
    t = transfer_table.table(alone, runs)
    assert t["problems"] == 4 and t["alone"]["length"] == 4 and "wrong_to_right" not in t["alone"]
    h = t["runs"]["held-out"]
    assert (h["correct"], h["n"], h["wrong_to_right"], h["right_to_wrong"]) == (2, 4, ["b", "c"], ["a"])
    assert h["ci95"] == [round(x, 4) for x in wilson_interval(2, 4)] and h["length"] == 0
    r = t["runs"]["random-entry"]
    assert (r["wrong_to_right"], r["right_to_wrong"], r["overlong"]) == ([], [], 4)
    text = transfer_table.markdown(t)
    assert "| held-out | 2/4 = 0.500 [" in text and "| b, c | a | 1.000 |" in text and "| alone | 1/4" in text
    assert h["mcnemar_p"] == 1.0 and r["mcnemar_p"] == 1.0  # 2 vs 1 changes, and none: no evidence either way


def test_mcnemar_exact_p_is_the_two_sided_binomial_on_the_changed_problems():
    assert transfer_table.mcnemar_exact_p(6, 0) == 2 / 2**6  # all six changes one way: 0.031
    assert transfer_table.mcnemar_exact_p(3, 0) == 0.25 and transfer_table.mcnemar_exact_p(0, 3) == 0.25
    assert transfer_table.mcnemar_exact_p(3, 1) == 2 * (1 + 4) / 16  # 0.625
    assert transfer_table.mcnemar_exact_p(0, 0) == 1.0 and transfer_table.mcnemar_exact_p(5, 5) == 1.0


def test_runs_over_other_problems_are_refused():
    with pytest.raises(RunFolderError, match="same problems"):
        transfer_table.table(_rows({"a": True}, "baseline"), {"x": _rows({"b": True}, "graft")})


def _graft_row(problem: str, gold: str, answer: int | None, entry: str) -> object:
    from harness.record.rows import Retrieval

    base = fakerun.make_rows("graft")[0]
    got = Retrieval(entry, "0" * 64, 1.0, "bm25")
    return dataclasses.replace(base, problem_id=problem, sample=0, gold=gold, answer=answer,
                               correct=answer == int(gold), completion=dataclasses.replace(base.completion,
                                                                                           retrieval=got))


def test_rows_that_answer_their_grafted_entrys_answer_are_counted_only_when_it_is_not_the_problems():
    entries = {"e-a": "401", "e-b": "60", "e-own": "15"}
    alone = _rows({"p": False, "q": False, "r": False, "s": False}, "baseline")
    run = [_graft_row("p", "15", 401, "e-a"),   # took its neighbour's answer
           _graft_row("q", "60", 60, "e-b"),    # the entry's answer is the problem's too: right, not a copy
           _graft_row("r", "15", 15, "e-own"),  # its own entry (recurring): right, not a copy
           _graft_row("s", "7", None, "e-a")]   # no answer
    t = transfer_table.table(alone, {"held-out": run}, entries)
    assert t["runs"]["held-out"]["entry_answer"] == ["p"]
    assert "| 1/4 (p) |" in transfer_table.markdown(t)
    assert "entry_answer" not in transfer_table.table(alone, {"held-out": run})["runs"]["held-out"]


def _library(folder: Path, answer: str = "1") -> str:
    """A sealed one-entry library folder (index row and manifest hashed as harness.library.build writes them)."""
    from harness.record.hashing import sha256_json

    row = {"entry_id": "e", "problem_id": "p", "problem_fingerprint": "fp", "problem": "x", "answer": answer,
           "artifact_id": "0" * 64, "tokens": 3, "origin": "test", "verification": {}}
    body = {"entries": {"e": sha256_json(row)}}
    folder.mkdir()
    (folder / "index.jsonl").write_text(json.dumps(row) + "\n")
    (folder / "manifest.json").write_text(json.dumps({**body, "manifest_sha256": sha256_json(body)}))
    return sha256_json(body)


def test_a_library_folder_other_than_the_runs_is_refused(tmp_path):
    lib = tmp_path / "lib"
    aaaa = _library(lib)
    assert transfer_table.library_answers(lib, aaaa) == {"e": "1"}
    with pytest.raises(LibraryError, match="not the library the runs grafted from"):
        transfer_table.library_answers(lib, "bbbb")
    with pytest.raises(LibraryError, match="not a library folder"):
        transfer_table.library_answers(tmp_path / "missing", aaaa)


def test_a_library_whose_answers_were_edited_is_refused(tmp_path):
    """The variant: the index's answer changed, manifest.json kept (its recorded hash still the runs')."""
    lib = tmp_path / "lib"
    sha = _library(lib)
    (lib / "index.jsonl").write_text((lib / "index.jsonl").read_text().replace('"answer": "1"', '"answer": "2"'))
    with pytest.raises(LibraryError, match="not a library folder.*does not match the hash"):
        transfer_table.library_answers(lib, sha)


def test_problem_ids_in_year_number_order_and_a_long_list_as_a_count():
    ids = ["1983-10", "1983-2", "1984-1", "x"]
    alone = _rows(dict.fromkeys(ids, False), "baseline")
    t = transfer_table.table(alone, {"recurring": _rows(dict.fromkeys(ids, True), "graft")})
    assert t["runs"]["recurring"]["wrong_to_right"] == ["1983-2", "1983-10", "1984-1", "x"]
    many = [f"1990-{i}" for i in range(1, 16)]
    t = transfer_table.table(_rows(dict.fromkeys(many, False), "baseline"),
                             {"recurring": _rows(dict.fromkeys(many, True), "graft")})
    assert "| 15 problems | 0 | < 0.001 |" in transfer_table.markdown(t) and len(t["runs"]["recurring"]["wrong_to_right"]) == 15
    assert "15/15 = 1.000 [0.796, 1.000]" in transfer_table.markdown(t)  # Wilson, rounded once


def test_a_library_edited_and_resealed_is_not_the_runs_library(tmp_path):
    """Issue 51, item 9: answers edited and every hash re-sealed (the library opens): its manifest_sha256 is not the
    one the runs recorded (inputs.library), so the copied-answer column is not computed from it."""
    from harness.record.hashing import sha256_json

    lib = tmp_path / "lib"
    recorded = _library(lib)
    row = json.loads((lib / "index.jsonl").read_text())
    row["answer"] = "2"
    body = {"entries": {"e": sha256_json(row)}}
    (lib / "index.jsonl").write_text(json.dumps(row) + "\n")
    (lib / "manifest.json").write_text(json.dumps({**body, "manifest_sha256": sha256_json(body)}))
    with pytest.raises(LibraryError, match="is not the library the runs grafted from .*re-sealed"):
        transfer_table.library_answers(lib, recorded)
