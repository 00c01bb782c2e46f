"""The GPU path, measured in one run (issues 11, 33): exactness in bf16 and fp32, TTFT graft vs recompute, verified
restore GB/s vs a raw read, and energy per graft and per recompute, for random-weight models built from the
published configurations (no download).

    bash scripts/gpu_machine.sh                          # on the GPU machine (docs/performance.md, "On a GPU")
    .venv/bin/python -m scripts.gpu_bench --out runs/gpu_bench.json    # CUDA: the full run
    .venv/bin/python -m scripts.gpu_bench --device cpu --small --out /tmp/g.json   # CPU dry run

Models (--models; default the five of issue 33, smallest first): kvstore.testing.random_models.CONFIGS, hard-coded
from the public config.json of each family: Gemma 3 1B, 4B and 12B text configs (sliding window + full attention),
Qwen2.5 1.5B and 7B (full attention, GQA), and a Llama 3.1 8B-class config. `--small` keeps each architecture's
layer pattern with tiny dimensions, for a CPU check of the whole pipeline.

Weights are random, drawn on the device from --seed: exactness (byte-identical logits) and speed depend on the
shapes and kernels, not on trained values; the output says so. The environment (torch, transformers, CUDA, GPU)
is recorded, never required: the GPU machine's own stack (torch 2.11, transformers 5.17) runs it as it is.

Per model:
1. exactness, in each of --exact-dtypes (bfloat16 and float32): `kvstore.engine.verify.check_graft` on --samples random
   (prefix, suffix) pairs, the graft half
   run in kvstore's second-process restorer (kvstore.engine.restore_worker), which builds the same model (its
   fingerprint must match) and restores each artifact from the store by id: verdict = suffix logits' SHA-256
   equal to the fresh reference's;
2. TTFT at --sizes tokens: recompute (prefill N + one token) vs graft (store.get + graft + one forward), with
   the parts, and the ceiling recompute / forward;
3. restore vs raw read: store.get (map + verify the id's hash) in GB/s vs `open().read()` of the same file,
   warm page cache; the host-to-device copy is in the graft part;
4. energy (NVML on CUDA, else RAPL, else declared unavailable): joules per recompute and per graft, repeated
   until the window is >= 0.5 s (NVML's counter updates every 10-100 ms).
0. first (issue 59), the vLLM connector's paged-layout probe on this device (`paged_probe`):
   `kvstore.backends.vllm.paged.self_test` learns the layout of cache writers on device tensors (the GPU's logical
   NHD and HND write as vLLM's `reshape_and_cache_flash` lays it out (vLLM itself is not on the GPU machine), and the
   AMX block layout as a gather/scatter case), each round-tripped bit for bit, with the probe's seconds and
   read/write GB/s of the view (fast path) against the gather/scatter path through the learned index.
Every printed figure names the device kind ([cuda] or [cpu]); a CPU run is a dry run of the pipeline, not a GPU
figure.
Writes one JSON (--out). --budget-s stops starting new measurements when the run gets near its time limit
(skips are recorded, never silent). On one H200 the full run is sized for 8 minutes.
"""

from __future__ import annotations

import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS (before torch starts CUDA)

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import transformers  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

from harness.run.energy import make_meter  # noqa: E402
from kvstore import Backend, Determinism, LocalStore, atomic_write, backend_tools, check_graft  # noqa: E402
from kvstore.engine.restore_worker import ModelSpec, RestoreWorker  # noqa: E402
from kvstore.engine.verify import graft_logits, reference_logits  # noqa: E402
from kvstore.environment import current_environment  # noqa: E402
from kvstore.errors import RestoreWorkerError  # noqa: E402
from kvstore.format.artifact import FORMAT, hash_threads  # noqa: E402
from kvstore.testing.random_models import CONFIGS, build_random_model, kv_bytes  # noqa: E402

FULL_SIZES, SMALL_SIZES = (2048, 8192, 32768), (32, 64, 128)
# the published configurations, smallest first (so a run cut short by --budget-s has the small ones)
DEFAULT_MODELS = ("gemma3-1b-class", "qwen2.5-1.5b-class", "gemma3-4b-class", "qwen2.5-7b-class", "gemma3-12b-class")


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def clock(device: str) -> float:
    sync(device)
    return time.perf_counter()


def exactness(args, be: Backend, name: str, work: Path, rng: random.Random, max_prefix: int) -> dict:
    """check_graft on random pairs, the graft half in kvstore's second-process restorer (the same model built
    there from the same spec, its fingerprint checked)."""
    store_dir = work / "exact"
    store = LocalStore(store_dir)
    spec = ModelSpec("kvstore.testing.random_models:build_random_model",
                     {"name": name, "small": args.small, "device": args.device, "seed": args.seed,
                      "determinism": be.settings()})
    vocab = be.vocab_size()
    rows, t0 = [], time.perf_counter()
    try:
        with RestoreWorker(spec, store_dir, logits_device=args.device) as w:
            try:
                w.check_model(be.fingerprint)
            except RestoreWorkerError as e:
                return {"error": str(e)[:500]}
            for _ in range(args.samples):
                n, m = rng.randint(1, max_prefix), rng.randint(1, 8)
                prefix = [rng.randrange(vocab) for _ in range(n)]
                suffix = [rng.randrange(vocab) for _ in range(m)]
                try:
                    c = check_graft(be, prefix, suffix, store, restore=w.restorer(prefix, suffix))
                    rows.append({"prefix": n, "suffix": m, "equal": c.equal, "max_abs_diff": c.max_abs_diff})
                    store.remove(c.artifact_id)
                except Exception as e:  # noqa: BLE001 - a failed sample is a result, recorded with its reason
                    rows.append({"prefix": n, "suffix": m, "equal": False,
                                 "error": f"{type(e).__name__}: {e}"[:300]})
    finally:
        shutil.rmtree(store_dir, ignore_errors=True)
    equal = sum(r["equal"] for r in rows)
    return {"samples": len(rows), "equal": equal, "all_equal": equal == len(rows) > 0,
            "prefix_tokens": [min(r["prefix"] for r in rows), max(r["prefix"] for r in rows)] if rows else None,
            "restore": "separate process, store.get by id", "failures": [r for r in rows if not r["equal"]][:5],
            "seconds": time.perf_counter() - t0}


def raw_read_s(path: Path) -> float:
    t0 = time.perf_counter()
    with open(path, "rb") as f:
        f.read()
    return time.perf_counter() - t0


def energy(device: str, fn, min_window_s: float = 0.5) -> dict:
    """Joules per call of fn, over enough calls to fill min_window_s (one warm-up call first)."""
    fn()
    meter = make_meter("auto")
    calls, t0 = 0, clock(device)
    meter.start()
    while True:
        fn()
        calls += 1
        if clock(device) - t0 >= min_window_s:
            break
    reading = meter.stop()
    # measured (NVML, RAPL) or estimated (CodeCarbon, labelled by its status); never an estimate as a measurement
    return {"calls": calls, "status": reading.status, "kind": reading.status.split(":", 1)[0],
            "joules_per_call": reading.joules / calls if reading.joules is not None else None}


def ttft_row(args, be: Backend, work: Path, n: int, rng: random.Random, deadline: float) -> dict:
    dev = args.device
    vocab = be.vocab_size()
    prefix, nxt = [rng.randrange(vocab) for _ in range(n)], [rng.randrange(vocab)]
    store = LocalStore(work / f"ttft{n}")
    try:
        def recompute() -> int:
            return int(torch.argmax(reference_logits(be, prefix, nxt)[0, -1]))

        rec = []
        for _ in range(args.repeats):
            t0 = clock(dev)
            recompute()
            rec.append(clock(dev) - t0)
        t0 = clock(dev)
        aid = store.put(be.deposit(prefix))
        deposit_s = clock(dev) - t0
        size = store.info(aid).size
        graft, parts = [], {"get": [], "graft": [], "forward": []}

        def restore() -> int:
            r = graft_logits(be, prefix, nxt, store=store, artifact_id=aid)
            for k in parts:
                parts[k].append(r.timing_s[k])
            return int(torch.argmax(r.logits[0, -1]))

        same = restore() == recompute()
        for _ in range(max(3, args.repeats)):
            t0 = clock(dev)
            restore()
            graft.append(clock(dev) - t0)
        path = store.path(aid)
        reads = [raw_read_s(path) for _ in range(5)]
        gets = []
        for _ in range(5):
            t0 = time.perf_counter()
            store.get(aid)
            gets.append(time.perf_counter() - t0)
        med = {k: statistics.median(v) for k, v in parts.items()}
        row = {"tokens": n, "artifact_bytes": size, "recompute_s": statistics.median(rec),
               "graft_s": statistics.median(graft), "graft_parts_median_s": med, "deposit_s": deposit_s,
               "ratio": statistics.median(rec) / statistics.median(graft),
               "ratio_ceiling": statistics.median(rec) / med["forward"], "argmax_equal": same,
               "read_GBps": size / statistics.median(reads) / 1e9, "restore_GBps": size / statistics.median(gets) / 1e9}
        row["restore_vs_read"] = row["restore_GBps"] / row["read_GBps"]
        row["ttft_vs_ceiling"] = row["ratio"] / row["ratio_ceiling"]
        if time.perf_counter() < deadline:
            row["energy"] = {"recompute": energy(dev, recompute, args.energy_window_s),
                             "graft": energy(dev, restore, args.energy_window_s)}
        else:
            row["energy"] = {"skipped": "time budget"}
        return row
    finally:
        shutil.rmtree(work / f"ttft{n}", ignore_errors=True)


RANDOM_WEIGHTS = ("random weights in the published configurations, built on the device: exactness and speed "
                  "depend on shapes and kernels, not on trained values")


def _flash_writer(key: torch.Tensor, value: torch.Tensor, cache: torch.Tensor, slots: torch.Tensor) -> None:
    """vLLM's GPU `reshape_and_cache_flash` in torch: the logical (blocks, heads, block, 2 * head_dim) cache, per
    token the key's head_dim elements then the value's, whatever the stride order (NHD or HND)."""
    d, bs = key.shape[-1], cache.shape[2]
    kc, vc = cache.transpose(1, 2).split(d, dim=-1)  # (blocks, block, heads, head_dim) each
    kc[slots // bs, slots % bs] = key
    vc[slots // bs, slots % bs] = value


def _amx_writer(key: torch.Tensor, value: torch.Tensor, cache: torch.Tensor, slots: torch.Tensor) -> None:
    """vLLM's CPU "amx" block layout (csrc/cpu/cpu_attn_amx.hpp), scattered on any device: no view reads it."""
    nb, heads, bs, two_d = cache.shape
    d = two_d // 2
    maps = backend_tools("vllm").named_maps(bs, d)  # vLLM's CPU block layouts, by name
    place = maps["cpu_attn/amx[keys(block/16,head_dim/2,16,2);values(head_dim/16,block/2,16,2)]"]
    index = place(heads).to(cache.device)  # (2, heads, bs, d)
    flat = cache.view(nb, -1)
    t = slots % bs
    for kv, x in enumerate((key, value)):  # x: (tokens, heads, d)
        flat[(slots // bs).view(-1, 1, 1), index[kv][:, t, :].permute(1, 0, 2)] = x


def _gbps(nbytes: int, fn, device: str, repeats: int = 5) -> float:  # noqa: ANN001
    fn()
    sync(device)
    t0 = clock(device)
    for _ in range(repeats):
        fn()
    sync(device)
    return nbytes * repeats / max(clock(device) - t0, 1e-9) / 1e9


def _speeds(layout, cache: torch.Tensor, blank: torch.Tensor, block_ids: list[int],
            kv: tuple[torch.Tensor, torch.Tensor], nbytes: int, device: str) -> tuple[float, float]:
    """Read and write GB/s of `layout` over every position `kv` holds."""
    n = kv[0].shape[2]
    return (_gbps(nbytes, lambda: layout.read(cache, block_ids, 0, n), device),
            _gbps(nbytes, lambda: layout.write(blank, block_ids, 0, *kv), device))


def paged_probe(device: str, heads: int, block: int, head_dim: int, tokens: int,
                dtype: torch.dtype = torch.bfloat16) -> dict:
    """The vLLM connector's layout probe on `device` (issue 59): per writer, the layout learned, its SHA-256, the
    probe's seconds, a bit-for-bit round trip of `tokens` positions over blocks out of order, and read/write GB/s
    through the learned layout (the view where the map is one) and through its index (gather/scatter)."""
    writers = {"flash-HND": (_flash_writer, "HND"), "flash-NHD": (_flash_writer, "NHD"), "amx": (_amx_writer, "HND")}
    nblocks = -(-tokens // block) + 2
    out: dict = {"shape": {"kv_heads": heads, "block_size": block, "head_dim": head_dim, "tokens": tokens,
                           "dtype": str(dtype).removeprefix("torch.")}, "writers": {}}
    for name, (writer, order) in writers.items():
        if order == "NHD":
            like = torch.zeros(nblocks, block, heads, 2 * head_dim, dtype=dtype, device=device).transpose(1, 2)
        else:
            like = torch.zeros(nblocks, heads, block, 2 * head_dim, dtype=dtype, device=device)
        try:
            t0 = time.perf_counter()
            layout = backend_tools("vllm").self_test(writer, like, block, name)
            sync(device)
            probe_s = time.perf_counter() - t0
        except Exception as e:  # noqa: BLE001 - recorded, never silent: the probe's refusal is the finding
            out["writers"][name] = {"error": f"{type(e).__name__}: {e}"[:400]}
            continue
        block_ids = torch.randperm(nblocks - 1, generator=torch.Generator().manual_seed(0)).tolist()
        gen = torch.Generator().manual_seed(1)
        k_in = torch.randn(tokens, heads, head_dim, generator=gen).to(dtype).to(device)
        v_in = torch.randn(tokens, heads, head_dim, generator=gen).to(dtype).to(device)
        slots = torch.tensor([block_ids[p // block] * block + p % block for p in range(tokens)], device=device)
        cache = torch.zeros_like(like)
        writer(k_in, v_in, cache, slots)
        k, v = layout.read(cache, block_ids, 0, tokens)
        blank = torch.zeros_like(like)
        layout.write(blank, block_ids, 0, k, v)
        same = (torch.equal(k[0].permute(1, 0, 2).cpu().view(torch.int16 if dtype.itemsize == 2 else torch.int32),
                            k_in.cpu().view(torch.int16 if dtype.itemsize == 2 else torch.int32))
                and torch.equal(blank.cpu().contiguous().view(torch.uint8), cache.cpu().contiguous().view(torch.uint8)))
        nbytes = 2 * tokens * heads * head_dim * dtype.itemsize
        gather = backend_tools("vllm").LearnedLayout(layout.name, layout.index, layout.dtype, None)
        row = {"layout": layout.name, "sha256": layout.digest, "fast_path": layout.view is not None,
               "probe_s": probe_s, "round_trip": bool(same)}
        row["read_GBps"], row["write_GBps"] = _speeds(layout, cache, blank, block_ids, (k, v), nbytes, device)
        if layout.view is not None:  # the same map through its index: what the fast path saves
            row["gather_read_GBps"], row["scatter_write_GBps"] = _speeds(gather, cache, blank, block_ids, (k, v),
                                                                         nbytes, device)
        out["writers"][name] = row
    return out


def run(args: argparse.Namespace) -> dict:
    t_start = time.perf_counter()
    deadline = t_start + args.budget_s
    det = Determinism(dtype=args.dtype, threads=args.threads)
    exact_dtypes = [d for d in args.exact_dtypes.split(",") if d]
    sizes = [int(x) for x in args.sizes.split(",")] if args.sizes else list(SMALL_SIZES if args.small else FULL_SIZES)
    dev = args.device
    env = current_environment(torch.device(dev)).to_dict()  # recorded with the figures, never required
    out: dict = {
        "device": torch.cuda.get_device_name(0) if dev.startswith("cuda") else env["cpu_model"] or env["machine"],
        "environment": env,
        "device_kind": "cuda" if dev.startswith("cuda") else "cpu", "torch": torch.__version__,
        "transformers": transformers.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
        "format": FORMAT, "hash_threads": hash_threads(), "weights": RANDOM_WEIGHTS,
        "settings": {"small": args.small, "sizes": sizes, "samples": args.samples, "repeats": args.repeats,
                     "dtype": args.dtype, "exact_dtypes": exact_dtypes, "seed": args.seed, "budget_s": args.budget_s,
                     "energy_window_s": args.energy_window_s,
                     "determinism": det.to_dict()},
        "models": {}, "skipped": [],
    }
    # first: the vLLM connector's paged-layout probe on this device (issue 59), seconds on any device
    out["paged_probe"] = (paged_probe(dev, 2, 32, 64, 256) if args.small else paged_probe(dev, 8, 32, 128, 8192))
    work = Path(tempfile.mkdtemp(prefix="kvgraft-gpu-bench-", dir=args.work))
    rng = random.Random(args.seed)
    try:
        for name in args.models.split(","):
            if time.perf_counter() > deadline:
                out["skipped"].append(f"{name}: time budget")
                continue
            t0 = time.perf_counter()
            be = build_random_model(name, args.small, det, dev, args.seed)
            alone = backend_tools(be.name).bare  # the transformers model itself: its config, parameters
            model = alone.model(be)
            m = out["models"][name] = {
                "layers": be.layer_kinds(), "parameters": alone.parameter_count(be),
                "kv_bytes_per_token_full": kv_bytes(model.config, 1), "build_s": time.perf_counter() - t0, "ttft": []}
            del model
            window = be.sliding_window()
            max_prefix = 2 * window if window else min(sizes)
            m["exactness"] = {}
            if args.dtype in exact_dtypes:
                m["exactness"][args.dtype] = exactness(args, be, name, work, rng, max_prefix)
            for n in sizes:
                if time.perf_counter() > deadline:
                    out["skipped"].append(f"{name} at {n} tokens: time budget")
                    continue
                try:
                    m["ttft"].append(ttft_row(args, be, work, n, rng, deadline))
                except torch.cuda.OutOfMemoryError as e:
                    out["skipped"].append(f"{name} at {n} tokens: out of memory ({str(e)[:120]})")
            del be
            if dev.startswith("cuda"):
                torch.cuda.empty_cache()
            for dt in (d for d in exact_dtypes if d != args.dtype):  # the same config in the other dtypes
                if time.perf_counter() > deadline:
                    out["skipped"].append(f"{name} exactness in {dt}: time budget")
                    continue
                other = build_random_model(name, args.small, Determinism(dtype=dt, threads=args.threads), dev,
                                           args.seed)
                m["exactness"][dt] = exactness(args, other, name, work, rng, max_prefix)
                del other
                if dev.startswith("cuda"):
                    torch.cuda.empty_cache()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out["runtime_s"] = time.perf_counter() - t_start
    return out


def _energy_text(e: dict) -> str:
    if "joules_per_call" not in e:
        return "skipped (time budget)"
    j, (kind, detail) = e["joules_per_call"], e["status"].split(":", 1)
    return f"{j:.3g} J, {kind} ({detail})" if j is not None else f"{kind} ({detail})"


def report_lines(result: dict) -> list[str]:
    """Every figure of a result, one per line, each marked with the device kind ([cuda] or [cpu])."""
    k = f"[{result['device_kind']}]"
    lines = [f"{k} {result['device']}; torch {result['torch']}, transformers {result['transformers']}, CUDA "
             f"{result['cuda']}, python {result['python']} (recorded, not required)", f"{k} {result['weights']}"]
    probe = result.get("paged_probe", {})
    for name, r in probe.get("writers", {}).items():
        if "error" in r:
            lines.append(f"{k} paged probe {name}: refused: {r['error']}")
            continue
        extra = (f" (its index: read {r['gather_read_GBps']:.2f}, write {r['scatter_write_GBps']:.2f} GB/s)"
                 if "gather_read_GBps" in r else "")
        lines.append(f"{k} paged probe {name}: learned {r['layout'][:60]} in {r['probe_s'] * 1e3:.0f} ms, round "
                     f"trip {'bit for bit' if r['round_trip'] else 'DIFFERS'}; read {r['read_GBps']:.2f}, write "
                     f"{r['write_GBps']:.2f} GB/s{extra}")
    for name, m in result["models"].items():
        exact = ", ".join(f"{dt} {ex.get('equal')}/{ex.get('samples')}" if "error" not in ex else f"{dt} error: "
                          f"{ex['error'][:200]}" for dt, ex in m["exactness"].items())
        lines.append(f"{k} {name} ({m['layers']}, {m['parameters']:,} parameters): exact, restored in another "
                     f"process: {exact or 'not run'}")
        for r in m["ttft"]:
            lines.append(f"{k}   {r['tokens']:>6} tok  TTFT graft {r['graft_s'] * 1e3:8.1f} ms  recompute "
                         f"{r['recompute_s'] * 1e3:8.1f} ms  {r['ratio']:6.1f}x (ceiling {r['ratio_ceiling']:.1f}x)")
            lines.append(f"{k}   {r['tokens']:>6} tok  verified restore {r['restore_GBps']:.2f} GB/s vs raw read "
                         f"{r['read_GBps']:.2f} GB/s ({r['restore_vs_read']:.0%}), {r['artifact_bytes']:,} bytes")
            e = r["energy"]
            if "skipped" in e:
                lines.append(f"{k}   {r['tokens']:>6} tok  energy skipped ({e['skipped']})")
            else:
                lines.append(f"{k}   {r['tokens']:>6} tok  energy per graft {_energy_text(e['graft'])}; per "
                             f"recompute {_energy_text(e['recompute'])}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="the JSON to write")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--small", action="store_true", help="tiny dimensions (CPU dry run)")
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS), help=f"comma-separated, of {list(CONFIGS)}")
    ap.add_argument("--sizes", default=None, help="prefix tokens for TTFT (default 2048,8192,32768; small 32,64,128)")
    ap.add_argument("--samples", type=int, default=50, help="exactness samples per model")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", default="bfloat16", help="the dtype of the TTFT, restore and energy figures")
    ap.add_argument("--exact-dtypes", default="bfloat16,float32", help="dtypes of the exactness check")
    ap.add_argument("--threads", type=int, default=max(1, min(16, len(os.sched_getaffinity(0)))))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--budget-s", type=float, default=420.0, help="start nothing new after this many seconds")
    ap.add_argument("--energy-window-s", type=float, default=0.5, help="shortest energy window (NVML: >= 0.1 s)")
    ap.add_argument("--work", default=None, help="folder for the temporary stores (default: the system temp)")
    args = ap.parse_args(argv)
    if args.out is None:
        ap.error("--out is required")
    unknown = sorted(set(args.models.split(",")) - set(CONFIGS))
    if unknown:
        ap.error(f"unknown model(s) {unknown}; choose from {list(CONFIGS)}")
    result = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(args.out, (json.dumps(result, indent=2, default=float) + "\n").encode())
    for line in report_lines(result):
        print(line)
    print(f"wrote {args.out} in {result['runtime_s']:.0f} s; skipped: {result['skipped'] or 'nothing'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
