"""MLflow tracking against a real SQLite store in tmp_path; an unreachable server leaves a pending record."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from harness.tracking import default_tracking_uri, flatten, log_run_dir, metric_leaves, try_log_run_dir

pytestmark = pytest.mark.usefixtures("fast_mlflow")


def _log_run_script(repo_root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(repo_root / "scripts" / "log_run.py"), *args],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def test_default_uri_is_absolute_sqlite(tmp_path: Path) -> None:
    uri = default_tracking_uri(tmp_path / "runs")
    assert uri == f"sqlite:///{tmp_path}/runs/mlflow.db"
    assert uri.startswith("sqlite:////")


def test_flatten_dots_keys_encodes_lists_and_truncates() -> None:
    flat = flatten({"a": {"b": 1, "c": [1, "x"], "d": None, "e": {}}, "s": "x" * 7000, "t": True})
    assert flat == {"a.b": "1", "a.c": '[1, "x"]', "a.d": "null", "a.e": "{}", "s": "x" * 6000, "t": "true"}


def test_metric_leaves_skip_none_bools_and_strings() -> None:
    summary = {
        "condition": "graft",
        "scores": {"accuracy": 0.5, "pass@1": 0.5, "flag": True, "ci": None},
        "groups": {"recurring": {"accuracy": 1.0}},
        "comparison": {"token_reduction": 0.25},
    }
    assert dict(metric_leaves(summary)) == {
        "scores.accuracy": 0.5,
        "scores.pass_at_1": 0.5,
        "groups.recurring.accuracy": 1.0,
        "comparison.token_reduction": 0.25,
    }


def test_log_run_dir_writes_params_metrics_tags_artifacts(
    fake_run: Path, tmp_path: Path, sqlite_uri: str
) -> None:
    from mlflow import MlflowClient

    uri = sqlite_uri
    run_id = log_run_dir(fake_run, tracking_uri=uri, experiment="kvgraft-test", extra_tags={"note": "unit"})

    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(run_id)
    manifest = json.loads((fake_run / "manifest.json").read_text())
    assert run.info.status == "FINISHED"
    assert run.data.params["decoding.max_new_tokens"] == "64"
    assert run.data.params["condition.name"] == "baseline"
    assert run.data.metrics["scores.accuracy"] == pytest.approx(0.75)
    assert run.data.metrics["tokens.grafted"] == 0
    assert run.data.tags["condition"] == "baseline"
    assert run.data.tags["model_fingerprint"] == "a" * 64
    assert run.data.tags["tokenizer_fingerprint"] == "b" * 64
    assert run.data.tags["manifest_sha256"] == manifest["manifest_sha256"]
    assert run.data.tags["run_dir"] == str(fake_run.resolve())
    assert run.data.tags["note"] == "unit"
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert {"manifest.json", "outputs.jsonl", "summary.json", "config.yaml", "problems.jsonl"} <= artifacts
    assert run.info.artifact_uri.startswith((tmp_path / "runs").as_uri())  # not ./mlruns in the cwd
    assert json.loads((fake_run / "tracking.json").read_text()) == {
        "tracking_uri": uri,
        "experiment": "kvgraft-test",
        "run_id": run_id,
    }


def test_unreachable_server_leaves_pending_record_then_log_run_logs_it(
    fake_run: Path, sqlite_uri: str, repo_root: Path
) -> None:
    with pytest.warns(RuntimeWarning, match="log it later"):
        run_id = try_log_run_dir(fake_run, tracking_uri="http://127.0.0.1:9", experiment="kvgraft-test")
    assert run_id is None
    pending = json.loads((fake_run / "tracking.json").read_text())
    assert pending["pending"] is True
    assert pending["tracking_uri"] == "http://127.0.0.1:9"
    assert pending["reason"]
    assert {"config.yaml", "manifest.json", "outputs.jsonl", "summary.json"} <= {
        p.name for p in fake_run.iterdir()
    }

    uri = sqlite_uri
    done = _log_run_script(repo_root, str(fake_run), "--tracking-uri", uri)
    assert done.returncode == 0, done.stdout + done.stderr
    record = json.loads((fake_run / "tracking.json").read_text())
    assert record["experiment"] == "kvgraft-test"  # from the run's config tracking.experiment
    from mlflow import MlflowClient

    run = MlflowClient(tracking_uri=uri).get_run(record["run_id"])
    assert run.data.metrics["scores.accuracy"] == pytest.approx(0.75)

    again = _log_run_script(repo_root, str(fake_run), "--tracking-uri", uri)
    assert again.returncode == 0 and "skip" in again.stdout


def test_log_run_script_fails_clearly_on_a_non_run_folder(tmp_path: Path, repo_root: Path) -> None:
    result = _log_run_script(
        repo_root, str(tmp_path), "--tracking-uri", default_tracking_uri(tmp_path / "runs")
    )
    assert result.returncode == 1
    assert "not a run folder" in result.stderr


def test_parallel_jobs_share_one_sqlite_store(tmp_path: Path, fakerun: ModuleType, repo_root: Path) -> None:
    """Three processes creating and logging to one new store at once (parallel Hydra jobs) all succeed.

    Without the init lock, concurrent schema creation fails ("duplicate column name"); without retries,
    concurrent writes fail with "database is locked".
    """
    runs = [fakerun.build_fake_run(tmp_path / f"run{i}") for i in range(3)]
    uri = default_tracking_uri(tmp_path / "runs")  # does not exist yet: every job races to create it
    procs = [
        subprocess.Popen(
            [sys.executable, str(repo_root / "scripts" / "log_run.py"), str(r), "--tracking-uri", uri],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in runs
    ]
    outs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("kvgraft-test")
    assert experiment is not None
    assert len(client.search_runs([experiment.experiment_id])) == 3


def test_log_comparison_logs_each_runs_figures_under_a_slug(tmp_path: Path, sqlite_uri: str) -> None:
    from mlflow import MlflowClient

    from harness.tracking import log_comparison

    comparison = {
        "comparable_key": "k" * 64,
        "runs": {"baseline": "runs/baseline/a", "graft (held-out)": "runs/graft/b-held_out"},
        "summaries": {
            "baseline": {"scores": {"accuracy": 0.0}, "comparison": None},
            "graft (held-out)": {"scores": {"accuracy": 0.5}, "comparison": {"token_reduction": 3.25}},
        },
    }
    path = tmp_path / "compare" / "stamp" / "comparison.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(comparison))
    run_id = log_comparison(path, comparison, tracking_uri=sqlite_uri, experiment="kvgraft-test")
    run = MlflowClient(tracking_uri=sqlite_uri).get_run(run_id)
    assert run.data.metrics["graft_held_out.comparison.token_reduction"] == 3.25
    assert run.data.metrics["baseline.scores.accuracy"] == 0.0
    assert run.data.tags["run.graft_held_out"] == "runs/graft/b-held_out" and run.data.tags["job"] == "compare"
    assert run.info.run_name == "compare-stamp"
