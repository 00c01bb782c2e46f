"""The typed run-level figures (harness/record/figures.py) and comparison.json's record (harness/compare/comparison.py): each
writes exactly the JSON the dicts did before them and reads it back to an equal record; older files (no plan, no
ttft_s) still read; a missing required key is a KeyError naming it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import ModuleType

import pytest

from harness.compare.comparison import Comparison, comparison
from harness.record.figures import TOKEN_KINDS, Energy, GroupScores, Scores, Times, Tokens
from harness.record.folder import RunFolder
from harness.record.metrics import summarize_groups, summarize_scores
from harness.record.rows import Group, Summary


def _rows(fakerun: ModuleType, group: Group | None = None) -> list:
    rows = fakerun.make_rows()
    return rows if group is None else [dataclasses.replace(r, group=group.value) for r in rows]


def test_scores_write_the_metrics_dict_exactly_and_read_it_back(fakerun: ModuleType) -> None:
    rows = _rows(fakerun)  # two problems, one with two samples: n_samples 1
    s = Scores.of(rows)
    assert s.to_json() == summarize_scores(rows) and list(s.to_json()) == list(summarize_scores(rows))
    assert Scores.from_json(s.to_json()) == s and s.pass_at == {1: pytest.approx(0.75)}
    assert s.n_rows == 3 and s.correct == 2 and s.accuracy == pytest.approx(0.75)
    four = [dataclasses.replace(r, sample=i) for i, r in enumerate([rows[0]] * 4)]  # one problem, 4 samples
    s4 = Scores.of(four)
    assert s4.to_json() == summarize_scores(four) and set(s4.pass_at) == {1, 4} and "avg@4" in s4.to_json()


def test_group_scores_add_the_decode_total(fakerun: ModuleType) -> None:
    rows = _rows(fakerun, Group.RECURRING)
    groups = GroupScores.by_group(rows)
    assert {g: v.to_json() for g, v in groups.items()} == summarize_groups(rows)
    assert groups["recurring"].decode_tokens == sum(r.completion.decode_tokens for r in rows)
    assert GroupScores.from_json(groups["recurring"].to_json()) == groups["recurring"]


def test_tokens_times_energy_round_trip_and_old_times_keep_their_keys(fakerun: ModuleType) -> None:
    rows = _rows(fakerun)
    t = Tokens.of(rows)
    assert list(t.to_json()) == list(TOKEN_KINDS) and Tokens.from_json(t.to_json()) == t
    assert t.prompt == t.prefill + t.grafted
    old = {"wall_s": 1.5, "cpu_s": 1.0}  # a folder written before ttft_s and run_wall_s
    assert Times.from_json(old).to_json() == old and Times.from_json(old).ttft_s is None
    assert Energy.from_json({"status": "unavailable:x", "joules": None}).measured is False
    with pytest.raises(KeyError, match="n_rows"):
        Scores.from_json({k: v for k, v in Scores.of(rows).to_json().items() if k != "n_rows"})


def test_summary_json_is_unchanged_by_the_types(fakerun: ModuleType) -> None:
    rows = _rows(fakerun, Group.HELD_OUT)
    s = Summary.of(rows, condition="graft", model="m", dataset="d", run_dir="r", comparable_key="k",
                   run_wall_s=2.0, energy_status="unavailable:test", energy_j=None, group=Group.HELD_OUT)
    d = s.to_json()
    assert d["scores"] == summarize_scores(rows) and d["groups"] == summarize_groups(rows)
    assert d["time"]["run_wall_s"] == 2.0 and d["energy"] == {"status": "unavailable:test", "joules": None}
    assert Summary.from_json(json.loads(json.dumps(d))) == s


def test_a_comparison_written_before_plans_still_reads(fakerun: ModuleType, tmp_path: Path) -> None:
    """A format-1 comparison.json (no plan; a baseline without ttft_s) reads as its legacy plan and writes back
    the same JSON."""
    rows = _rows(fakerun)
    summaries = {label: Summary.of(rows, condition=label, model="m", dataset="d", run_dir=label, comparable_key="k",
                                   run_wall_s=1.0, energy_status="unavailable:t", energy_j=None, group=None)
                 for label in ("baseline", "graft (recurring)")}
    folders = {k: RunFolder(tmp_path / k.replace(" ", "_")) for k in summaries}
    d = comparison("k", folders, summaries).to_json()
    del d["summaries"]["baseline"]["time"]["ttft_s"]
    back = Comparison.from_json(json.loads(json.dumps(d)))
    assert not back.plan_recorded and back.plan.labels == ["baseline", "graft (recurring)"]
    assert back.summaries["baseline"].time.ttft_s is None and back.to_json() == d
    vs = back.summaries["graft (recurring)"].comparison
    assert vs is not None and vs.token_reduction == pytest.approx(1.0) and vs.baseline_run == "baseline"
    with pytest.raises(KeyError, match="summaries"):
        Comparison.from_json({"runs": {}})
