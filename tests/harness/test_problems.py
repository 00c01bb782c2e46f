"""Problem loading through `datasets`: local jsonl/csv/parquet, column maps, limits, and errors that name the
file, the row and the field."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from harness.errors import HarnessError, ProblemError
from harness.task.problems import load_problems, problem_fingerprint

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


# --- every bad input is a ProblemError naming the file, the row/line, the field and the fix -----------

GOOD = {"id": "a", "problem": "What is $1+1$?", "answer": "2"}


def _message(path: Path, **kwargs) -> str:
    with pytest.raises(ProblemError) as e:
        load_problems(str(path), **kwargs)
    assert isinstance(e.value, HarnessError)
    msg = str(e.value)
    assert not re.search(r":\s*(\.|$)", msg), f"blank reason in {msg!r}"
    assert "An error occurred while generating the dataset" not in msg
    return msg


@pytest.mark.parametrize("content", ["", "\n\n  \n"], ids=["zero-bytes", "blank-lines"])
@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".csv"])
def test_an_empty_file_is_an_error_saying_it_is_empty(tmp_path, content, suffix):
    path = tmp_path / f"empty{suffix}"
    path.write_text(content)
    msg = _message(path)
    assert str(path) in msg and "is empty" in msg and "dataset.path" in msg


def test_invalid_json_on_line_3_names_the_file_the_line_and_the_column(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + json.dumps({**GOOD, "id": "b"}) + '\n{"id": "c", "problem": "x" "answer": 1}\n')
    msg = _message(path)
    assert str(path) in msg and "row 3 (line 3)" in msg and "invalid JSON at column 28" in msg
    assert "delimiter" in msg  # the parser's own reason, not a blank


def test_rows_and_lines_are_counted_apart_when_blank_lines_are_skipped(tmp_path):
    path = tmp_path / "gaps.jsonl"
    path.write_text(json.dumps(GOOD) + "\n\n" + '{"id": "b",\n')
    assert "row 2 (line 3)" in _message(path)


@pytest.mark.parametrize("line", ["[1, 2, 3]", '"just text"', "42"])
def test_a_line_that_is_not_an_object_is_an_error(tmp_path, line):
    path = tmp_path / "odd.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + line + "\n")
    msg = _message(path)
    assert "row 2 (line 2)" in msg and "expected a JSON object" in msg


def test_deeply_nested_json_is_a_problem_error_not_a_recursion_error(tmp_path):
    path = tmp_path / "deep.jsonl"
    path.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    assert "row 1 (line 1)" in _message(path)


def test_a_missing_column_names_the_field_the_columns_present_and_a_working_override(tmp_path):
    path = _jsonl(tmp_path / "caps.jsonl", [{"id": "a", "problem": "x", "Answer": "4"}])
    msg = _message(path)
    assert "row 1 (line 1)" in msg and "field 'answer' (column 'answer') is missing" in msg
    assert "['Answer', 'id', 'problem']" in msg
    assert "'dataset.columns={answer: Answer}'" in msg
    [p] = load_problems(str(path), columns={"answer": "Answer"})  # the suggested fix works
    assert p.answer == "4"


def test_a_missing_column_without_a_same_named_one_asks_for_the_column(tmp_path):
    path = _jsonl(tmp_path / "q.jsonl", [{"id": "a", "question": "x", "answer": "4"}])
    assert "'dataset.columns={problem: <column>}'" in _message(path)


def test_a_file_with_other_column_names_gets_one_override_mapping_them_all(tmp_path):
    path = _jsonl(tmp_path / "caps.jsonl", [{"ID": "a", "Problem": "x", "Answer": "4", "Solution": "4"}])
    override = "dataset.columns={id: ID, problem: Problem, answer: Answer, solution: Solution}"
    assert f"'{override}'" in _message(path)
    [p] = load_problems(str(path), columns={"id": "ID", "problem": "Problem", "answer": "Answer", "solution": "Solution"})
    assert (p.id, p.answer, p.solution) == ("a", "4", "4")


def test_a_column_map_naming_an_unknown_field_is_an_error(tmp_path):
    path = _jsonl(tmp_path / "p.jsonl", [GOOD])
    msg = _message(path, columns={"questoin": "Q"})
    assert "'questoin'" in msg and "['id', 'problem', 'answer', 'solution']" in msg


@pytest.mark.parametrize("limit", [0, -1, True, 2.5])
def test_a_limit_below_one_is_an_error_naming_dataset_limit(tmp_path, limit):
    path = _jsonl(tmp_path / "p.jsonl", [GOOD])
    assert f"dataset.limit={limit!r}" in _message(path, limit=limit)


def _csv(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_a_csv_row_with_too_many_fields_names_its_row_and_line(tmp_path):
    path = _csv(tmp_path / "p.csv", "id,problem,answer\na,What is 1+1?,2\nb,What is 1,2 plus 3?,5\n")
    msg = _message(path)
    assert str(path) in msg and "row 2 (line 3)" in msg and "4 fields where the header has 3" in msg
    assert "quote" in msg


def test_a_csv_row_with_too_few_fields_names_its_row_and_line(tmp_path):
    path = _csv(tmp_path / "p.csv", "id,problem,answer\na,What is 1+1?\n")
    assert "row 1 (line 2)" in _message(path)


def test_a_csv_quoted_field_spanning_lines_keeps_the_line_count_right(tmp_path):
    path = _csv(tmp_path / "p.csv", 'id,problem,answer\na,"Two\nlines",2\nb,x,1000\n')
    msg = _message(path)
    assert "row 2 (line 4)" in msg and "field 'answer'" in msg and "0..999" in msg


def test_a_csv_bad_quote_is_an_error_naming_the_line(tmp_path):
    path = _csv(tmp_path / "p.csv", 'id,problem,answer\na,"x"y,2\n')
    msg = _message(path)
    assert "line 2" in msg and "not valid CSV" in msg


def test_a_csv_header_with_a_repeated_column_is_an_error(tmp_path):
    path = _csv(tmp_path / "p.csv", "id,problem,answer,answer\na,x,1,2\n")
    assert "line 1 (header)" in _message(path)


def test_a_csv_with_only_a_header_has_no_problems(tmp_path):
    path = _csv(tmp_path / "p.csv", "id,problem,answer\n")
    assert "no problems" in _message(path)


def test_csv_values_are_text_and_empty_solutions_are_none(tmp_path):
    path = _csv(tmp_path / "p.csv", "id,problem,answer,solution,year\n007,x,042,,1999\n")
    [p] = load_problems(str(path))
    assert (p.id, p.answer, p.solution, p.source) == ("007", "42", None, {"year": "1999"})


def test_a_json_array_file_loads_and_a_broken_one_names_its_line(tmp_path):
    good = tmp_path / "arr.json"
    good.write_text(json.dumps([GOOD, {**GOOD, "id": "b"}], indent=1))
    assert [p.id for p in load_problems(str(good))] == ["a", "b"]
    bad = tmp_path / "bad.json"
    bad.write_text('[\n {"id": "a"},\n {"id": }\n]\n')
    msg = _message(bad)
    assert "line 3" in msg and "invalid JSON" in msg


def test_a_file_that_is_not_utf8_names_the_line(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(json.dumps(GOOD).encode() + b'\n{"id": "b", "problem": "caf\xe9", "answer": 1}\n')
    assert "line 2" in _message(path) and "UTF-8" in _message(path)


def test_a_corrupt_parquet_file_is_a_problem_error(tmp_path):
    path = tmp_path / "p.parquet"
    path.write_bytes(b"PAR1 not really parquet")
    assert "not a readable parquet file" in _message(path)


def test_an_unsupported_suffix_names_the_supported_ones(tmp_path):
    path = tmp_path / "p.txt"
    path.write_text("x")
    assert "'.jsonl'" in _message(path)


def test_the_offline_hub_error_gives_a_runnable_command(monkeypatch):
    import datasets
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ProblemError) as e:
        load_problems(hub_id="kvgraft-tests/no-such-dataset", split="test")
    msg = str(e.value)
    assert "..." not in msg and "kvgraft-tests/no-such-dataset" in msg
    command = re.search(r'HF_HUB_OFFLINE=0 python -c "([^"]+)"', msg)
    assert command, msg
    compile(command.group(1), "<hint>", "exec")  # the hint is valid Python, not a template
    assert "load_dataset('kvgraft-tests/no-such-dataset', None, split='test')" in command.group(1)


# --- the public AIME 1983-2023 set through its dataset config ----------------------------------------

REPO = Path(__file__).resolve().parents[2]
AIME_PUBLIC = REPO / "../shared/data/aime_1983_2023.jsonl"
needs_public_set = pytest.mark.skipif(not AIME_PUBLIC.is_file(), reason=f"{AIME_PUBLIC} is not on this machine")


@needs_public_set
def test_the_public_aime_config_loads_a_slice_with_dataset_limit():
    from harness.config.schema import compose_config

    cfg = compose_config(["dataset=aime_1983_2023", "dataset.limit=7"])
    d = cfg.dataset
    problems = load_problems(str(REPO / d.path), d.hub_id, d.subset, d.split, dict(d.columns), d.limit)
    assert [p.id for p in problems] == [f"1983-{n}" for n in range(1, 8)]
    assert problems[0].answer == "60" and problems[0].solution and problems[0].source["year"] == 1983


@needs_public_set
def test_the_public_aime_config_loads_all_975_problems_from_the_file_the_library_reads():
    from harness.config.schema import compose_config

    cfg = compose_config(["dataset=aime_1983_2023", "library=aime_1983_2023"])
    assert (REPO / cfg.dataset.path).resolve() == (REPO / cfg.library.dataset.path).resolve()
    problems = load_problems(str(REPO / cfg.dataset.path), columns=dict(cfg.dataset.columns))
    assert len(problems) == 975 and len({p.id for p in problems}) == 975
    assert {p.source["year"] for p in problems} == set(range(1983, 2024))


def test_the_same_text_with_another_answer_is_refused_naming_both_rows(tmp_path):
    rows = [ROWS[0], ROWS[1], {"id": "c", "problem": "  what is $1+1$?\n", "answer": "3"}]
    path = _jsonl(tmp_path / "p.jsonl", rows)
    with pytest.raises(ProblemError) as exc:
        load_problems(str(path))
    msg = str(exc.value)
    assert "\n" not in msg
    assert f"{path}, row 3 (line 3) (id c): same problem text" in msg
    assert f"as {path}, row 1 (line 1) (id a) but answer 3 where that one has 2" in msg


def test_the_same_text_with_the_same_answer_loads(tmp_path):
    rows = [ROWS[0], {"id": "c", "problem": "WHAT IS $1+1$?", "answer": "2"}]
    assert [p.id for p in load_problems(str(_jsonl(tmp_path / "p.jsonl", rows)))] == ["a", "c"]


def test_a_duplicate_text_after_the_limit_is_not_read(tmp_path):
    rows = [ROWS[0], ROWS[1], {"id": "c", "problem": "What is $1+1$?", "answer": "3"}]
    assert len(load_problems(str(_jsonl(tmp_path / "p.jsonl", rows)), limit=2)) == 2
