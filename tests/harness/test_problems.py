"""Problem loading through `datasets`: local jsonl/csv/parquet, column maps, limits, and errors that name the
file, the row and the field."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from harness.errors import ProblemError
from harness.problems import load_problems, problem_fingerprint

ROWS = [
    {"id": "a", "problem": "What is $1+1$?", "answer": "002", "solution": "1+1=2, so \\boxed{2}.", "year": 2020},
    {"id": "b", "problem": "What is $3 \\cdot 4$?", "answer": "12", "solution": None, "year": 2021},
]


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_rows_load_with_canonical_answers_and_metadata_kept_as_source(tmp_path):
    problems = load_problems(str(_jsonl(tmp_path / "p.jsonl", ROWS)))
    assert [p.id for p in problems] == ["a", "b"]
    assert problems[0].answer == "2"  # leading zeros accepted, normalised
    assert problems[0].solution.startswith("1+1") and problems[1].solution is None
    assert problems[0].source == {"year": 2020}


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_csv_and_parquet_load_the_same_problems(tmp_path, suffix):
    frame = pd.DataFrame(ROWS)
    path = tmp_path / f"p{suffix}"
    frame.to_csv(path, index=False) if suffix == ".csv" else frame.to_parquet(path)
    assert [(p.id, p.answer) for p in load_problems(str(path))] == [("a", "2"), ("b", "12")]


def test_columns_map_other_names_and_limit_takes_the_first_n(tmp_path):
    rows = [{"ID": r["id"], "Question": r["problem"], "Answer": int(r["answer"])} for r in ROWS]
    problems = load_problems(str(_jsonl(tmp_path / "p.jsonl", rows)),
                             columns={"id": "ID", "problem": "Question", "answer": "Answer"}, limit=1)
    assert [(p.id, p.answer) for p in problems] == [("a", "2")]


@pytest.mark.parametrize("bad,field", [
    ({"id": "c", "problem": "x", "answer": "1000"}, "answer"),
    ({"id": "c", "problem": "x", "answer": "4.5"}, "answer"),
    ({"id": "c", "problem": "", "answer": "4"}, "problem"),
    ({"id": "a", "problem": "x", "answer": "4"}, "id"),
])
def test_a_bad_row_is_an_error_naming_file_row_and_field(tmp_path, bad, field):
    path = _jsonl(tmp_path / "bad.jsonl", [{k: v for k, v in ROWS[0].items() if k != "year"}, bad])
    with pytest.raises(ProblemError) as e:
        load_problems(str(path))
    msg = str(e.value)
    assert "bad.jsonl" in msg and "row 2" in msg and f"'{field}'" in msg


def test_a_missing_file_says_which_and_what_to_do(tmp_path):
    with pytest.raises(ProblemError, match="does not exist"):
        load_problems(str(tmp_path / "nope.jsonl"))


def test_problem_fingerprint_ignores_whitespace_and_case():
    assert problem_fingerprint("What  is\n$1+1$?") == problem_fingerprint("what is $1+1$?")
