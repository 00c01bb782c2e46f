"""Tracking for parallel jobs: a real `mlflow server` on 127.0.0.1 (started by this module, stopped after it), N
processes logging run folders to it at once with nothing lost, and a dead server failing fast with the run left
pending, as with any unreachable tracking URI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.config.schema import compose_config
from harness.tracking.log import try_log_run_dir
from harness.tracking.server import MlflowServer, free_port

REPO = Path(__file__).resolve().parents[2]
N_JOBS = 6


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with MlflowServer(tmp_path_factory.mktemp("mlflow-server")) as s:
        yield s


def test_the_server_config_composes_to_an_http_uri():
    cfg = compose_config(["tracking=server"])
    assert cfg.tracking.uri == "http://127.0.0.1:5000" and cfg.tracking.enabled
    assert compose_config(["tracking=server", "tracking.uri=http://10.0.0.5:5001"]).tracking.uri.endswith(":5001")


def test_parallel_jobs_log_every_run_to_the_server_with_nothing_lost(server, fakerun, tmp_path):
    from mlflow import MlflowClient

    folders = [fakerun.build_fake_run(tmp_path / f"run{i}") for i in range(N_JOBS)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}
    procs = [subprocess.Popen([sys.executable, str(REPO / "scripts" / "log_run.py"), str(f), "--tracking-uri",
                               server.uri, "--experiment", "parallel"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for f in folders]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * N_JOBS, [o[1][-2000:] for o in outs]
    run_ids = {json.loads((f / "tracking.json").read_text())["run_id"] for f in folders}
    assert len(run_ids) == N_JOBS
    client = MlflowClient(tracking_uri=server.uri)
    experiment = client.get_experiment_by_name("parallel")
    logged = client.search_runs([experiment.experiment_id], max_results=100)
    assert {r.info.run_id for r in logged} == run_ids
    for r in logged:  # every run complete: its metrics and its artifacts (proxied into the server's folder)
        assert r.info.status == "FINISHED" and r.data.metrics
        assert client.list_artifacts(r.info.run_id)
    assert (server.runs / "mlflow-server.db").is_file()


def test_a_dead_server_fails_fast_and_leaves_the_run_pending(fakerun, tmp_path):
    folder = fakerun.build_fake_run(tmp_path / "run")
    uri = f"http://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    with pytest.warns(RuntimeWarning, match="not reachable"):
        assert try_log_run_dir(folder, tracking_uri=uri, experiment="x") is None
    assert time.monotonic() - t0 < 15
    record = json.loads((folder / "tracking.json").read_text())
    assert record["pending"] is True and record["tracking_uri"] == uri
