"""What an `execution=ray` run exposes and leaves behind (issue 31, findings 2 and 7). Real processes only:

- the private Ray a run starts listens on 127.0.0.1 only (every socket of every process the driver started, read
  with psutil while the run computes) and runs with token authentication; SIGTERM stops it with the one `stopped:`
  line (exit 143, no C++ stack lines) and no Ray process outlives the driver;
- a cluster where no node has determinism.threads CPUs is one line naming the nodes' CPUs, within seconds, not a
  silent wait.

The driver killed with SIGKILL (no Ray process outlives it either) is tests/harness/test_ray_resume.py, which
already kills one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="needs ray: make setup-ray")
psutil = pytest.importorskip("psutil")

REPO = Path(__file__).resolve().parents[2]
CONFIG = ["model=tiny_gemma3", "condition=baseline", "dataset.limit=12", "decoding.max_new_tokens=120",
          "prompt.stop=[]", "determinism.threads=1", "tracking=off", f"project_root={REPO}", "execution=ray",
          "execution.workers=2"]


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_ADDRESS"):  # the harness's own defaults, as a user gets them
        env.pop(key, None)
    return env


@pytest.mark.slow
def test_a_ray_run_listens_only_on_loopback_with_a_token_and_sigterm_stops_it_leaving_no_process(tmp_path, still_running):
    driver = subprocess.Popen([sys.executable, "-m", "harness", *CONFIG, f"runs_dir={tmp_path}/runs"], cwd=REPO,
                              env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True)
    seen: dict[int, tuple[str, float]] = {}
    listening: set[tuple[str, str]] = set()
    auth: set[str] = set()
    try:
        deadline, rows = time.monotonic() + 400, 0
        while time.monotonic() < deadline and driver.poll() is None and rows < 1:
            try:
                kids = psutil.Process(driver.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                break
            for k in kids:
                try:
                    seen[k.pid] = (k.name(), k.create_time())  # its name after exec (first seen forked: "python")
                    env = k.environ() if k.name() in ("raylet", "gcs_server") else {}
                    if "PATH" in env:  # read whole (a process caught mid-exec shows an empty environment)
                        auth.add(env.get("RAY_AUTH_MODE", "unset"))
                except psutil.NoSuchProcess:
                    pass
            mine = {k.pid for k in kids} | {driver.pid}
            for conn in psutil.net_connections("inet"):
                if conn.status == psutil.CONN_LISTEN and conn.pid in mine:
                    listening.add((conn.laddr.ip, seen.get(conn.pid, ("driver", 0.0))[0]))
            partial = list((tmp_path / "runs").glob("baseline/*/outputs.partial.jsonl"))
            rows = len(partial[0].read_text().splitlines()) if partial else 0
            time.sleep(0.2)
        assert rows >= 1, f"the driver exited ({driver.poll()}) or wrote no row in time"
        os.kill(driver.pid, signal.SIGTERM)
        _, err = driver.communicate(timeout=120)
        stopped = time.monotonic()
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    names = {name for _, name in listening}
    assert {"gcs_server", "raylet"} <= names, listening  # the scan saw Ray's servers
    outside = sorted((ip, name) for ip, name in listening if ip not in ("127.0.0.1", "::ffff:127.0.0.1", "::1"))
    assert not outside, f"Ray sockets listening outside loopback: {outside}"
    assert auth == {"token"}, auth  # the private cluster runs with token authentication

    assert driver.returncode == 143, err[-3000:]
    lines = [line for line in err.splitlines() if line.strip() and "%|" not in line and "\r" not in line]
    assert len([line for line in lines if "stopped: SIGTERM" in line]) == 1, err[-3000:]
    assert not [line for line in lines if "***" in line or "@ 0x" in line or "Traceback" in line], err[-3000:]

    while still_running(seen) and time.monotonic() - stopped < 20:
        time.sleep(0.25)
    assert not still_running(seen), f"outlived the driver by {time.monotonic() - stopped:.1f} s: {still_running(seen)}"


# a process that joins its own one-CPU Ray, then runs the harness with 2 threads per worker on it
_INFEASIBLE = """
import sys, time
import ray
ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
from harness.config.schema import compose_config
from harness.errors import HarnessError
from harness.run.loop import run
cfg = compose_config(sys.argv[1:])
t = time.monotonic()
try:
    run(cfg, None, progress=False)
except HarnessError as exc:
    print(f"REFUSED after {time.monotonic() - t:.1f} s: {exc}")
"""


@pytest.mark.slow
def test_no_node_with_determinism_threads_cpus_is_one_line_naming_them_within_seconds(tmp_path):
    cfg = ["model=tiny_gemma3", "condition=baseline", "dataset.limit=2", "decoding.max_new_tokens=2", "tracking=off",
           f"project_root={REPO}", f"runs_dir={tmp_path}/runs", "execution=ray", "execution.workers=1",
           "determinism.threads=2"]
    env = {**_env(), "RAY_AUTH_MODE": "disabled"}
    try:
        out = subprocess.run([sys.executable, "-c", _INFEASIBLE, *cfg], cwd=REPO, env=env, capture_output=True,
                             text=True, timeout=150, start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"no answer in 150 s (a silent wait for CPUs no node has): {exc.stdout!r}")
    refused = [line for line in out.stdout.splitlines() if line.startswith("REFUSED")]
    assert refused, out.stdout[-2000:] + out.stderr[-2000:]
    seconds = float(refused[0].split()[2])
    assert seconds < 10, refused
    assert "determinism.threads=2" in refused[0] and "1 CPUs" in refused[0], refused


@pytest.mark.slow
def test_llamacpp_on_ray_is_not_refused_for_torch_threads_it_never_uses(tmp_path):
    """A llama.cpp run over a Ray worker: the worker's torch threads (Ray's OMP_NUM_THREADS = its CPUs) differ from
    the driver's, and llama.cpp computes on its own threads (a setting, compared): the run is not refused."""
    pytest.importorskip("llama_cpp", reason="the llama.cpp backend needs llama-cpp-python")
    cmd = [sys.executable, "-m", "harness", "model=gemma3_270m_llamacpp", "condition=baseline", "dataset.limit=1",
           "decoding.max_new_tokens=4", "tracking=off", f"project_root={REPO}", f"runs_dir={tmp_path}/runs",
           "execution=ray", "execution.workers=1", "determinism.threads=1"]
    out = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=400,
                         start_new_session=True)
    assert out.returncode == 0, out.stderr[-3000:]
    (folder,) = (tmp_path / "runs" / "baseline").glob("*")
    assert (folder / "manifest.json").is_file() and len((folder / "outputs.jsonl").read_text().splitlines()) == 1


@pytest.mark.slow
def test_sigterm_while_the_private_ray_starts_stops_with_one_line_and_leaves_no_process(tmp_path, still_running):
    """Issue 41, finding 7: SIGTERM sent as soon as the private Ray's first server (gcs_server) exists, i.e. inside
    ray.init: held until every process it starts is up and watched, then Ray shut down and the one `stopped:` line;
    at a1b00c4 the signal tore ray.init down mid-start and left raylet/agents running."""
    driver = subprocess.Popen([sys.executable, "-m", "harness", *CONFIG, f"runs_dir={tmp_path}/runs"], cwd=REPO,
                              env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True)
    seen: dict[int, tuple[str, float]] = {}
    try:
        deadline, sent = time.monotonic() + 300, False
        while time.monotonic() < deadline and driver.poll() is None and not sent:
            try:
                kids = psutil.Process(driver.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                break
            for k in kids:
                try:
                    seen[k.pid] = (k.name(), k.create_time())
                except psutil.NoSuchProcess:
                    pass
            if any(name == "gcs_server" for name, _ in seen.values()):
                os.kill(driver.pid, signal.SIGTERM)
                sent = True
            time.sleep(0.02)
        assert sent, f"the driver exited ({driver.poll()}) before its Ray started"
        while driver.poll() is None and time.monotonic() < deadline:  # every process it starts, seen until it exits
            try:
                for k in psutil.Process(driver.pid).children(recursive=True):
                    seen.setdefault(k.pid, (k.name(), k.create_time()))
            except psutil.NoSuchProcess:
                pass
            time.sleep(0.05)
        _, err = driver.communicate(timeout=120)
        stopped = time.monotonic()
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    assert driver.returncode == 143, err[-3000:]
    lines = [line for line in err.splitlines() if line.strip() and "%|" not in line and "\r" not in line]
    assert err.count("stopped: SIGTERM") == 1, err[-3000:]
    assert not [line for line in lines if "***" in line or "@ 0x" in line or "Traceback" in line], err[-3000:]
    while still_running(seen) and time.monotonic() - stopped < 20:
        time.sleep(0.25)
    assert not still_running(seen), f"outlived the driver by {time.monotonic() - stopped:.1f} s: {still_running(seen)}"
    assert not list((tmp_path / "runs").glob("baseline/*"))  # no row was written: nothing left to resume


@pytest.mark.parametrize("to", ["driver", "group"])
@pytest.mark.slow
def test_sigint_while_the_private_ray_starts_stops_with_one_line_and_leaves_no_process(tmp_path, still_running, to):
    """Issue 51, item 9: Ctrl-C (SIGINT; `group`: to the whole foreground process group, as a terminal sends it, so
    Ray's own servers get it too) as soon as the private Ray's first server exists, i.e. inside ray.init: one
    `stopped: SIGINT` line, exit 130, no traceback, no process left. Before: a 30-line traceback."""
    driver = subprocess.Popen([sys.executable, "-m", "harness", *CONFIG, f"runs_dir={tmp_path}/runs"], cwd=REPO,
                              env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True)
    seen: dict[int, tuple[str, float]] = {}
    try:
        deadline, sent = time.monotonic() + 300, False
        while time.monotonic() < deadline and driver.poll() is None and not sent:
            try:
                kids = psutil.Process(driver.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                break
            for k in kids:
                try:
                    seen[k.pid] = (k.name(), k.create_time())
                except psutil.NoSuchProcess:
                    pass
            if any(name == "gcs_server" for name, _ in seen.values()):
                (os.killpg if to == "group" else os.kill)(driver.pid, signal.SIGINT)
                sent = True
            time.sleep(0.02)
        assert sent, f"the driver exited ({driver.poll()}) before its Ray started"
        while driver.poll() is None and time.monotonic() < deadline:
            try:
                for k in psutil.Process(driver.pid).children(recursive=True):
                    seen.setdefault(k.pid, (k.name(), k.create_time()))
            except psutil.NoSuchProcess:
                pass
            time.sleep(0.05)
        _, err = driver.communicate(timeout=120)
        stopped = time.monotonic()
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    lines = [line for line in err.splitlines() if line.strip() and "%|" not in line and "\r" not in line]
    assert driver.returncode == 130, err[-3000:]
    assert err.count("stopped: SIGINT") == 1, err[-3000:]
    assert not [line for line in lines if "***" in line or "@ 0x" in line or "Traceback" in line], err[-3000:]
    while still_running(seen) and time.monotonic() - stopped < 20:
        time.sleep(0.25)
    assert not still_running(seen), f"outlived the driver by {time.monotonic() - stopped:.1f} s: {still_running(seen)}"
