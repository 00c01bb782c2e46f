"""`make bench`, figure 2: artifact restore in bytes/s versus `open().read()` of the same file, warm page cache
and cold (posix_fadvise DONTNEED, checked with fincore), and the host-memory tier (kvstore.CachedStore) against
the disk store."""


from __future__ import annotations

import hashlib
import mmap
import os
import statistics
import subprocess
from pathlib import Path

from kvstore import Backend, CachedStore, LocalStore, from_bytes
from kvstore.format.artifact import FORMAT, content_id, hash_threads
from scripts.bench.common import GOALS, clock, goal_row, stats, timed

# ---------------------------------------------------------------- 2. restore vs raw read (+ tier)

def drop_page_cache(path: Path) -> bool:
    """Ask the kernel to drop the file's pages; True if fincore then reports none resident."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return resident_bytes(path) == 0


def resident_bytes(path: Path) -> int | None:
    try:
        out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)],
                             capture_output=True, text=True, check=True).stdout.strip()
        return int(out)
    except (OSError, subprocess.CalledProcessError, ValueError):
        return None


def mapped(path: Path) -> memoryview:
    """The file mapped privately, no copy (the page cache's pages), as LocalStore.get maps an object before it
    hashes it; through the store's public path, not its private mapping."""
    with open(path, "rb", buffering=0) as f:
        return memoryview(mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ))


def raw_read(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def bench_restore(be: Backend, store: LocalStore, ttft_rows: list[dict], repeats: int,
                  quick: bool) -> tuple[dict, dict]:
    reps = max(repeats, 5)
    tier = CachedStore(store, max_bytes=2 << 30)
    rows, tier_rows = [], []
    for row in ttft_rows:
        aid, n = row["artifact_id"], row["tokens"]
        path, size = store.path(aid), row["artifact_bytes"]

        def restore(s=store, aid=aid):
            return be.graft(s.get(aid))

        data = raw_read(path)
        restore()
        # raw read, restore and the id's hash alone (BLAKE3 on all CPUs for v2, over the mapped file, as store.get
        # runs it) interleaved, in rotating order: a 28 MB file is most of this CPU's L3, so timings of one side
        # depend on what ran just before; side by side, each sees the same neighbours
        sides = {"read": lambda p=path: raw_read(p), "restore": restore,
                 "hash": lambda p=path: content_id(mapped(p))}  # mapped as LocalStore.get maps an object
        times: dict[str, list[float]] = {k: [] for k in sides}
        for i in range(reps):
            for k in list(sides)[i % 3:] + list(sides)[: i % 3]:
                t0 = clock()
                sides[k]()
                times[k].append(clock() - t0)
        read_t, rest_t, idh_t = times["read"], times["restore"], times["hash"]
        # where else the time could go (each stage alone, same bytes)
        sha_t, _ = timed(lambda d=data: hashlib.sha256(d).digest(), reps)  # the kvgraft-kv/1 id, for comparison
        buf = bytearray(data)  # writable, like the private mapping store.get parses
        parse_t, snap = timed(lambda b=buf: from_bytes(b), reps)
        snap.numerics = store.numerics_record(aid)  # from_bytes attaches no numerics evidence; admission needs it
        graft_t, _ = timed(lambda s=snap: be.graft(s), reps)
        cold = {"attempted": not quick}
        if not quick:
            cr, cg, dropped = [], [], []
            for _ in range(max(2, repeats)):
                dropped.append(drop_page_cache(path))
                t0 = clock()
                raw_read(path)
                cr.append(clock() - t0)
                dropped.append(drop_page_cache(path))
                t0 = clock()
                restore()
                cg.append(clock() - t0)
            cold.update({"page_cache_dropped": all(dropped), "read_Bps": stats([size / t for t in cr]),
                         "restore_Bps": stats([size / t for t in cg])})
            cold["ratio"] = cold["restore_Bps"]["median"] / cold["read_Bps"]["median"]
            raw_read(path)  # warm again
        r_bw, g_bw = stats([size / t for t in read_t]), stats([size / t for t in rest_t])
        rows.append({
            "tokens": n, "artifact_bytes": size, "read_Bps": r_bw, "restore_Bps": g_bw,
            "ratio": g_bw["median"] / r_bw["median"], "restore_s": stats(rest_t),
            "stages_median_s": {"read": statistics.median(read_t), "file_sha256": statistics.median(sha_t),
                                "file_id_hash": statistics.median(idh_t),
                                "parse_and_tensor_sha256": statistics.median(parse_t),
                                "graft": statistics.median(graft_t)},
            "cold": cold,
        })
        # host-memory tier: a miss reads through the disk store, then hits come from memory
        t0 = clock()
        be.graft(tier.get(aid))
        miss = clock() - t0
        hit_t, _ = timed(lambda t=tier, aid=aid: be.graft(t.get(aid)), reps)
        tier_rows.append({"tokens": n, "artifact_bytes": size, "disk_warm_s": stats(rest_t), "tier_hit_s": stats(hit_t),
                          "tier_miss_s": miss, "speedup": statistics.median(rest_t) / statistics.median(hit_t)})
    at = goal_row(rows, GOALS["ttft_at"])
    st = at["stages_median_s"]
    sha_bps = at["artifact_bytes"] / st["file_sha256"]
    idh_bps = at["artifact_bytes"] / st["file_id_hash"]
    warm = [r["ratio"] for r in rows]
    cold_rows = [r for r in rows if r["cold"].get("ratio")]
    fig = {"goal": f"restore (get + graft) >= {GOALS['restore_fraction']:.0%} of raw read bandwidth (warm page cache)",
           "rows": rows, "evaluated_at_tokens": at["tokens"], "ratio": at["ratio"],
           "met": at["ratio"] >= GOALS["restore_fraction"], "sha256_Bps": sha_bps, "id_hash_Bps": idh_bps,
           "id_hash": f"{FORMAT}: " + ("BLAKE3-256" if FORMAT != "kvgraft-kv/1" else "SHA-256"),
           "hash_threads": hash_threads(),
           # store.get maps the file (no copy) and hashes it: the hash alone bounds restore at read/hash
           "ceiling_file_hash_only": min(1.0, st["read"] / st["file_id_hash"])}
    fig["note"] = (
        f"{at['ratio']:.0%} of raw read at {at['tokens']} tokens ({at['artifact_bytes'] / 1e6:.1f} MB; "
        f"{min(warm):.0%}-{max(warm):.0%} over all sizes"
        + (f", {min(r['cold']['ratio'] for r in cold_rows):.0%}-{max(r['cold']['ratio'] for r in cold_rows):.0%} "
           "with a cold page cache" if cold_rows else "")
        + f"). Stages alone: read {st['read'] * 1e3:.1f} ms, the id's hash ({fig['id_hash']}, "
        f"{fig['hash_threads']} threads, mapped file) {st['file_id_hash'] * 1e3:.1f} ms ({idh_bps / 1e9:.2f} GB/s; "
        f"SHA-256, the kvgraft-kv/1 id, {st['file_sha256'] * 1e3:.1f} ms = {sha_bps / 1e9:.2f} GB/s), "
        f"parse + per-tensor SHA-256 "
        f"{st['parse_and_tensor_sha256'] * 1e3:.1f} ms (a deep check; get skips it: tensors are hash-checked when an "
        f"artifact enters the store), graft {st['graft'] * 1e3:.2f} ms. store.get maps the file (no copy) and "
        f"hashes every byte against the id (on a worker thread while the header is parsed; no tensor is returned "
        f"before the hash matched), against a {at['read_Bps']['median'] / 1e9:.2f} GB/s "
        f"page-cache read into a fresh buffer: the hash alone caps restore at {fig['ceiling_file_hash_only']:.0%} "
        "of raw read. Tensors view the verified mapping (copy-on-write).")
    if not fig["met"]:
        fig["note"] = f"missed by {GOALS['restore_fraction'] / at['ratio']:.1f}x: " + fig["note"]
    if cold_rows:
        fig["cold_page_cache_dropped"] = all(r["cold"]["page_cache_dropped"] for r in cold_rows)
        for t in tier_rows:
            cold = next((r["cold"] for r in cold_rows if r["tokens"] == t["tokens"]), None)
            if cold:
                t["disk_cold_s"] = t["artifact_bytes"] / cold["restore_Bps"]["median"]
                t["speedup_vs_cold"] = t["disk_cold_s"] / t["tier_hit_s"]["median"]
    speedups = [r["speedup"] for r in tier_rows]
    cold_speedups = [r["speedup_vs_cold"] for r in tier_rows if "speedup_vs_cold" in r]
    tier_fig = {"question": "does a host-memory LRU tier (kvstore.CachedStore) in front of the disk store pay?",
                "rows": tier_rows, "hits": tier.hits, "misses": tier.misses,
                "pays_warm": statistics.median(speedups) >= 1.1,
                "pays_cold": statistics.median(cold_speedups) >= 1.1 if cold_speedups else None,
                "note": (f"tier hit vs disk restore with a warm page cache: {min(speedups):.2f}x-{max(speedups):.2f}x"
                         + (f"; vs a cold page cache: {min(cold_speedups):.2f}x-{max(cold_speedups):.2f}x"
                            if cold_speedups else "")
                         + ". A hit skips the file read and the file SHA-256 (its bytes were verified on the way in) "
                         "and parses them into fresh tensors with one copy.")}
    tier_fig["pays"] = bool(tier_fig["pays_warm"] or tier_fig["pays_cold"])
    return fig, tier_fig


