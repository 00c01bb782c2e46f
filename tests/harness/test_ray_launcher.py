"""`hydra/launcher=ray_cluster`: a sweep's jobs as Ray tasks on a local Ray cluster that this module starts on
127.0.0.1 (`ray start --head --block`, token auth off as for any private test cluster) and stops after it. Two
values give two run folders; both re-score, and their rows equal, token for token, a single-process run of the
same config (Ray's per-task OMP_NUM_THREADS is pinned to determinism.threads by the launcher config); both jobs log
to a real `mlflow server` (harness.tracking.server, started on 127.0.0.1 by this module) and both runs are there.
Skipped, saying why, where ray or hydra-ray-launcher is not installed (`make setup-ray`)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="needs ray: make setup-ray")
pytest.importorskip("hydra_plugins.hydra_ray_launcher", reason="needs hydra-ray-launcher: make setup-ray")

from harness.tracking.server import MlflowServer  # noqa: E402
from kvstore.testing.local_s3 import free_ports  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
RAY = Path(sys.executable).parent / "ray"


def _env(**extra: str) -> dict[str, str]:
    # RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0: Ray's single-node mode, every server on 127.0.0.1 (--node-ip-address=127.0.0.1
    # alone is resolved to the machine's address); auth off is then only reachable from this machine
    return {**os.environ, "PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
            **extra}


@pytest.fixture(scope="module")
def ray_cluster():
    """A one-node Ray cluster on 127.0.0.1 with 2 CPUs; yields its address. Its processes form one process group
    (started in a new session), which is what is stopped: nothing else's Ray is touched."""
    temp = Path(tempfile.mkdtemp(prefix="kvr-"))  # short: Ray's socket paths must fit in 107 bytes
    gcs, manager, dash = free_ports(3)
    args = [str(RAY), "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={gcs}",
            f"--node-manager-port={manager}", f"--dashboard-agent-listen-port={dash}", "--num-cpus=2",
            "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp}"]
    log = open(temp / "ray-start.log", "wb")
    proc = subprocess.Popen(args, env=_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    address = f"127.0.0.1:{gcs}"
    deadline = time.monotonic() + 120
    try:
        while True:
            status = subprocess.run([str(RAY), "status", f"--address={address}"], env=_env(), capture_output=True,
                                    text=True, timeout=60)
            if status.returncode == 0 and "Active" in status.stdout:
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ray start failed: {(temp / 'ray-start.log').read_text()[-2000:]}")
            time.sleep(1)
        yield address
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
                proc.wait(20)
                break
            except (ProcessLookupError, subprocess.TimeoutExpired):
                continue
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    with MlflowServer(tmp_path_factory.mktemp("mlflow-server")) as s:
        yield s


def _rows(folder: Path) -> list[tuple]:
    from harness.record.folder import RunFolder

    return [(r.problem_id, r.sample, r.completion.context_ids, r.completion.token_ids, r.completion.text, r.correct)
            for r in RunFolder(folder).read_rows()]


COMMON = ["model=tiny_gemma3", "condition=baseline", "dataset.limit=2"]


@pytest.mark.slow
def test_a_two_value_sweep_on_ray_gives_two_folders_that_rescore_log_to_mlflow_and_equal_a_single_process_run(
        ray_cluster, mlflow_server, tmp_path):
    from mlflow import MlflowClient

    sweep = subprocess.run(
        [sys.executable, "-m", "harness", "-m", "hydra/launcher=ray_cluster", *COMMON, f"project_root={REPO}",
         f"runs_dir={tmp_path}/ray", "decoding.max_new_tokens=2,3", "tracking=server",
         f"tracking.uri={mlflow_server.uri}", "tracking.experiment=ray-sweep"],
        env=_env(RAY_ADDRESS=ray_cluster), cwd=REPO, capture_output=True, text=True, timeout=500)
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    folders = sorted((tmp_path / "ray" / "multirun").glob("*/*_baseline_*"))  # job folders name the swept values
    assert [f.name.split("_")[:2] for f in folders] == [["0", "baseline"], ["1", "baseline"]]
    assert "decoding.max_new_tokens=2" in folders[0].name and "decoding.max_new_tokens=3" in folders[1].name
    for f in folders:
        rescore = subprocess.run([sys.executable, str(REPO / "scripts" / "rescore.py"), str(f)], env=_env(),
                                 cwd=REPO, capture_output=True, text=True, timeout=300)
        assert rescore.returncode == 0, rescore.stdout + rescore.stderr
    manifest = json.loads((folders[1] / "manifest.json").read_text())
    assert '"torch_threads": 2' in json.dumps(manifest, sort_keys=True)  # Ray's 1 thread per task did not leak in

    # both jobs logged from their Ray workers to the one server: each folder names its run, and the server has both
    records = [json.loads((f / "tracking.json").read_text()) for f in folders]
    assert all(not r.get("pending") and r.get("run_id") for r in records), records
    client = MlflowClient(tracking_uri=mlflow_server.uri)
    experiment = client.get_experiment_by_name("ray-sweep")
    logged = {r.info.run_id: r for r in client.search_runs([experiment.experiment_id], max_results=100)}
    for f, record in zip(folders, records, strict=True):
        run = logged[record["run_id"]]
        assert run.info.status == "FINISHED" and run.data.metrics, (f, run.info)
    assert len({r["run_id"] for r in records}) == 2

    single = subprocess.run([sys.executable, "-m", "harness", *COMMON, "tracking=off", f"project_root={REPO}",
                             f"runs_dir={tmp_path}/single", "decoding.max_new_tokens=3"],
                            env=_env(), cwd=REPO, capture_output=True, text=True, timeout=500)
    assert single.returncode == 0, single.stderr[-3000:]
    (alone,) = (tmp_path / "single" / "baseline").glob("*")
    assert _rows(folders[1]) == _rows(alone)
