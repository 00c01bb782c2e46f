"""scripts/scales_table.py: the two-scales table (accuracy with Wilson 95% intervals per condition, and the
problems a graft turned from wrong to right and from right to wrong against the model alone), read from compare
folders. On the tiny random-weight model: the plumbing, with every figure recomputed here from the rows."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from harness.compare import job as compare
from harness.record.folder import RunFolder
from harness.record.metrics import wilson_interval
from scripts import scales_table

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("scales")
    result = compare.main([
        "model=tiny_gemma3", f"project_root={REPO}", f"runs_dir={tmp}/runs", "dataset.limit=3",
        "decoding.max_new_tokens=2", "tracking=off", f"library.root={tmp}/library", f"library.store={tmp}/store"])
    [folder] = (tmp / "runs" / "compare").glob("*/comparison.json")
    return folder.parent, result


def test_the_table_holds_each_condition_with_its_interval_and_the_flips(compared, tmp_path, capsys):
    folder, result = compared
    out_json, out_md = tmp_path / "t.json", tmp_path / "t.md"
    assert scales_table.main(["small=" + str(folder), "big=" + str(folder), "--slice", f"big={folder}",
                              "--json", str(out_json), "--markdown", str(out_md)]) == 0
    report = json.loads(out_json.read_text())
    assert list(report) == ["small", "big"]
    rows = {label: RunFolder(path).read_rows() for label, path in result.runs.items()}
    alone = {r.problem_id: r.correct for r in rows["baseline"]}
    for label, rs in rows.items():
        k, n = sum(r.correct for r in rs), len(rs)
        got = report["small"]["conditions"][label]
        assert (got["correct"], got["n"]) == (k, n) == (got["correct"], 3)
        assert got["ci95"] == [round(x, 4) for x in wilson_interval(k, n)]
        if label != "baseline":
            f = report["small"]["per_problem"][label]
            assert f["wrong_to_right"] == [r.problem_id for r in rs if r.correct and not alone[r.problem_id]]
            assert f["right_to_wrong"] == [r.problem_id for r in rs if not r.correct and alone[r.problem_id]]
    s = report["big"]["slice"]
    assert s["problems"] == 3 and s["graft==incontext"] == {"graft (recurring)": "3/3", "graft (held-out)": "3/3"}
    text = capsys.readouterr().out
    assert text == out_md.read_text() and text.startswith("| model | baseline | incontext (recurring) |")
    assert "| small | " in text and "vs alone: wrong -> right" in text


def test_flips_name_the_problems_a_condition_changed_against_the_model_alone(compared):
    _, result = compared
    alone = RunFolder(result.runs["baseline"]).read_rows()
    right = {alone[0].problem_id, alone[1].problem_id}  # alone: right on the first two problems
    alone = [dataclasses.replace(r, correct=r.problem_id in right) for r in alone]
    other = [dataclasses.replace(r, correct=r.problem_id in {alone[1].problem_id, alone[2].problem_id}) for r in alone]
    assert scales_table.flips(alone, other) == {"wrong_to_right": [alone[2].problem_id],
                                                "right_to_wrong": [alone[0].problem_id]}


def test_a_folder_without_a_comparison_is_named(tmp_path):
    with pytest.raises(SystemExit, match=f"{tmp_path}: no comparison.json"):
        scales_table.main([f"x={tmp_path}"])
    with pytest.raises(SystemExit, match="write MODEL=COMPARE_FOLDER"):
        scales_table.main([str(tmp_path)])
