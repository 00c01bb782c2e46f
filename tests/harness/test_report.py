"""`make report`: one table and plots across the runs of a sweep (here a 2x2 sweep of hand-built run folders)."""

from __future__ import annotations

import math
from pathlib import Path
from types import ModuleType

import pytest

from harness.compare.report import main, sweep_table
from harness.record.folder import RunFolder
from harness.record.rows import Summary

pytestmark = pytest.mark.usefixtures("fast_mlflow")


def _sweep(root: Path, fakerun: ModuleType) -> Path:
    """runs/multirun/<stamp>/<job>_baseline for max_new_tokens in (16, 32) x n_samples in (1, 2); the second
    job of each size records energy, so the table must show joules for some and NaN (not 0) for others."""
    sweep = root / "multirun" / "2026-01-01_00-00-00-000000"
    rows = fakerun.make_rows()
    for job, (tokens, samples) in enumerate([(16, 1), (16, 2), (32, 1), (32, 2)]):
        folder = RunFolder(sweep / f"{job}_baseline")
        config = {**fakerun.CONFIG, "decoding": {**fakerun.CONFIG["decoding"], "max_new_tokens": tokens,
                                                 "samples": samples}, "runs_dir": f"/elsewhere/{job}"}
        summary = Summary.of(rows[: 1 + job % 3], condition="baseline", model="toy-model", dataset="toy",
                             run_dir=str(folder.path), comparable_key=None, run_wall_s=1.0 + job,
                             energy_status="measured:rapl" if samples == 2 else "unavailable:no meter",
                             energy_j=2.5 * tokens if samples == 2 else None, group=None)
        folder.finish(config=config, problems=fakerun.PROBLEMS, rows=rows[: 1 + job % 3], summary=summary,
                      prompt_template=fakerun.PROMPT_TEMPLATE, model_fingerprint="a" * 64,
                      tokenizer_fingerprint="b" * 64, determinism={}, environment={})
    return sweep


def test_the_sweep_table_has_one_row_per_run_with_the_swept_keys_and_figures(tmp_path: Path, fakerun: ModuleType):
    df = sweep_table(_sweep(tmp_path, fakerun))
    assert list(df["run"]) == ["0_baseline", "1_baseline", "2_baseline", "3_baseline"]
    swept = [c for c in df.columns if c.startswith("decoding.")]
    assert swept == ["decoding.max_new_tokens", "decoding.samples"]  # runs_dir differs too, but says nothing
    assert list(df["decoding.max_new_tokens"]) == [16, 16, 32, 32]
    assert list(df["accuracy"]) == [1.0, 0.5, 0.75, 1.0]
    assert list(df["n"]) == [1, 2, 3, 1]
    assert all(lo <= a <= hi for lo, a, hi in zip(df["ci_low"], df["accuracy"], df["ci_high"], strict=True))
    assert df["energy_j"][1] == 40.0 and math.isnan(df["energy_j"][0])  # unavailable is NaN, never 0


def test_make_report_writes_its_table_and_plots_and_logs_them(tmp_path: Path, fakerun: ModuleType,
                                                              sqlite_uri: str) -> None:
    from mlflow import MlflowClient

    from harness.tracking.log import log_run_dir

    sweep = _sweep(tmp_path, fakerun)
    jobs = {log_run_dir(p, tracking_uri=sqlite_uri, experiment="kvgraft-test", traces=False)
            for p in sorted(sweep.glob("*_baseline"))}
    assert main([str(sweep), "--tracking-uri", sqlite_uri, "--experiment", "kvgraft-test"]) == 0
    out = sweep / "report"
    names = sorted(p.name for p in out.iterdir())
    assert names == ["accuracy.png", "decode_tokens.png", "energy.png", "report.csv", "report.md", "wall_time.png"]
    assert (out / "report.md").read_text().count("_baseline |") == 4
    client = MlflowClient(tracking_uri=sqlite_uri)
    eid = client.get_experiment_by_name("kvgraft-test").experiment_id
    [run] = client.search_runs([eid], "tags.job = 'report'")
    assert run.info.run_name == f"report {sweep.name}"
    linked = client.search_runs([eid], f"tags.report_run = '{run.info.run_id}'")
    assert {r.info.run_id for r in linked} == jobs  # the report links its sweep's jobs (each stays a row)
    assert run.data.metrics["jobs"] == 4 and run.data.metrics["job_1.accuracy"] == 0.5
    assert "job_3.ci_low" in run.data.metrics and run.info.end_time > run.info.start_time
    assert "| 1_baseline | 0.500 [" in run.data.tags["mlflow.note.content"]
    assert {a.path for a in client.list_artifacts(run.info.run_id)} >= {"report.csv", "report_table.json",
                                                                        "accuracy.png"}


def test_a_folder_without_runs_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--no-mlflow"])
    assert "no complete run folder" in capsys.readouterr().err



def test_the_terminal_table_is_narrow_and_uncut(tmp_path: Path, fakerun: ModuleType,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    from harness.compare.report import print_table

    print_table(sweep_table(_sweep(tmp_path, fakerun)), "report over 4 jobs")
    out = capsys.readouterr().out
    assert "…" not in out and max(len(line) for line in out.splitlines()) <= 80
    assert "1_baseline" in out and "0.50 [" in out


def test_an_edited_run_stops_the_report_naming_its_first_difference(tmp_path: Path, fakerun: ModuleType,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 51, item 2: the report read each run's summary as found; a row edited after the run (its `correct`
    flipped) is refused now, through the audit behind `make rescore`, and no table or plot is written."""
    import json

    sweep = _sweep(tmp_path, fakerun)
    outputs = sweep / "2_baseline" / "outputs.jsonl"
    lines = outputs.read_text().splitlines()
    row = json.loads(lines[1])
    row["correct"] = not row["correct"]
    lines[1] = json.dumps(row)
    outputs.write_text("\n".join(lines) + "\n")
    with pytest.raises(SystemExit):
        main([str(sweep), "--no-mlflow"])
    err = capsys.readouterr().err
    assert "2_baseline does not re-check" in err and "outputs.jsonl line 2" in err and "make rescore" in err
    assert not (sweep / "report").exists()
