"""One evaluation spread over Ray actors: `execution=ray execution.workers=N`.

    python -m harness condition=graft execution=ray execution.workers=2 project_root=$PWD
    python -m harness ... execution=ray execution.workers=8 execution.address=HEAD:6379   # join a running cluster

Without execution.address the run starts a private Ray of its own (RAY_ADDRESS is not joined: joining is explicit,
execution.address=auto joins the one RAY_ADDRESS names). That private Ray listens on 127.0.0.1 only (GCS, raylet,
workers, agents: Ray's single-node mode, set before Ray is imported), no dashboard, and token authentication with
a random token of this process (RAY_AUTH_TOKEN, inherited by the Ray processes it starts, written nowhere) unless
RAY_AUTH_MODE is set; its workers run at the driver's priority (RAY_worker_niceness=0, not Ray's 15). Before any
actor starts, the cluster is checked for a node with determinism.threads CPUs (one
line naming the nodes' CPUs otherwise, not a silent wait); SIGTERM keeps the harness's own handler (ray.init
installs one that exits mid-call); the private Ray is stopped when the run ends or fails, and a watchdog process
stops it if the driver is killed (kill -9), so no Ray process outlives the driver.

harness/run/loop.py asks `completer(...)` for the function that turns (problem, samples) into completions. Locally
that is the condition's own `complete_samples`. With execution=ray, N actors each load the frozen model and build
the same condition once; each reports its model fingerprint, its backend's settings and compute environment
(`identity`: torch's thread count only for a backend that computes with torch), and a worker whose any differs
from the driver's is refused, naming the fields. Every job (a problem and its sample indices) is
queued at once; the run's loop then takes the completions in problem order, so rows are written, scored and
hashed by the same code, in the same order, as a single-process run. A worker that dies mid-problem (its
actor is lost) has that problem put back on the queue and is replaced: no row is lost or duplicated, since rows
are only made by the driver, from the one completion each job returns.

Completions travel as plain dicts (dataclasses.asdict), rebuilt into Completion on the driver. Each actor asks
Ray for determinism.threads CPUs, so Ray's per-task OMP_NUM_THREADS equals the run's thread count.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import ipaddress
import os
import secrets
import signal
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from harness.config.execution import EXECUTIONS


def identity(be: Any) -> dict:
    """What a worker must share with the driver: the model fingerprint, the backend's settings and its compute
    environment. torch's thread count only where torch computes: a llama.cpp backend runs on its own threads (a
    setting, compared with the others), and Ray gives each worker OMP_NUM_THREADS = its CPUs."""
    env = dict(be.environment())
    if not be.torch_threads_matter():
        env.pop("torch_threads", None)
    return {"model_fingerprint": be.fingerprint, "settings": be.settings(), "environment": env}


class _Worker:
    """A Ray actor: the frozen model and the condition, built once from the run's config."""

    def __init__(self, cfg: dict, build_library_if_missing: bool, torch_threads: int | None = None) -> None:
        from pathlib import Path

        from omegaconf import OmegaConf

        from harness.config.model import load_model
        from harness.config.schema import typed
        from harness.run.conditions import build_condition

        c = typed(OmegaConf.create(cfg))
        self.be = load_model(c)
        if torch_threads is not None:  # a backend that computes without torch: torch's threads as the driver's,
            import torch  # which its artifacts' environment records (Ray set OMP_NUM_THREADS to this actor's CPUs)

            torch.set_num_threads(torch_threads)
        self.condition = build_condition(c.condition.name, self.be, c.prompt, c.decoding, c.library,
                                         Path(c.project_root), build_library_if_missing=build_library_if_missing,
                                         settings=c.condition.settings)

    def describe(self) -> dict:
        return {**identity(self.be), "pid": os.getpid()}

    def complete(self, problem: dict, samples: list[int]) -> list[dict]:
        from harness.task.problems import Problem

        p = Problem(**problem)
        return [dataclasses.asdict(c) for c in self.condition.complete_samples(p, samples)]


def completer(c, condition, be, problems: list, jobs: list, build_library_if_missing: bool = False) -> Callable:
    """complete(problem, samples, on_token=None) -> completions: the condition's own, or the Ray pool's."""
    execution = getattr(c, "execution", None)
    name = getattr(execution, "name", "local") if execution is not None else "local"
    if name not in EXECUTIONS:
        from harness.errors import ConfigError

        raise ConfigError(f"execution.name={name!r}: use one of {list(EXECUTIONS)} (configs/execution/)")
    if name == "local":
        return condition.complete_samples
    return RayPool(c, be, jobs, build_library_if_missing).complete


LOOPBACK_ONLY = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # Ray's single-node switch: 0 puts every server on 127.0.0.1


def _import_ray(private: bool):
    """Ray, imported after pinning a private cluster to loopback and token auth (Ray reads both at import)."""
    if private and "ray" not in sys.modules:
        os.environ[LOOPBACK_ONLY] = "0"
        if "RAY_AUTH_MODE" not in os.environ:  # auth as available: a token of this process, never written to disk
            os.environ["RAY_AUTH_MODE"] = "token"
            os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
    import ray

    if private:  # imported earlier by this process (a test, a notebook): the same switch, read at each call
        import ray._private.ray_constants as ray_constants

        ray_constants.ENABLE_RAY_CLUSTER = False
    return ray


def _private_ray(num_cpus: int):
    """Import Ray and start this run's private one-node cluster, with Ctrl-C and SIGTERM held from the import until
    the cluster is up and watched: a signal in that window shuts it down and is raised afterwards, so the run stops
    with its one line (issue 51, item 9: SIGINT gave a 30-line traceback; the hold covered ray.init only)."""
    def stop() -> None:
        ray = sys.modules.get("ray")
        if ray is not None and getattr(ray, "is_initialized", lambda: False)():
            ray.shutdown()

    with _held_signals(stop):
        ray = _import_ray(private=True)
        if os.environ.get("RAY_ADDRESS"):
            print(f"note: RAY_ADDRESS={os.environ['RAY_ADDRESS']} is not joined (execution.address is not set): this "
                  "run starts a private Ray on 127.0.0.1; execution.address=auto joins it", file=sys.stderr)
        _start_private_ray(ray, num_cpus)
    return ray


def _start_private_ray(ray, num_cpus: int) -> None:
    """ray.init of a one-node Ray of this process on 127.0.0.1, with a watchdog that stops it if the driver dies."""
    from harness.errors import HarnessError

    # Ray starts workers at nice 15 by default; here they do all of the run's compute while the driver waits, so on
    # a machine with other load they would crawl (a vLLM worker's engine took over 20 minutes to start). The raylet
    # ray.init starts reads it from the environment.
    os.environ.setdefault("RAY_worker_niceness", "0")
    # SIGTERM or Ctrl-C while Ray starts its processes: held (the caller's `_held_signals`, from `import ray` on) until
    # they are all up and watched, then Ray is shut down and the run stops with its one line (issue 41, finding 7;
    # issue 51: Ctrl-C too, and during the import). Raised mid-start, it would leave a half-started cluster
    # (gcs_server, raylet, agents) that nothing stops; ray.init's own SIGTERM handler (sys.exit) is kept out.
    with _held_signals(ray.shutdown):
        utils = importlib.import_module("ray._private.utils")
        own_handler = utils.set_sigterm_handler
        utils.set_sigterm_handler = lambda handler: None  # ray.init would install sys.exit(15) for SIGTERM
        try:
            ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
                     configure_logging=False)
            _watchdog(ray)
        finally:
            utils.set_sigterm_handler = own_handler
    ip = ray.util.get_node_ip_address()
    if not ipaddress.ip_address(ip).is_loopback:
        ray.shutdown()
        raise HarnessError(f"execution=ray: the private Ray came up on {ip}, not on 127.0.0.1, so other machines "
                           f"could reach it; nothing was run. Start the run in a fresh process ({LOOPBACK_ONLY}=0 "
                           "is read when Ray is imported), or join a cluster you secured with execution.address")


_HOLDING: list[int] | None = None  # the signals held by the outermost _held_signals of this process, if any


@contextlib.contextmanager
def _held_signals(stop: Callable[[], None]):
    """Hold SIGTERM and SIGINT (main thread only) for the block; afterwards, when one came, call `stop()` (shut the
    half-started Ray down), put the run's own handlers back (ray.shutdown leaves SIGTERM at its default) and raise the
    first signal again under them: Terminated (SIGTERM) or KeyboardInterrupt, which the run turns into its one
    `stopped:` line. Nested, only the outermost block holds, stops and raises (an inner one does nothing)."""
    global _HOLDING
    main = threading.current_thread() is threading.main_thread()
    if not main or _HOLDING is not None:
        yield
        return
    pending: list[int] = []
    keep = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    for sig in keep:
        signal.signal(sig, lambda signum, frame: pending.append(signum))
    _HOLDING = pending
    try:
        yield
    finally:
        _HOLDING = None
        for sig, handler in keep.items():
            if handler is not None:
                signal.signal(sig, handler)
    if pending:
        stop()
        for sig, handler in keep.items():
            if handler is not None:
                signal.signal(sig, handler)
        signal.raise_signal(pending[0])  # the run's own handler now: Terminated (SIGTERM) or KeyboardInterrupt


def _watchdog(ray) -> None:
    """A process that outlives a killed driver just long enough to stop its private Ray's processes."""
    pids = sorted(_ray_pids(os.getpid()))
    if pids:
        subprocess.Popen([sys.executable, "-c", _WATCH, str(os.getpid()), *pids], start_new_session=True,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True)


def _ray_pids(driver: int) -> set[str]:
    """The processes the driver's ray.init started (gcs_server, raylet, agents, workers), as "pid:start time"."""
    import psutil

    try:
        return {f"{p.pid}:{p.create_time()}" for p in psutil.Process(driver).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


# the watchdog: wait for the driver to exit, then stop what it started (and their children), TERM then KILL
_WATCH = """
import os, sys, time, psutil
driver = int(sys.argv[1])
try:
    psutil.Process(driver).wait()
except psutil.NoSuchProcess:
    pass
procs = []
for arg in sys.argv[2:]:
    pid, started = arg.split(":")
    try:
        p = psutil.Process(int(pid))
        if str(p.create_time()) == started:  # the same process, not a later one with its number
            procs += [p, *p.children(recursive=True)]
    except psutil.NoSuchProcess:
        pass
for p in procs:
    try:
        p.terminate()
    except psutil.NoSuchProcess:
        pass
_, alive = psutil.wait_procs(procs, timeout=3)
for p in alive:
    try:
        p.kill()
    except psutil.NoSuchProcess:
        pass
"""


def _check_feasible(ray, threads: int, workers: int, where: str) -> None:
    """One line, now, when no node of the cluster can ever hold one worker (determinism.threads CPUs)."""
    from harness.errors import HarnessError

    nodes = [(n.get("NodeManagerAddress", "?"), n.get("Resources", {}).get("CPU", 0.0))
             for n in ray.nodes() if n.get("Alive")]
    fits = sum(int(cpus // threads) for _, cpus in nodes)
    if fits < 1:
        have = ", ".join(f"{ip}: {cpus:g} CPUs" for ip, cpus in nodes) or "no live node"
        raise HarnessError(f"execution=ray: no node of the Ray cluster {where} has determinism.threads={threads} "
                           f"CPUs for a worker (its nodes: {have}); lower determinism.threads or add a node with "
                           f"{threads} CPUs")
    if fits < workers:
        print(f"note: the Ray cluster {where} holds {fits} worker(s) of {threads} CPUs at once, not "
              f"execution.workers={workers}: the others start as CPUs free up", file=sys.stderr)


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


class RayPool:
    """N actors working through every job of a run; results handed out in job order."""

    START_TIMEOUT_S = 900.0  # one worker's start (its model load): longer means it waits for CPUs that never free

    def __init__(self, c, be, jobs: list, build_library_if_missing: bool) -> None:
        from omegaconf import OmegaConf

        from harness.errors import HarnessError

        ex = c.execution
        if ex.workers < 1:
            raise HarnessError(f"execution.workers={ex.workers}: use 1 or more")
        threads = c.determinism.threads
        joined = "ray" in sys.modules and sys.modules["ray"].is_initialized()
        private = not (joined or ex.address)
        if private:
            ray = _private_ray(ex.workers * threads)
        else:
            ray = _import_ray(private=False)
        self._private = False
        if joined:
            where = "this process is connected to"
        elif ex.address:  # explicit: a cluster someone started (and secured: docs/scale-out.md)
            ray.init(address=ex.address, include_dashboard=False, log_to_driver=False, configure_logging=False)
            where = f"at {ex.address}"
        else:
            self._private = True
            where = "this run started (127.0.0.1)"
        self._where = where
        try:
            _check_feasible(ray, threads, ex.workers, where)
        except BaseException:
            self.shutdown()
            raise
        self._ray = ray
        self._cfg = OmegaConf.to_container(OmegaConf.structured(c), resolve=True)
        self._actor_cls = ray.remote(num_cpus=threads)(_Worker)
        self._build = build_library_if_missing
        self._expected = identity(be)
        self._torch_threads = None if be.torch_threads_matter() else torch_threads()
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
        from ray.exceptions import GetTimeoutError

        from harness.errors import HarnessError

        actor = self._actor_cls.remote(self._cfg, self._build, self._torch_threads)
        try:
            got = self._ray.get(actor.describe.remote(), timeout=self.START_TIMEOUT_S)
        except GetTimeoutError:
            self._ray.kill(actor)
            raise HarnessError(f"execution=ray: a worker of {self._cfg['determinism']['threads']} CPUs did not start "
                               f"within {self.START_TIMEOUT_S:g} s on the Ray cluster {self._where} (free now: "
                               f"{self._ray.available_resources().get('CPU', 0):g} CPUs); other jobs hold its CPUs. "
                               "Free them, or lower execution.workers or determinism.threads") from None
        for key in ("model_fingerprint", "settings", "environment"):
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
        """Stop every worker of this pool (Ray itself stays up for the next run of this process; Ray's own exit
        hook stops a private one when the process ends, the watchdog when it is killed). On a private Ray the
        workers' processes (and what they started: a vLLM engine core) are waited for, and killed after 30 s:
        `ray.kill` only asks, and under load a worker took longer than a fixed wait to go (issue 41, finding 7)."""
        import psutil

        procs: list = []
        if self._private:
            for pid in self.pids.values():
                try:
                    worker = psutil.Process(pid)
                    procs += [worker, *worker.children(recursive=True)]
                except psutil.Error:
                    continue
        for actor in list(self.pids):
            self._ray.kill(actor)
        self.pids.clear()
        self._idle.clear()
        _, alive = psutil.wait_procs(procs, timeout=30)
        for p in alive:
            try:
                p.kill()
            except psutil.Error:
                continue
        psutil.wait_procs(alive, timeout=5)

    def shutdown(self) -> None:
        """Stop the private Ray this pool started, if it did (a refused start leaves nothing running)."""
        if self._private:
            self._private = False
            import ray

            ray.shutdown()
