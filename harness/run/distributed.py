"""One evaluation spread over Ray actors: `execution=ray execution.workers=N`.

    python -m harness condition=graft execution=ray execution.workers=2 project_root=$PWD
    RAY_ADDRESS=HEAD:6379 python -m harness ... execution=ray execution.workers=8   # a running cluster

harness/run/loop.py asks `completer(...)` for the function that turns (problem, samples) into completions. Locally
that is the condition's own `complete_samples`. With execution=ray, N actors each load the frozen model and build
the same condition once; each reports its model fingerprint and `environment_fingerprint()`, and a worker whose
either differs from the driver's is refused, naming the fields. Every job (a problem and its sample indices) is
queued at once; the run's loop then takes the completions in problem order, so rows are written, scored and
hashed by the same code, in the same order, as a single-process run. A worker that dies mid-problem (its
actor is lost) has that problem put back on the queue and is replaced: no row is lost or duplicated, since rows
are only made by the driver, from the one completion each job returns.

Completions travel as plain dicts (dataclasses.asdict), rebuilt into Completion on the driver. Each actor asks
Ray for determinism.threads CPUs, so Ray's per-task OMP_NUM_THREADS equals the run's thread count.
"""

from __future__ import annotations

import dataclasses
import os
from collections import deque
from collections.abc import Callable
from typing import Any

from harness.config.execution import EXECUTIONS, ExecutionConfig  # noqa: F401 - the config dataclass, re-exported


class _Worker:
    """A Ray actor: the frozen model and the condition, built once from the run's config."""

    def __init__(self, cfg: dict, build_library_if_missing: bool) -> None:
        from pathlib import Path

        from omegaconf import OmegaConf

        from harness.config.model import load_model
        from harness.config.schema import typed
        from harness.run.conditions import build_condition

        c = typed(OmegaConf.create(cfg))
        self.fm = load_model(c)
        self.condition = build_condition(c.condition.name, self.fm, c.prompt, c.decoding, c.library,
                                         Path(c.project_root), build_library_if_missing=build_library_if_missing,
                                         settings=c.condition.settings)

    def describe(self) -> dict:
        from kvstore import environment_fingerprint

        return {"model_fingerprint": self.fm.fingerprint, "environment": environment_fingerprint(),
                "pid": os.getpid()}

    def complete(self, problem: dict, samples: list[int]) -> list[dict]:
        from harness.task.problems import Problem

        p = Problem(**problem)
        return [dataclasses.asdict(c) for c in self.condition.complete_samples(p, samples)]


def completer(c, condition, fm, problems: list, jobs: list, build_library_if_missing: bool = False) -> Callable:
    """complete(problem, samples, on_token=None) -> completions: the condition's own, or the Ray pool's."""
    execution = getattr(c, "execution", None)
    name = getattr(execution, "name", "local") if execution is not None else "local"
    if name not in EXECUTIONS:
        from harness.errors import ConfigError

        raise ConfigError(f"execution.name={name!r}: use one of {list(EXECUTIONS)} (configs/execution/)")
    if name == "local":
        return condition.complete_samples
    return RayPool(c, fm, jobs, build_library_if_missing).complete


class RayPool:
    """N actors working through every job of a run; results handed out in job order."""

    def __init__(self, c, fm, jobs: list, build_library_if_missing: bool) -> None:
        import ray
        from omegaconf import OmegaConf

        from harness.errors import HarnessError
        from kvstore import environment_fingerprint

        ex = c.execution
        if ex.workers < 1:
            raise HarnessError(f"execution.workers={ex.workers}: use 1 or more")
        threads = c.determinism.threads
        if not ray.is_initialized():
            address = ex.address or os.environ.get("RAY_ADDRESS")
            if not address:  # a private local Ray of this process: no token to hand out
                os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            ray.init(address=address, num_cpus=None if address else ex.workers * threads, include_dashboard=False,
                     log_to_driver=False, configure_logging=False)
        self._ray = ray
        self._cfg = OmegaConf.to_container(OmegaConf.structured(c), resolve=True)
        self._actor_cls = ray.remote(num_cpus=threads)(_Worker)
        self._build = build_library_if_missing
        self._expected = {"model_fingerprint": fm.fingerprint, "environment": environment_fingerprint()}
        self._jobs = jobs
        self._index = {(id(p), tuple(s)): i for i, (p, s) in enumerate(jobs)}
        self._queue: deque[int] = deque(range(len(jobs)))
        self._results: dict[int, list[dict]] = {}
        self._inflight: dict[Any, tuple[Any, int]] = {}  # ObjectRef -> (actor, job index)
        self.replaced = 0
        self.pids: dict[Any, int] = {}  # actor -> its worker process id
        self._idle = [self._start_actor() for _ in range(ex.workers)]
        self._dispatch()

    def _start_actor(self):
        from harness.errors import HarnessError

        actor = self._actor_cls.remote(self._cfg, self._build)
        got = self._ray.get(actor.describe.remote())
        for key in ("model_fingerprint", "environment"):
            if got[key] != self._expected[key]:
                diff = key if key == "model_fingerprint" else ", ".join(
                    f"{k}: driver {self._expected[key].get(k)!r}, worker {got[key].get(k)!r}"
                    for k in sorted(set(got[key]) | set(self._expected[key]))
                    if got[key].get(k) != self._expected[key].get(k))
                self._ray.kill(actor)
                raise HarnessError(f"Ray worker (pid {got['pid']}) differs from the driver in {diff}; its rows would "
                                   "not be those of a single-process run. Run every node from one environment")
        self.pids[actor] = got["pid"]
        return actor

    def _dispatch(self) -> None:
        while self._idle and self._queue:
            actor, i = self._idle.pop(), self._queue.popleft()
            problem, samples = self._jobs[i]
            ref = actor.complete.remote(dataclasses.asdict(problem), list(samples))
            self._inflight[ref] = (actor, i)

    def _wait_one(self) -> None:
        from ray.exceptions import RayActorError, WorkerCrashedError

        ready, _ = self._ray.wait(list(self._inflight), num_returns=1)
        actor, i = self._inflight.pop(ready[0])
        try:
            self._results[i] = self._ray.get(ready[0])
            self._idle.append(actor)
        except (RayActorError, WorkerCrashedError):
            self._queue.appendleft(i)  # its problem runs again elsewhere; nothing of it was kept
            self.replaced += 1
            self._idle.append(self._start_actor())
        self._dispatch()

    def complete(self, problem, samples, on_token: Callable[[int], None] | None = None) -> list:
        from harness.record.rows import Completion

        i = self._index[(id(problem), tuple(samples))]
        while i not in self._results:
            self._wait_one()
        done = [Completion(**d) for d in self._results.pop(i)]
        if not (self._queue or self._inflight or self._results):
            self.close()  # the last job: free the workers (each holds a model)
        if on_token is not None:
            on_token(sum(len(d.token_ids) for d in done))
        return done

    def close(self) -> None:
        """Stop every worker of this pool (Ray itself stays up for the next run of this process)."""
        for actor in list(self.pids):
            self._ray.kill(actor)
        self.pids.clear()
        self._idle.clear()
