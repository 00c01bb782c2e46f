"""make bench-context: the store holds far more KV than any context window, at a flat cost per lookup.

    .venv/bin/python -m scripts.bench.context --out runs/bench [--model tiny-gemma3] [--artifacts 100000]
        [--total-tokens 3000000] [--checkpoints 10,100,1000,10000,100000] [--samples 200] [--threads 1]

Fills a LocalStore under <out>/context_store with real deposits (prefill + capture of distinct random token
sequences, ~total/artifacts tokens each, varied) from a small random-weight model, until it holds at least
--total-tokens tokens of KV in at least --artifacts artifacts. Then, for a store of exactly each checkpoint
size (the filled store for the largest, fresh copies of the first c artifacts for the others), it times the
lookup (find_tokens by tokens SHA-256, then info) and the restore (get + graft) of random artifacts, and the peak
memory meanwhile (RSS on CPU; device memory on GPU), in interleaved rounds so that load from other processes does
not bias one size. Writes <out>/context.json and <out>/context.png.

A re-run reuses the store: deposits are a pure function of their index (seeded), so only missing ones are made.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import queue
import random
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import torch
from tqdm import tqdm

from kvstore import (
    Backend,
    Determinism,
    LocalStore,
    Snapshot,
    atomic_write,
    backend_tools,
    load_backend,
    to_bytes,
    tokens_sha256,
)
from kvstore.determinism import add_arguments, from_arguments
from scripts.bench.common import stats

SEED = 20240611
BATCH = 256  # artifacts per put_many
ROUNDS = 5  # interleaved measurement rounds over all checkpoint stores


def plan_lengths(artifacts: int, total_tokens: int, seed: int = SEED) -> np.ndarray:
    """Token count of each artifact: ceil(total/artifacts) +- 10, varied, summing to at least total_tokens."""
    base = -(-total_tokens // artifacts)
    rng = np.random.default_rng(seed)
    lengths = np.clip(base + rng.integers(-10, 11, size=artifacts), 2, None)
    short = total_tokens - int(lengths.sum())
    if short > 0:
        lengths[np.arange(short) % artifacts] += 1 + short // artifacts
    return lengths


def sequence(i: int, length: int, vocab: int, bos: int | None) -> list[int]:
    """Artifact i's token ids: BOS then seeded random ids (distinct sequences; no special ids)."""
    rng = random.Random(SEED * 1_000_003 + i)
    head = [bos] if bos is not None else []
    return head + [rng.randrange(4, vocab) for _ in range(length - len(head))]


def peak_reset() -> bool:
    """Reset the kernel's peak-RSS mark for this process (Linux clear_refs 5); False where unsupported."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def peak_rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return psutil.Process().memory_info().rss


def vocab_and_bos(be: Backend) -> tuple[int, int | None]:
    """The vocabulary size and the BOS id (what `encode` of empty text gives; None where the tokenizer adds none)."""
    head = be.encode("")
    return be.vocab_size(), (head[0] if head else None)


def deposit_batch(be: Backend, indices: list[int], lengths: list[int]) -> list[Snapshot]:
    """Snapshots of the given plan entries (prefill + capture, one sequence at a time), each carrying the numerics
    record its capture measured: a put in this process records it (issue 61)."""
    vocab, bos = vocab_and_bos(be)
    return [be.deposit(sequence(i, n, vocab, bos)) for i, n in zip(indices, lengths, strict=True)]


_WORKER = None


def _worker_init(model: str, determinism: dict, root: str) -> None:
    global _WORKER
    _WORKER = (load_backend("transformers", source=model, determinism=Determinism.from_dict(determinism)),
               LocalStore(root))


def _worker_batch(job: tuple[list[int], list[int]]) -> tuple[str, int]:
    """Deposit and put a batch in the worker: the process that computed the bytes measured their numerics, so its put
    records them; the parent never stamps its own fingerprint on bytes a worker computed (issue 61)."""
    be, store = _WORKER
    store.put_many(deposit_batch(be, *job), tags=["bench-context"])
    return be.fingerprint, len(job[0])


class Filler:
    """Deposits artifacts and writes them with put_many (atomic fsync'd file writes + one index transaction).
    Writing runs on a thread, overlapping the next batch's deposits; large fills deposit in `workers` processes
    (the deposits of this small model are Python-bound, so threads would not run in parallel)."""

    POOL_MIN = 5000  # below this many missing artifacts, starting worker processes costs more than it saves

    def __init__(self, be: Backend, store: LocalStore, lengths: np.ndarray, workers: int) -> None:
        self.be, self.store, self.lengths, self.workers = be, store, lengths, workers
        self.pool = None
        self.fill_s = 0.0
        self.deposited = 0

    def _batches(self, indices: list[int]):
        jobs = [(c, [int(self.lengths[i]) for i in c]) for c in
                (indices[s : s + BATCH] for s in range(0, len(indices), BATCH))]
        if self.workers > 1 and (self.pool is not None or len(indices) >= self.POOL_MIN):
            if self.pool is None:
                ctx = multiprocessing.get_context("spawn")
                self.pool = ctx.Pool(self.workers, _worker_init,
                                     (self.be.model_name, self.be.settings(), str(self.store.root)))
            for fingerprint, n in self.pool.imap(_worker_batch, jobs):
                if fingerprint != self.be.fingerprint:
                    raise RuntimeError("a worker built a different model (fingerprints differ); use --workers 1")
                yield n  # stored by the worker
        else:
            for job in jobs:
                yield deposit_batch(self.be, *job)

    def fill(self, indices: list[int], bar: tqdm) -> None:
        q: queue.Queue = queue.Queue(maxsize=2)
        errors: list[BaseException] = []

        def writer() -> None:
            while (batch := q.get()) is not None:
                try:
                    if not isinstance(batch, int):  # snapshots this process captured: their measured records go in
                        self.store.put_many(batch, tags=["bench-context"])
                except BaseException as e:  # surfaced on the main thread
                    errors.append(e)
                bar.update(batch if isinstance(batch, int) else len(batch))

        t0 = time.perf_counter()
        th = threading.Thread(target=writer, daemon=True)
        th.start()
        try:
            for batch in self._batches(indices):
                if errors:
                    break
                self.deposited += batch if isinstance(batch, int) else len(batch)
                q.put(batch)
        finally:
            q.put(None)
            th.join()
        self.fill_s += time.perf_counter() - t0
        if errors:
            raise errors[0]

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool.join()


def measure(be: Backend, store: LocalStore, picks: list[int], lengths: np.ndarray, into: dict,
            records: LocalStore | None = None) -> None:
    """Time lookup (find_tokens + info) and restore (get + graft) of the plan entries `picks`; append the latencies
    to `into` and raise its peak-memory marks. `records`: the store whose numerics records the copies' artifacts
    (the same bytes, the same ids) are admitted on, read in the restore's time (None: `store`'s own)."""
    vocab, bos = vocab_and_bos(be)
    seqs = [sequence(i, int(lengths[i]), vocab, bos) for i in picks]
    shas = [tokens_sha256(s) for s in seqs]
    device = backend_tools(be.name).bare.device(be)
    on_gpu = device.type == "cuda"
    if on_gpu:
        torch.cuda.reset_peak_memory_stats(device)
    reset = peak_reset()  # the peak mark now equals the current RSS
    rss_before = psutil.Process().memory_info().rss
    sample_peak = rss_before
    for seq, sha in zip(seqs, shas, strict=True):
        t0 = time.perf_counter()
        ids = store.find_tokens(sha)
        store.info(ids[0])
        t1 = time.perf_counter()
        snap = store.get(ids[0])
        if records is not None:
            snap.numerics = records.numerics_record(ids[0])  # the record of the store its deposit wrote it in
        cache = be.graft(snap, seq)
        t2 = time.perf_counter()
        into["lookup"].append(t1 - t0)
        into["restore"].append(t2 - t1)
        del cache
        if not reset:
            sample_peak = max(sample_peak, psutil.Process().memory_info().rss)
    peak = peak_rss() if reset else sample_peak
    into["peak_rss"] = max(into.get("peak_rss", 0), peak)
    into["peak_rss_increase"] = max(into.get("peak_rss_increase", 0), peak - rss_before)
    into["rss_before"] = max(into.get("rss_before", 0), rss_before)
    into["peak_method"] = "VmHWM after clear_refs reset" if reset else "psutil RSS sampled after each restore"
    if on_gpu:
        into["device_peak"] = max(into.get("device_peak", 0), torch.cuda.max_memory_allocated(device))


def copy_first(src: LocalStore, dst_root: Path, ids: list[str]) -> LocalStore:
    """A fresh store holding exactly `ids` (bytes copied and verified on the way, nothing recomputed). No numerics
    record is written to it (a copy carries none: issue 61); `measure` reads each artifact's record from the store
    that measured it (`records`)."""
    shutil.rmtree(dst_root, ignore_errors=True)
    dst = LocalStore(dst_root)
    for start in range(0, len(ids), BATCH):
        batch = ids[start : start + BATCH]
        dst.put_many([src.get_bytes(a) for a in batch], tags=["bench-context"])
    return dst


def put_cost(be: Backend, root: Path, n: int = 200) -> dict:
    """ms per artifact: deposit + serialize, then a loop of put_bytes vs one put_many of the same bytes."""
    vocab, bos = vocab_and_bos(be)
    t0 = time.perf_counter()
    data = [to_bytes(be.deposit(sequence(10**9 + i, 31, vocab, bos))) for i in range(n)]
    out = {"deposit_and_to_bytes_ms_per_artifact": (time.perf_counter() - t0) / n * 1e3, "artifacts": n,
           "artifact_bytes": len(data[0])}
    for name in ("put_bytes_loop", "put_many"):
        d = Path(tempfile.mkdtemp(dir=root))
        s = LocalStore(d)
        t0 = time.perf_counter()
        if name == "put_many":
            s.put_many(data)
        else:
            for b in data:
                s.put_bytes(b)
        out[f"{name}_ms_per_artifact"] = (time.perf_counter() - t0) / n * 1e3
        shutil.rmtree(d)
    return out


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = result["checkpoints"]
    x = [p["artifacts"] for p in pts]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for key, label in (("lookup_s", "lookup (find_tokens + info)"), ("restore_s", "restore (get + graft)")):
        med = [p[key]["median"] * 1e3 for p in pts]
        err = [[m - p[key]["min"] * 1e3 for m, p in zip(med, pts, strict=True)],
               [p[key]["max"] * 1e3 - m for m, p in zip(med, pts, strict=True)]]
        a1.errorbar(x, med, yerr=err, marker="o", capsize=3, label=label)
    a1.set(xscale="log", xlabel="artifacts in the store", ylabel="latency (ms), median [min-max]",
           title="Lookup and restore vs store size")
    a1.set_ylim(bottom=0)
    a1.grid(True, which="both", alpha=0.3)
    a1.legend(fontsize=8)
    a2.plot(x, [p["peak_rss_bytes"] / 2**20 for p in pts], "o-", label="peak RSS while measuring")
    a2.plot(x, [p["peak_rss_increase_bytes"] / 2**20 for p in pts], "s--", label="increase over RSS before")
    if any("device_peak_bytes" in p for p in pts):
        a2.plot(x, [p.get("device_peak_bytes", 0) / 2**20 for p in pts], "^-", label="device peak")
    a2.set(xscale="log", xlabel="artifacts in the store", ylabel="MiB", title="Peak memory vs store size")
    a2.set_ylim(bottom=0)
    a2.grid(True, which="both", alpha=0.3)
    a2.legend(fontsize=8)
    tokens = result["store"]["tokens"]
    fig.suptitle(f"{result['store']['artifacts']:,} artifacts, {tokens:,} tokens of KV ({result['model']['name']})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model", default="tiny-gemma3")
    ap.add_argument("--artifacts", type=int, default=100_000)
    ap.add_argument("--total-tokens", type=int, default=3_000_000)
    ap.add_argument("--checkpoints", default="10,100,1000,10000,100000")
    ap.add_argument("--samples", type=int, default=200, help="random artifacts timed per checkpoint")
    add_arguments(ap)  # one flag per kvstore.Determinism field
    ap.set_defaults(threads=1)  # the bulk deposits: tiny GEMMs gain nothing from a second thread
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)),
                    help="deposit processes for large fills (default: usable cores)")
    args = ap.parse_args(argv)

    t_start = time.perf_counter()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    checkpoints = sorted({min(int(c), args.artifacts) for c in args.checkpoints.split(",") if c.strip()})
    if checkpoints[-1] != args.artifacts:
        checkpoints.append(args.artifacts)
    det = from_arguments(args)
    be = load_backend("transformers", source=args.model, determinism=det, device=args.device)
    lengths = plan_lengths(args.artifacts, args.total_tokens)
    vocab, bos = vocab_and_bos(be)
    store = LocalStore(out / "context_store")
    held = {i.tokens_sha256 for i in store.list() if i.model_fingerprint == be.fingerprint}
    print(f"store {store.root}: {len(held):,} artifacts of this model already", flush=True)

    def have(i: int) -> bool:
        return tokens_sha256(sequence(i, int(lengths[i]), vocab, bos)) in held

    reused = sum(1 for i in range(args.artifacts) if have(i)) if held else 0
    put = put_cost(be, out, n=min(200, max(20, args.artifacts // 10)))
    filler = Filler(be, store, lengths, args.workers if args.device == "cpu" else 1)
    with tqdm(total=args.artifacts, initial=reused, desc="depositing", unit="artifact", smoothing=0.05) as bar:
        filler.fill([i for i in range(args.artifacts) if not held or not have(i)], bar)
    filler.close()

    # One store of exactly each checkpoint size: the filled store for the largest, fresh copies of the first c
    # artifacts (bytes copied, nothing recomputed) for the others.
    n_store = len(store)
    scratch = out / "context_checkpoints"
    shutil.rmtree(scratch, ignore_errors=True)
    smaller = [c for c in checkpoints if c < n_store]
    ids = [store.find_tokens(tokens_sha256(sequence(i, int(lengths[i]), vocab, bos)))[0]
           for i in range(max(smaller, default=0))]
    stores = {}
    for c in checkpoints:
        if c in smaller:
            stores[c] = (copy_first(store, scratch / str(c), ids[:c]), f"fresh copy of the first {c:,} artifacts")
        else:
            stores[c] = (store, "the filled store")
    os.sync()  # settle the copies' metadata writes before timing reads
    # Interleaved rounds in shuffled order, so that a burst of load from other processes is spread over all
    # store sizes instead of biasing whichever was measured at that moment.
    rng = random.Random(SEED)
    raw = {c: {"lookup": [], "restore": []} for c in checkpoints}
    per_round = -(-args.samples // ROUNDS)
    for _ in range(ROUNDS):
        for c in rng.sample(checkpoints, len(checkpoints)):
            measure(be, stores[c][0], [rng.randrange(c) for _ in range(per_round)], lengths, raw[c],
                    None if stores[c][0] is store else store)
    points = []
    for c in checkpoints:
        r, (st, kind) = raw[c], stores[c]
        point = {"artifacts": c, "store": kind, "store_artifacts": len(st), "samples": len(r["lookup"]),
                 "lookup_s": stats(r["lookup"]), "restore_s": stats(r["restore"]), "rss_before_bytes": r["rss_before"],
                 "peak_rss_bytes": r["peak_rss"], "peak_rss_increase_bytes": r["peak_rss_increase"],
                 "peak_rss_method": r["peak_method"], "index_bytes": st.index_path.stat().st_size}
        if "device_peak" in r:
            point["device_peak_bytes"] = r["device_peak"]
        points.append(point)
        print(f"{c:>8,} artifacts: lookup {point['lookup_s']['median'] * 1e3:.2f} ms, restore "
              f"{point['restore_s']['median'] * 1e3:.2f} ms, peak RSS {point['peak_rss_bytes'] / 2**20:.0f} MiB")
    shutil.rmtree(scratch, ignore_errors=True)

    infos = [i for i in store.list() if i.model_fingerprint == be.fingerprint]
    fill = {"deposited": filler.deposited, "fill_s": filler.fill_s,
            "artifacts_per_s": filler.deposited / filler.fill_s if filler.deposited else None,
            "workers": filler.workers if filler.pool is not None else 1, "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "loadavg": os.getloadavg()}
    history_path = out / "context_fill_history.json"
    history = json.loads(history_path.read_text()) if history_path.exists() else []
    if filler.deposited:
        history.append(fill)
        atomic_write(history_path, (json.dumps(history, indent=2) + "\n").encode())
    first, last = points[0], points[-1]
    ratio = {k: last[k]["median"] / first[k]["median"] for k in ("lookup_s", "restore_s")}
    ratio["peak_rss"] = last["peak_rss_bytes"] / first["peak_rss_bytes"]
    flat = all(v <= 1.5 for v in ratio.values())
    spread = {k: max(q[k]["median"] for q in points) / min(q[k]["median"] for q in points)
              for k in ("lookup_s", "restore_s")}
    spread["peak_rss"] = max(q["peak_rss_bytes"] for q in points) / min(q["peak_rss_bytes"] for q in points)
    result = {
        "model": {"name": be.model_name, "fingerprint": be.fingerprint,
                  "random_weights": be.model_name.startswith("tiny-"), "layers": be.layer_kinds(),
                  "determinism": det.to_dict(), "device": str(backend_tools(be.name).bare.device(be))},
        "store": {"root": str(store.root), "artifacts": len(infos), "tokens": sum(i.token_count for i in infos),
                  "bytes": sum(i.size for i in infos), "index_bytes": store.index_path.stat().st_size,
                  "reused_at_start": reused, "deposited_this_run": filler.deposited,
                  "tokens_per_artifact": {"min": int(lengths.min()), "max": int(lengths.max()),
                                          "mean": float(lengths.mean())}},
        "fill": {"this_run": fill, "history": history, "put_cost": put,
                 "note": "deposits in worker processes for large fills (else in-process), put_many (atomic fsync'd "
                         "writes + one index transaction) on a writer thread, overlapped; history lists every run "
                         "that deposited into this store"},
        "checkpoints": points,
        "largest_over_smallest": ratio,
        "max_over_min_across_checkpoints": spread,
        "flat": flat,
        "note": (f"from {first['artifacts']:,} to {last['artifacts']:,} artifacts: lookup x{ratio['lookup_s']:.2f}, "
                 f"restore x{ratio['restore_s']:.2f}, peak RSS x{ratio['peak_rss']:.2f} "
                 f"({'flat' if flat else 'NOT flat'}: threshold 1.5x for timing noise on a shared machine; across all "
                 f"checkpoints the medians span x{spread['lookup_s']:.2f} / x{spread['restore_s']:.2f} / "
                 f"x{spread['peak_rss']:.2f}). Lookups "
                 "go through the SQLite index on tokens_sha256; a restore reads one object file, so neither scans "
                 "the store; each call opens its own index connection (constant cost)."),
        "runtime_s": time.perf_counter() - t_start,
        "loadavg_end": os.getloadavg(),
    }
    atomic_write(out / "context.json", (json.dumps(result, indent=2) + "\n").encode())
    plot(result, out / "context.png")
    print(result["note"])
    print(f"store: {result['store']['artifacts']:,} artifacts, {result['store']['tokens']:,} tokens, "
          f"{result['store']['bytes'] / 1e9:.2f} GB; wrote {out / 'context.json'} and context.png in "
          f"{result['runtime_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
