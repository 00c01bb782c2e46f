"""Per-attempt MLflow traces built from a run folder's rows: spans, timing, feedback; off with one switch."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import ModuleType

import pytest

from harness.record.rows import Retrieval, Row
from harness.tracking.log import log_run_dir
from harness.tracking.tracing import span_plan

pytestmark = pytest.mark.usefixtures("fast_mlflow")


def _grafted(row: Row, ttft_s: float | None) -> Row:
    c = dataclasses.replace(row.completion, grafted_tokens=100, prefill_tokens=7, ttft_s=ttft_s,
                            retrieval=Retrieval("toy-1", "f" * 64, 1.0, "exact"))
    return dataclasses.replace(row, condition="graft", group="recurring", completion=c)


def test_a_graft_attempt_has_retrieve_graft_and_decode_spans_split_at_its_first_token(fakerun: ModuleType) -> None:
    row = _grafted(fakerun.make_rows()[0], ttft_s=0.05)  # wall_s 0.25
    plan = span_plan(row, start_ns=1_000)
    assert [(name, start, end) for name, _, start, end, _ in plan] == [
        ("retrieve", 1_000, 1_000), ("graft", 1_000, 50_001_000), ("decode", 50_001_000, 250_001_000)]
    assert plan[0][4]["artifact_id"] == "f" * 64 and plan[0][4]["similarity"] == 1.0
    assert plan[1][4]["grafted_tokens"] == 100 and plan[1][4]["prefill_tokens"] == 7
    assert plan[2][4]["stop_reason"] == "stop" and plan[2][4]["decode_tokens"] == row.completion.decode_tokens


def test_a_baseline_attempt_without_ttft_has_a_zero_length_prefill_that_says_so(fakerun: ModuleType) -> None:
    plan = span_plan(fakerun.make_rows()[0], start_ns=0)
    assert [(n, s, e) for n, _, s, e, _ in plan] == [("prefill", 0, 0), ("decode", 0, 250_000_000)]
    assert plan[0][4]["timing"] == "ttft not recorded"


def test_every_row_becomes_a_trace_of_its_run_with_spans_and_the_score_as_feedback(
    fake_run: Path, sqlite_uri: str, reseal
) -> None:
    import mlflow
    from mlflow import MlflowClient

    summary = json.loads((fake_run / "summary.json").read_text())
    summary["started_at"] = "2026-01-02T03:04:05+00:00"
    (fake_run / "summary.json").write_text(json.dumps(summary))
    reseal(fake_run)  # a start time of our choosing, sealed as the run's own (log_run_dir re-checks the folder)
    uri_before = mlflow.get_tracking_uri()
    run_id = log_run_dir(fake_run, tracking_uri=sqlite_uri, experiment="kvgraft-test")
    client = MlflowClient(tracking_uri=sqlite_uri)
    experiment_id = client.get_run(run_id).info.experiment_id
    traces = client.search_traces(locations=[experiment_id], run_id=run_id, max_results=100)
    assert len(traces) == 3
    traces.sort(key=lambda t: t.info.request_time)
    # placed one after another from the run's start (walls 0.25, 0.375, 0.25 s)
    assert [t.info.request_time - 1767323045000 for t in traces] == [0, 250, 625]
    assert [t.info.execution_duration for t in traces] == [250, 375, 250]
    for trace, row_key in zip(traces, [("toy-1", "0", True), ("toy-1", "1", False), ("toy-2", "0", True)], strict=True):
        assert (trace.info.tags["problem_id"], trace.info.tags["sample"]) == row_key[:2]
        assert trace.info.trace_metadata["mlflow.sourceRun"] == run_id
        assert [s.name for s in trace.data.spans][1:] == ["prefill", "decode"]
        feedback = {a.name: a for a in trace.info.assessments}
        assert feedback["correct"].value is row_key[2]
        assert feedback["correct"].source.source_id == "harness.task.answers.score"
        assert feedback["expected_answer"].value in ("42", "9")
    assert mlflow.get_tracking_uri() == uri_before  # the global URI the exporter needed is restored


def test_tracking_traces_false_leaves_no_trace(fake_run: Path, sqlite_uri: str, reseal) -> None:
    from mlflow import MlflowClient

    config = (fake_run / "config.yaml").read_text()
    (fake_run / "config.yaml").write_text(config.replace("tracking:\n", "tracking:\n  traces: false\n"))
    reseal(fake_run)
    run_id = log_run_dir(fake_run, tracking_uri=sqlite_uri, experiment="kvgraft-test")
    client = MlflowClient(tracking_uri=sqlite_uri)
    experiment_id = client.get_run(run_id).info.experiment_id
    assert client.search_traces(locations=[experiment_id], max_results=10) == []
