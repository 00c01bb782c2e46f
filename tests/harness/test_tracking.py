"""MLflow tracking against a real SQLite store in tmp_path; an unreachable server leaves a pending record."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from harness.tracking.log import log_run_dir, try_log_run_dir
from harness.tracking.store import default_tracking_uri, flatten, metric_leaves

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
    assert run.data.metrics["accuracy"] == pytest.approx(0.75)
    assert run.data.metrics["grafted_tokens_per_row"] == 0
    assert "scores.accuracy" not in run.data.metrics  # the rest of summary.json is its artifact
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
    assert run.data.metrics["accuracy"] == pytest.approx(0.75)

    again = _log_run_script(repo_root, str(fake_run), "--tracking-uri", uri)
    assert again.returncode == 0 and "skip" in again.stdout


def test_log_run_script_fails_clearly_on_a_non_run_folder(tmp_path: Path, repo_root: Path) -> None:
    result = _log_run_script(
        repo_root, str(tmp_path), "--tracking-uri", default_tracking_uri(tmp_path / "runs")
    )
    assert result.returncode == 1
    assert "not a run folder" in result.stderr


@pytest.mark.slow
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


def test_a_logged_run_reads_as_a_reviewer_needs_it(fake_run: Path, sqlite_uri: str, reseal) -> None:
    """Name with condition/dataset/model, the real start and end from summary.json, a description, the
    problem set as a dataset input whose digest is the manifest's, the per-problem table, the experiment kind."""
    from mlflow import MlflowClient

    from harness.record.folder import RunFolder
    from harness.tracking.views import dataset_digest

    summary = json.loads((fake_run / "summary.json").read_text())
    summary["started_at"], summary["finished_at"] = "2026-01-02T03:04:05+00:00", "2026-01-02T03:05:07.500000+00:00"
    (fake_run / "summary.json").write_text(json.dumps(summary))
    reseal(fake_run)  # sealed as the run's own: log_run_dir re-checks the folder
    run_id = log_run_dir(fake_run, tracking_uri=sqlite_uri, experiment="kvgraft-test", traces=False)
    client = MlflowClient(tracking_uri=sqlite_uri)
    run = client.get_run(run_id)
    # condition (+ group) first, then what else differs, then the answer (accuracy and its interval)
    assert run.info.run_name.startswith("baseline | toy n=2 | toy-model | 64 tokens | accuracy 0.750 [")
    assert run.info.end_time - run.info.start_time == 62_500
    assert run.info.start_time == 1767323045000
    assert {"condition": "baseline", "model": "toy-model", "dataset": "toy"}.items() <= run.data.tags.items()
    assert "accuracy 0.750" in run.data.tags["mlflow.note.content"]
    [dataset_input] = run.inputs.dataset_inputs
    manifest = RunFolder(fake_run).read_manifest()
    assert dataset_input.dataset.name == "toy"
    assert dataset_input.dataset.digest == dataset_digest(manifest) and len(dataset_input.dataset.digest) == 32
    assert json.loads(dataset_input.dataset.profile)["num_rows"] == 2
    table = json.loads(Path(client.download_artifacts(run_id, "outputs_table.json")).read_text())
    rows = [dict(zip(table["columns"], r, strict=True)) for r in table["data"]]
    assert [(r["problem_id"], r["sample"], r["extracted"], r["gold"], r["correct"]) for r in rows] == [
        ("toy-1", 0, "42", "42", True), ("toy-1", 1, "32", "42", False), ("toy-2", 0, "9", "9", True)]
    assert {"decode_tokens", "grafted_tokens", "prefill_tokens", "ttft_s", "entry_id", "similarity",
            "stop_reason"} <= set(table["columns"])
    experiment = client.get_experiment_by_name("kvgraft-test")
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"


def test_a_folder_without_recorded_times_uses_its_summary_mtime_and_run_wall(fake_run: Path, sqlite_uri: str) -> None:
    from mlflow import MlflowClient

    mtime = (fake_run / "summary.json").stat().st_mtime
    run_id = log_run_dir(fake_run, tracking_uri=sqlite_uri, experiment="kvgraft-test", traces=False)
    info = MlflowClient(tracking_uri=sqlite_uri).get_run(run_id).info
    assert info.end_time == int(mtime * 1000) and info.end_time - info.start_time == 2500  # run_wall_s 2.5


def test_a_closed_http_port_marks_the_run_pending_within_seconds(
    fake_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MLflow's own defaults (7 retries, 120 s timeout) wait minutes on a dead port; we fail in seconds."""
    import socket
    import time

    for var in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT"):
        monkeypatch.delenv(var, raising=False)
    with socket.socket() as s:  # a port that was free a moment ago and now has no listener
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.perf_counter()
    with pytest.warns(RuntimeWarning, match="not reachable"):
        assert try_log_run_dir(fake_run, tracking_uri=f"http://127.0.0.1:{port}", experiment="x") is None
    assert time.perf_counter() - t0 < 10
    pending = json.loads((fake_run / "tracking.json").read_text())
    assert pending["pending"] is True and "not reachable" in pending["reason"]


def test_http_fail_fast_bounds_mlflow_retries_only_for_http_and_only_while_logging(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import os
    import socket

    from harness.tracking.store import http_fail_fast

    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "3")  # the user's setting wins
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        with http_fail_fast(f"http://127.0.0.1:{server.getsockname()[1]}", retries=1, timeout_s=5):
            assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "1"
            assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "3"
    assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ
    with http_fail_fast("sqlite:////tmp/x.db", retries=1):
        assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ


def test_the_comparison_is_the_parent_run_of_the_runs_it_compares_with_plots(
    tmp_path: Path, sqlite_uri: str, fakerun: ModuleType
) -> None:
    """What the dashboard screenshots rely on: short distinct names, headline metrics under short names, the
    comparison's params, identical rows as k and n, a description with the figures linking the summary page,
    the per-problem table, and the library recorded as a nested run with its time and size."""
    from mlflow import MlflowClient

    from harness.compare import per_problem
    from harness.compare.comparison import Factors, JobLoad, LibraryRecord, PairResult, RunLoad, comparison
    from harness.compare.mlflow_runs import log_comparison
    from harness.compare.pairing import Pairing
    from harness.compare.plan import Plan
    from harness.record.folder import RunFolder
    from harness.tracking.views import HEADLINE_COLUMNS

    folders = {label: RunFolder(fakerun.build_fake_run(tmp_path / name))
               for label, name in [("baseline", "base"), ("graft (held-out)", "graft-held_out")]}
    children = {label: log_run_dir(f.path, tracking_uri=sqlite_uri, experiment="kvgraft-test", traces=False)
                for label, f in folders.items()}
    result = comparison("k" * 64, folders, {label: f.read_summary() for label, f in folders.items()})
    pairs = {"held_out": PairResult(str(folders["graft (held-out)"].path), "/x/incontext", Pairing(3, 0, []),
                                    Factors(prefill_factor=4.0, ttft_factor=2.5))}
    result = dataclasses.replace(
        result, pairs=pairs, plan=Plan.of_comparison({"runs": result.runs, "pairs": pairs}),
        load=JobLoad(2, {"baseline": RunLoad(0.5, 3.5)}),
        library=LibraryRecord(name="toylib", version=1, path="/x/lib", entries=2, tokens=300, bytes=1_234_567,
                              built=True, seconds=12.5, started_at=1767225600.0))
    table = per_problem.per_problem({k: f.read_rows() for k, f in folders.items()}, {})
    path = tmp_path / "compare" / "2026-01-01_00-00-00-000000" / "comparison.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(result.to_json()))
    parent = log_comparison(path, result, tracking_uri=sqlite_uri, experiment="kvgraft-test", per_problem=table,
                            params={"dataset": "toy", "limit": 2, "max_new_tokens": 16, "model": "toy-model",
                                    "library": "toylib-v1"})

    client = MlflowClient(tracking_uri=sqlite_uri)
    for child in children.values():
        tags, metrics = client.get_run(child).data.tags, client.get_run(child).data.metrics
        assert tags["compare_run"] == parent and "mlflow.parentRunId" not in tags  # listed flat, linked
        assert "Compared in [compare | toy n=" in tags["mlflow.note.content"]
        # every row of the headline view fills every column (but a factor of a figure the run lacks: these fake
        # runs record no TTFT)
        assert set(HEADLINE_COLUMNS) - {"baseline/run ttft"} <= set(metrics)
    graft = client.get_run(children["graft (held-out)"]).data.metrics
    assert graft["twin.identical_rows"] == 3 and graft["twin.paired_rows"] == 3
    base = client.get_run(children["baseline"]).data.metrics
    assert base["twin.paired_rows"] == 0 and base["baseline/run ttft"] == 1.0
    run = client.get_run(parent)
    assert run.info.run_name.startswith(
        "compare | toy n=2 | toy-model | 64 tokens | 2026-01-01 00:00 | accuracy baseline 0.750")
    assert run.info.run_name.endswith("; twins identical 3/3")  # the answer is the first line of the parent's page
    assert run.data.params == {"dataset": "toy", "limit": "2", "max_new_tokens": "16", "model": "toy-model",
                               "library": "toylib-v1"}
    m = run.data.metrics
    assert m["graft_held_out.accuracy"] == pytest.approx(0.75) and "graft_held_out.accuracy_ci_low" in m
    assert m["graft_held_out.decode_tokens_per_problem"] > 0 and "graft_held_out.ttft_s_per_row" in m
    assert m["baseline_over_graft_held_out_decode_tokens"] == pytest.approx(1.0)
    assert m["held_out.identical_rows"] == 3 and m["held_out.paired_rows"] == 3
    assert m["incontext_over_graft_held_out_ttft"] == 2.5 and m["load_average_max"] == 3.5
    assert len(m) < 30 and not any(k.startswith(("pairs.", "baseline.comparison")) for k in m)
    note = run.data.tags["mlflow.note.content"]
    assert "0.750 [" in note and "held_out: 3/3 graft rows identical" in note and "baseline / run" in note
    assert "| graft (held-out) | 0.750 [" in note and "| 3/3 |" in note  # the twin column
    assert f"#/experiments/{run.info.experiment_id}/runs/{parent}/artifacts/summary.html?workflowType" in note
    assert "machine was loaded" in note  # load 3.5 on 2 cores
    starts = [client.get_run(c).info.start_time for c in children.values()]
    assert run.info.start_time == 1767225600000  # the library build began the job
    assert run.info.end_time >= max(starts)
    names = {a.path for a in client.list_artifacts(parent)}
    assert {"comparison.json", "summary.html", "per_problem_table.json"} <= names
    page = (path.parent / "summary.html").read_text()
    assert "graft (held-out)" in page and "data:image/png;base64," in page and "toy-1" in page
    plots = {a.path for a in client.list_artifacts(parent, "plots")}
    assert plots == {"plots/accuracy.png", "plots/decode_tokens.png", "plots/ttft.png"}
    assert all((path.parent / Path(p).name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in plots)
    query = f"tags.mlflow.parentRunId = '{parent}' and tags.job = 'library'"
    [lib] = client.search_runs([run.info.experiment_id], query)
    assert lib.info.run_name == "library toylib v1" and lib.data.metrics["build_s"] == 12.5
    assert lib.data.metrics["bytes"] == 1_234_567 and lib.data.metrics["entries"] == 2
    assert lib.info.end_time - lib.info.start_time == 12_500
    view = json.loads(client.get_experiment(run.info.experiment_id).tags["mlflow.sharedViewState.kvgraft-headline"])
    assert view["selectedColumns"] == [f"metrics.`{m}`" for m in HEADLINE_COLUMNS]
    assert view["searchFilter"] == "metrics.accuracy >= 0" and view["columnOrder"][0] == "attributes.`Run Name`"
    assert "viewStateShareKey=kvgraft-headline" in note
    everything = client.search_runs([run.info.experiment_id])
    # names say what differs (both fake runs are baselines: a compare job's differ in condition and group)
    names = {r.info.run_name for r in everything} - {"library toylib v1", run.info.run_name}
    assert len(names) == 1 and names.pop().startswith("baseline | toy n=2 | toy-model | 64 tokens | accuracy ")
