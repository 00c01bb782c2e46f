"""Scale-out costs, as ratios from one run: verified restore of the same artifact from S3 vs from the local store,
and Ray's per-call overhead (an actor round trip) vs an in-process call.

    python scripts/bench_scaleout.py --out runs/bench                  # bundled Gemma 3 270M, 512-token artifact
    python scripts/bench_scaleout.py --model tiny-gemma3 --tokens 64 --repeats 3 --no-ray --out /tmp/b

Restore = `store.get(id)` (read, every byte hashed to the id, parsed) + `graft_snapshot` into a fresh cache,
timed `--repeats` times, median reported, for a LocalStore folder and an S3Store on a SeaweedFS server started
on 127.0.0.1 for the run (`kvstore.local_s3.LocalS3`; a real S3 API over loopback: no network latency, so the
ratio is the protocol + copy cost, a floor for a remote bucket). The graft after each is checked exact against
the fresh reference once per store. Writes <out>/scaleout.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments import cpu_name  # noqa: E402

from kvstore import LocalStore, deposit_tokens, graft_snapshot, load_frozen_model, logits_sha256  # noqa: E402
from kvstore.local_s3 import LocalS3  # noqa: E402
from kvstore.s3_store import S3Store  # noqa: E402
from kvstore.verify import graft_logits, reference_logits  # noqa: E402


def time_restore(fm, store, aid: str, prefix: list[int], repeats: int) -> dict:
    times, gets = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        snap = store.get(aid)
        t1 = time.perf_counter()
        graft_snapshot(snap, fm, token_ids=prefix)
        times.append(time.perf_counter() - t0)
        gets.append(t1 - t0)
    return {"restore_s_median": statistics.median(times), "get_s_median": statistics.median(gets),
            "restore_s": [round(t, 6) for t in times]}


def bench_ray(calls: int) -> dict:
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="gemma3-270m")
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--ray-calls", type=int, default=200)
    p.add_argument("--no-ray", action="store_true")
    p.add_argument("--out", default="runs/bench")
    a = p.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)

    fm = load_frozen_model(a.model)
    vocab = fm.model.config.vocab_size
    prefix = [2] + [(7919 * i) % (vocab - 10) + 5 for i in range(a.tokens - 1)]
    suffix = [prefix[5], prefix[9]]
    snap = deposit_tokens(fm, prefix)
    reference = logits_sha256(reference_logits(fm, prefix, suffix))
    result: dict = {"cpu": cpu_name(), "cores": os.cpu_count(), "model": fm.name, "tokens": a.tokens,
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
                exact = logits_sha256(graft_logits(fm, prefix, suffix, store=store, artifact_id=aid).logits)
                result[name] = {**time_restore(fm, store, aid, prefix, a.repeats), "exact": exact == reference}
                print(f"{name:5s}: restore {result[name]['restore_s_median'] * 1e3:8.2f} ms (get "
                      f"{result[name]['get_s_median'] * 1e3:.2f} ms), exact={result[name]['exact']}", flush=True)
    result["s3_over_local"] = result["s3"]["restore_s_median"] / result["local"]["restore_s_median"]
    print(f"S3 / local restore: {result['s3_over_local']:.2f}x ({result['artifact']['bytes']:,} bytes)")
    if not a.no_ray:
        result["ray"] = bench_ray(a.ray_calls)
        r = result["ray"]
        print(f"Ray actor round trip {r['actor_round_trip_s'] * 1e3:.3f} ms vs in-process "
              f"{r['in_process_call_s'] * 1e6:.3f} us per call")
    (out / "scaleout.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out / 'scaleout.json'} ({result['cpu']}, {result['cores']} cores)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
