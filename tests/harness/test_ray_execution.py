"""`execution=ray execution.workers=2`: one evaluation spread over two Ray actors (a private local Ray started by
the run, stopped after this module) gives rows equal, token for token and in order, to the single-process run of
the same config; a worker killed mid-problem has its problem run again elsewhere, no row lost or duplicated; a
worker whose environment differs is refused, naming the field."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="needs ray: make setup-ray")

from harness.config.schema import compose_config  # noqa: E402
from harness.errors import HarnessError  # noqa: E402
from harness.run.loop import run  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_gemma3():
    from kvstore import load_backend

    return load_backend("transformers", source="tiny-gemma3")


@pytest.fixture(scope="module", autouse=True)
def private_ray():
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ["PYTHONPATH"] = str(REPO)  # the actors import this checkout's harness
    yield
    if ray.is_initialized():
        ray.shutdown()


def _cfg(tmp_path: Path, *extra: str):
    # the mode of the tiny_gemma3 fixture the driver is given (kvstore's default: off); the workers load the config's
    return compose_config(["model=tiny_gemma3", "condition=baseline", "dataset.limit=4", "decoding.max_new_tokens=3",
                           "tracking=off", f"project_root={REPO}", f"runs_dir={tmp_path}/runs",
                           "determinism.batch_invariant=false", *extra])


def _rows(folder) -> list[tuple]:
    return [(r.problem_id, r.sample, r.completion.context_ids, r.completion.token_ids, r.completion.text, r.correct,
             r.extracted) for r in folder.read_rows()]


def test_rows_over_two_ray_workers_equal_the_single_process_run(tmp_path, tiny_gemma3):
    alone, _ = run(_cfg(tmp_path), tmp_path / "alone", be=tiny_gemma3, progress=False)
    spread, summary = run(_cfg(tmp_path, "execution=ray", "execution.workers=2"), tmp_path / "ray",
                          be=tiny_gemma3, progress=False)
    assert _rows(spread) == _rows(alone) and len(_rows(alone)) == 4
    assert summary.scores == run(_cfg(tmp_path), tmp_path / "again", be=tiny_gemma3, progress=False)[1].scores


@pytest.mark.slow
def test_a_worker_killed_mid_problem_loses_and_duplicates_nothing(tmp_path, tiny_gemma3, monkeypatch):
    """kill -9 of a worker while it computes a problem: the problem is queued again, a new worker replaces it."""
    from harness.run import distributed

    pools: list = []
    real_init = distributed.RayPool.__init__

    def init(self, *a):
        real_init(self, *a)
        pools.append(self)

    monkeypatch.setattr(distributed.RayPool, "__init__", init)
    killed: list[int] = []

    def killer() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not killed:
            if pools and pools[0]._inflight:
                actor, _ = next(iter(dict(pools[0]._inflight).values()))
                pid = pools[0].pids[actor]
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            time.sleep(0.005)

    cfg = ["dataset.limit=6", "decoding.max_new_tokens=8"]
    alone, _ = run(_cfg(tmp_path, *cfg), tmp_path / "alone", be=tiny_gemma3, progress=False)
    t = threading.Thread(target=killer, daemon=True)
    t.start()
    spread, _ = run(_cfg(tmp_path, *cfg, "execution=ray", "execution.workers=2"), tmp_path / "ray",
                    be=tiny_gemma3, progress=False)
    t.join(5)
    assert killed and pools[0].replaced >= 1
    assert _rows(spread) == _rows(alone) and len(_rows(spread)) == 6


def test_a_worker_in_another_environment_is_refused_naming_the_field(tmp_path, tiny_gemma3, monkeypatch):
    from kvstore.backends.transformers import TransformersBackend

    backend = TransformersBackend
    real = backend.environment
    monkeypatch.setattr(backend, "environment", lambda self: {**real(self), "torch_threads": 7})  # the driver's
    with pytest.raises(HarnessError, match="torch_threads: driver 7, worker 2"):
        run(_cfg(tmp_path, "execution=ray", "execution.workers=1"), tmp_path / "ray", be=tiny_gemma3, progress=False)
