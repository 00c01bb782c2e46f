"""Scale-out costs, as ratios from one run: verified restore of the same artifact from S3 vs from the local store,
Ray's per-call overhead (an actor round trip) vs an in-process call, and Ray's per-problem overhead: the same
problems run by the harness in this process (execution=local) and on one Ray actor (execution=ray
execution.workers=1), per-problem wall (the rows' wall_s: what the run loop waited for each problem) compared.

    python -m scripts.bench.scaleout --out runs/bench                  # bundled Gemma 3 270M, 512-token artifact
    python -m scripts.bench.scaleout --model tiny-gemma3 --tokens 64 --repeats 3 --no-ray --out /tmp/b
    python -m scripts.bench.scaleout --only-problems --problems 8 --problem-tokens 8 --out /tmp/b   # Ray per problem

Restore = `store.get(id)` (read, every byte hashed to the id, parsed) + the backend's `graft` into a fresh cache,
timed `--repeats` times, median reported, for a LocalStore folder and an S3Store on a SeaweedFS server started
on 127.0.0.1 for the run (`kvstore.testing.local_s3.LocalS3`; a real S3 API over loopback: no network latency, so the
ratio is the protocol + copy cost, a floor for a remote bucket). The graft after each is checked exact against
the fresh reference once per store. The per-problem comparison runs the bundled problems under the baseline
condition, greedy, --problem-tokens new tokens, determinism.threads=1 in both (the actor asks Ray for 1 CPU), the
model loaded once in each (the actor's load is outside the rows' wall); its rows must equal the in-process ones.
Writes <out>/scaleout.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from kvstore import Backend, LocalStore, load_backend, logits_sha256
from kvstore.engine.verify import graft_logits, reference_logits
from kvstore.environment import cpu_name
from kvstore.store.s3 import S3Store
from kvstore.testing.local_s3 import LocalS3
from scripts.bench.common import write_summary


def time_restore(be: Backend, store, aid: str, prefix: list[int], repeats: int) -> dict:
    times, gets = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        snap = store.get(aid)
        t1 = time.perf_counter()
        be.graft(snap, prefix)
        times.append(time.perf_counter() - t0)
        gets.append(t1 - t0)
    return {"restore_s_median": statistics.median(times), "get_s_median": statistics.median(gets),
            "restore_s": [round(t, 6) for t in times]}


def bench_ray(calls: int) -> dict:
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # read at import: one node, on 127.0.0.1 only
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # reachable from this machine only (above)
    import ray

    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        @ray.remote(num_cpus=1)
        class Echo:
            def call(self, x: int) -> int:
                return x

        def local(x: int) -> int:
            return x

        actor = Echo.remote()
        ray.get(actor.call.remote(0))  # started
        t0 = time.perf_counter()
        for i in range(calls):
            ray.get(actor.call.remote(i))
        remote = (time.perf_counter() - t0) / calls
        t0 = time.perf_counter()
        for i in range(calls):
            local(i)
        inproc = (time.perf_counter() - t0) / calls
    finally:
        ray.shutdown()
    return {"calls": calls, "actor_round_trip_s": remote, "in_process_call_s": inproc}


MODEL_CONFIGS = {"gemma3-270m": "gemma3_270m", "tiny-gemma3": "tiny_gemma3"}


def bench_ray_problems(model: str, problems: int, tokens: int) -> dict:
    """Per-problem wall of the same harness run in this process and on one Ray actor; rows checked equal."""
    from harness.config.model import load_model
    from harness.config.schema import compose_config, typed
    from harness.run.loop import run

    repo = Path(__file__).resolve().parents[2]
    os.environ["PYTHONPATH"] = str(repo)  # the actor imports this checkout's harness
    # the run's private local Ray: on 127.0.0.1, with a token of its own (harness/run/distributed.py)
    result: dict = {"problems": problems, "max_new_tokens": tokens, "threads": 1}
    with tempfile.TemporaryDirectory(prefix="kvgraft-rayprob-") as tmp:
        base = [f"model={MODEL_CONFIGS.get(model, model)}", "condition=baseline", f"dataset.limit={problems}",
                f"decoding.max_new_tokens={tokens}", "determinism.threads=1", "tracking=off", f"project_root={repo}",
                f"runs_dir={tmp}/runs"]
        be = load_model(typed(compose_config(base)))
        rows = {}
        for name, extra in (("in_process", []), ("ray", ["execution=ray", "execution.workers=1"])):
            folder, summary = run(compose_config([*base, *extra]), Path(tmp) / name, be=be, progress=False)
            rows[name] = folder.read_rows()
            walls = [r.wall_s for r in rows[name]]
            result[name] = {"per_problem_wall_s_median": statistics.median(walls), "per_problem_wall_s": walls,
                            "run_wall_s": summary.time.run_wall_s}
    same = [(r.problem_id, r.completion.token_ids, r.completion.first_logits_sha256) for r in rows["ray"]] == [
        (r.problem_id, r.completion.token_ids, r.completion.first_logits_sha256) for r in rows["in_process"]]
    result["rows_equal"] = same
    ip, ry = result["in_process"]["per_problem_wall_s_median"], result["ray"]["per_problem_wall_s_median"]
    result["ray_over_in_process"] = ry / ip
    result["ray_overhead_per_problem_s"] = ry - ip
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="gemma3-270m")
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--ray-calls", type=int, default=200)
    p.add_argument("--no-ray", action="store_true")
    p.add_argument("--problems", type=int, default=8, help="problems of the per-problem Ray comparison")
    p.add_argument("--problem-tokens", type=int, default=8, help="new tokens per problem in that comparison")
    p.add_argument("--only-problems", action="store_true", help="only the per-problem Ray comparison")
    p.add_argument("--out", default="runs/bench")
    a = p.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.only_problems:
        result = {"cpu": cpu_name(), "cores": os.cpu_count(), "model": a.model, "loadavg_before": os.getloadavg()}
        result["ray_problems"] = _print_problems(bench_ray_problems(a.model, a.problems, a.problem_tokens))
        result["loadavg_after"] = os.getloadavg()
        return _write(out / "scaleout_problems.json", result, f"{result['loadavg_before'][0]:.1f} before, "
                      f"{result['loadavg_after'][0]:.1f} after")

    be = load_backend("transformers", source=a.model)
    vocab = be.vocab_size()
    prefix = [2] + [(7919 * i) % (vocab - 10) + 5 for i in range(a.tokens - 1)]
    suffix = [prefix[5], prefix[9]]
    snap = be.deposit(prefix)
    reference = logits_sha256(reference_logits(be, prefix, suffix))
    result: dict = {"cpu": cpu_name(), "cores": os.cpu_count(), "model": be.model_name, "tokens": a.tokens,
                    "repeats": a.repeats}
    with tempfile.TemporaryDirectory(prefix="kvgraft-scaleout-") as tmp:
        local = LocalStore(Path(tmp) / "store")
        with LocalS3(Path(tmp) / "seaweed") as s3:
            os.environ.update(s3.env)
            remote = S3Store("s3://kvgraft/bench", endpoint_url=s3.endpoint)
            aid = local.put(snap)
            assert remote.put(snap) == aid
            result["artifact"] = {"id": aid, "bytes": local.info(aid).size}
            for name, store in (("local", local), ("s3", remote)):
                exact = logits_sha256(graft_logits(be, prefix, suffix, store=store, artifact_id=aid).logits)
                result[name] = {**time_restore(be, store, aid, prefix, a.repeats), "exact": exact == reference}
                print(f"{name:5s}: restore {result[name]['restore_s_median'] * 1e3:8.2f} ms (get "
                      f"{result[name]['get_s_median'] * 1e3:.2f} ms), exact={result[name]['exact']}", flush=True)
    result["s3_over_local"] = result["s3"]["restore_s_median"] / result["local"]["restore_s_median"]
    print(f"S3 / local restore: {result['s3_over_local']:.2f}x ({result['artifact']['bytes']:,} bytes)")
    if not a.no_ray:
        result["ray"] = bench_ray(a.ray_calls)
        r = result["ray"]
        print(f"Ray actor round trip {r['actor_round_trip_s'] * 1e3:.3f} ms vs in-process "
              f"{r['in_process_call_s'] * 1e6:.3f} us per call")
        result["ray_problems"] = _print_problems(bench_ray_problems(a.model, a.problems, a.problem_tokens))
    result["loadavg"] = os.getloadavg()
    return _write(out / "scaleout.json", result, f"{result['loadavg'][0]:.1f}")


def _write(path: Path, result: dict, load: str) -> int:
    write_summary(path, result)
    print(f"wrote {path} ({result['cpu']}, {result['cores']} cores, load average {load})")
    return 0


def _print_problems(r: dict) -> dict:
    print(f"per problem ({r['problems']} problems, {r['max_new_tokens']} new tokens, 1 thread): in-process "
          f"{r['in_process']['per_problem_wall_s_median'] * 1e3:.1f} ms, one Ray actor "
          f"{r['ray']['per_problem_wall_s_median'] * 1e3:.1f} ms (median): {r['ray_over_in_process']:.3f}x, "
          f"{r['ray_overhead_per_problem_s'] * 1e3:+.1f} ms per problem; rows equal: {r['rows_equal']}", flush=True)
    return r


if __name__ == "__main__":
    raise SystemExit(main())
