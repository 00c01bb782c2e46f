"""maj@k (harness.record.metrics.majority_vote, summarize_scores) and the overlong count: the vote, its tie rule (the
earliest-sampled of the tied answers), samples without an answer (no vote), all-overlong problems, and a summary
written before maj@k existed still re-checks."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import ModuleType

import pytest

from harness.record.audit import audit
from harness.record.folder import RunFolder
from harness.record.hashing import sha256_json
from harness.record.metrics import majority_vote, summarize_scores


def _rewrite_summary(run: Path, summary: dict) -> None:
    """Replace summary.json and re-seal the manifest over it, as a run that wrote this summary would have."""
    (run / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True))
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["outputs"]["summary_sha256"] = sha256_json(summary)
    manifest["manifest_sha256"] = sha256_json({k: v for k, v in manifest.items() if k != "manifest_sha256"})
    (run / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))


def _rows(answers: dict[str, list[int | None]], gold: dict[str, int], overlong: bool = False) -> list[dict]:
    return [{"problem_id": pid, "sample": i, "answer": a, "correct": a == gold[pid],
             **({"overlong": a is None} if overlong else {})}
            for pid, ans in answers.items() for i, a in enumerate(ans)]


def test_the_most_frequent_answer_wins_and_a_tie_goes_to_the_earliest_sampled() -> None:
    assert majority_vote([5, 7, 7, 5, 7], [True, False, False, True, False]) is False  # 7 has 3 votes
    assert majority_vote([5, 7, 7, 5], [True, False, False, True]) is True  # 2-2 tie: 5 was sampled first
    assert majority_vote([7, 5, 5, 7], [False, True, True, False]) is False  # 2-2 tie: 7 was sampled first
    assert majority_vote([9, 5, 7], [False, True, False]) is False  # all tied at 1: the first sample's answer


def test_samples_without_an_answer_cast_no_vote() -> None:
    # three no-answers do not outvote one answer
    assert majority_vote([None, None, 42, None], [False, False, True, False]) is True
    assert majority_vote([None, None], [False, False]) is False  # no answer at all: wrong


def test_maj_at_k_in_the_summary_with_ties_and_no_answers() -> None:
    rows = _rows({"a": [3, 4, 4, 3], "b": [None, None, None, None], "c": [1, 2, 2, 2]}, {"a": 3, "b": 0, "c": 2})
    s = summarize_scores(rows)
    assert s["maj@4"] == pytest.approx(2 / 3)  # a: tie 3/4, 3 first -> right; b: no answer; c: 2 -> right
    assert s["avg@4"] == pytest.approx((2 / 4 + 0 + 3 / 4) / 3)
    assert s["overlong"] == 0 and s["overlong_rate"] == 0.0
    assert list(s)[-3:] == ["maj@4", "overlong", "overlong_rate"]


def test_all_overlong_rows_have_no_vote_and_are_counted() -> None:
    rows = _rows({"a": [None, None], "b": [None, 8]}, {"a": 1, "b": 8}, overlong=True)
    s = summarize_scores(rows)
    assert s["maj@2"] == pytest.approx(0.5)  # a: every sample overlong -> wrong; b: the one answer votes
    assert s["overlong"] == 3 and s["overlong_rate"] == pytest.approx(3 / 4)


def test_rows_without_answers_keep_the_old_keys() -> None:
    s = summarize_scores([{"problem_id": "a", "sample": 0, "correct": True}])
    assert not any(k.startswith("maj@") or k.startswith("overlong") for k in s)


def test_a_summary_written_before_maj_at_k_still_rechecks(fakerun: ModuleType, tmp_path: Path) -> None:
    """An older folder's summary has no maj@k / overlong: the audit does not count that as a difference (it
    recomputes them), but a wrong recorded maj@k is a finding."""
    run = fakerun.build_fake_run(tmp_path / "run")
    folder = RunFolder(run)
    summary = json.loads((run / "summary.json").read_text())
    assert "maj@1" in summary["scores"] and summary["scores"]["overlong"] == 0
    old = {**summary, "scores": {k: v for k, v in summary["scores"].items()
                                 if not k.startswith(("maj@", "overlong"))}}
    _rewrite_summary(run, old)
    check = audit(folder)
    assert check.ok, check.findings
    assert "maj@1" in check.scores and "maj@1" not in check.recorded_scores
    wrong = {**summary, "scores": {**summary["scores"], "maj@1": 0.0}}
    _rewrite_summary(run, wrong)
    assert any("scores.maj@1" in f for f in audit(folder).findings)


def test_mlflow_headline_metrics_carry_maj_at_k_and_the_overlong_rate(fakerun: ModuleType) -> None:
    from harness.record.rows import Summary
    from harness.tracking.views import headline_metrics

    rows = [dataclasses.replace(r, sample=i) for i, r in enumerate([fakerun.make_rows()[0]] * 4)]  # 4 samples
    s = Summary.of(rows, condition="baseline", model="m", dataset="d", run_dir="r", comparable_key=None,
                   run_wall_s=1.0, energy_status="unavailable:test", energy_j=None, group=None)
    metrics = headline_metrics(s)
    assert metrics["maj_at_4"] == s.scores.maj_at[4] and metrics["overlong_rate"] == 0.0
