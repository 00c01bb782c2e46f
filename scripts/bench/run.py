"""make bench: four side-by-side measurements of kvgraft, each a ratio of two things timed in the same run.

    .venv/bin/python -m scripts.bench.run --out runs/bench [--model gemma3-270m] [--sizes 128,512,2048,8192]
                                      [--repeats 3] [--quick] [--text PATH] [--no-peer]

1. graft vs recompute: time to the first new token after restoring an N-token artifact from a LocalStore
   (get + graft + one forward -> argmax) versus prefilling the same N tokens (+ the same forward).
2. restore vs the machine's limit: artifact load + cache rebuild in bytes/s versus `open().read()` of the same
   file, warm page cache and cold (posix_fadvise DONTNEED, checked with fincore). Also the host-memory tier
   (kvstore.CachedStore) against the disk store, to see whether it pays.
3. peer: llama.cpp's per-sequence state save/restore (llama-cpp-python) on the same GGUF and the same tokens:
   restore time and bytes per token. Optional: recorded as unavailable when llama-cpp-python is missing.
4. harness overhead: greedy decode tokens/s through harness.run.decode.generate versus bare `model.generate`
   on the same prompts, and llama.cpp's decode tokens/s as a reference point.

Writes <out>/summary.json, <out>/ttft.png, <out>/restore_bandwidth.png; prints the tables. Tokens come from
real text (problems/kvgraft_original.jsonl, problem + solution, repeated as needed, or --text PATH).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from harness.experiments.text import DEFAULT_PROBLEMS
from kvstore import BUNDLED, LocalStore, load_backend
from kvstore.determinism import add_arguments, from_arguments
from scripts.bench import bf16_restore
from scripts.bench import decode as bench_decode
from scripts.bench import invariant as bench_invariant
from scripts.bench.common import clock, load_note, machine_info, token_stream, write_summary
from scripts.bench.overhead import bench_overhead
from scripts.bench.peer import bench_peer, open_llama
from scripts.bench.restore import bench_restore
from scripts.bench.ttft import bench_ttft

# ---------------------------------------------------------------- output

def plot(summary: dict, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    rows = summary["figures"]["graft_vs_recompute"]["rows"]
    n = [r["tokens"] for r in rows]
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for key, label in (("recompute_s", "recompute (prefill N + 1 token)"),
                       ("graft_s", "graft (get + graft + 1 token)")):
        med = [r[key]["median"] for r in rows]
        err = [[m - r[key]["min"] for m, r in zip(med, rows, strict=True)],
               [r[key]["max"] - m for m, r in zip(med, rows, strict=True)]]
        ax.errorbar(n, med, yerr=err, marker="o", capsize=3, label=label)
    peer = summary["figures"]["peer_llama_cpp"]
    if peer.get("available"):
        pr = peer["rows"]
        ax.plot([r["tokens"] for r in pr], [r["llama_ttft_s"]["median"] for r in pr], "s--",
                label="llama.cpp state restore + 1 token")
    ax.set(xscale="log", yscale="log", xlabel="prefix tokens N", ylabel="time to first new token (s)",
           title=f"Graft vs recompute ({summary['model']['name']}, {summary['model']['dtype']})")
    files.append(_save(fig, ax, out / "ttft.png"))

    rows = summary["figures"]["restore_vs_read"]["rows"]
    tier = {r["tokens"]: r for r in summary["figures"]["tier"]["rows"]}
    size = [r["artifact_bytes"] / 1e6 for r in rows]
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    series = [("raw read, warm", [r["read_Bps"]["median"] for r in rows], "o-"),
              ("restore (get + graft), warm", [r["restore_Bps"]["median"] for r in rows], "o-"),
              ("restore from host-memory tier", [r["artifact_bytes"] / tier[r["tokens"]]["tier_hit_s"]["median"]
                                                 for r in rows], "^-")]
    if all(r["cold"].get("read_Bps") for r in rows):
        series += [("raw read, cold", [r["cold"]["read_Bps"]["median"] for r in rows], "o--"),
                   ("restore, cold", [r["cold"]["restore_Bps"]["median"] for r in rows], "o--")]
    for label, ys, style in series:
        ax.plot(size, [y / 1e9 for y in ys], style, label=label)
    ax.set(xscale="log", yscale="log", xlabel="artifact size (MB)", ylabel="GB/s",
           title="Restore bandwidth vs plain sequential read")
    files.append(_save(fig, ax, out / "restore_bandwidth.png"))
    return files


def _save(fig, ax, path: Path) -> str:
    """Grid, legend, tight layout; write the PNG and close the figure. Returns the file name."""
    import matplotlib.pyplot as plt

    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path.name


def print_tables(summary: dict) -> None:
    from rich.table import Table

    from harness.errors import console as terminal_console

    con = terminal_console(width=max(150, shutil.get_terminal_size().columns))
    f = summary["figures"]
    t = Table(title="1. Time to first token: graft vs recompute (median [min-max], s)")
    for c in ("N", "artifact MB", "graft", "recompute", "ratio", "TTFT/ceiling", "prefetched", "exact"):
        t.add_column(c, justify="right")
    for r in f["graft_vs_recompute"]["rows"]:
        t.add_row(str(r["tokens"]), f"{r['artifact_bytes'] / 1e6:.2f}", _fmt(r["graft_s"]), _fmt(r["recompute_s"]),
                  f"{r['ratio']:.1f}x", f"{r['ratio'] / r['ratio_ceiling']:.3f}",
                  f"{r['prefetched_over_ceiling']:.3f}", "yes" if r["logits_identical"] else "NO")
    con.print(t)
    t = Table(title="2. Restore vs raw read (GB/s, median [min-max]; warm page cache)")
    for c in ("N", "MB", "raw read", "restore", "ratio", "cold read", "cold restore", "cold ratio"):
        t.add_column(c, justify="right")
    for r in f["restore_vs_read"]["rows"]:
        cold = r["cold"]
        t.add_row(str(r["tokens"]), f"{r['artifact_bytes'] / 1e6:.2f}", _fmt(r["read_Bps"], 1e-9, 2),
                  _fmt(r["restore_Bps"], 1e-9, 2), f"{r['ratio']:.0%}",
                  _fmt(cold["read_Bps"], 1e-9, 2) if "read_Bps" in cold else "-",
                  _fmt(cold["restore_Bps"], 1e-9, 2) if "restore_Bps" in cold else "-",
                  f"{cold['ratio']:.0%}" if "ratio" in cold else "-")
    con.print(t)
    t = Table(title="2b. Host-memory tier vs disk store (restore = get + graft, ms)")
    for c in ("N", "disk (warm)", "tier hit", "speedup", "disk (cold)", "speedup vs cold", "tier miss"):
        t.add_column(c, justify="right")
    for r in f["tier"]["rows"]:
        t.add_row(str(r["tokens"]), _fmt(r["disk_warm_s"], 1e3, 2), _fmt(r["tier_hit_s"], 1e3, 2),
                  f"{r['speedup']:.2f}x", f"{r['disk_cold_s'] * 1e3:.2f}" if "disk_cold_s" in r else "-",
                  f"{r['speedup_vs_cold']:.2f}x" if "speedup_vs_cold" in r else "-", f"{r['tier_miss_s'] * 1e3:.2f}")
    con.print(t)
    p = f["peer_llama_cpp"]
    if p.get("available"):
        t = Table(title="3. Peer: llama.cpp per-sequence state restore vs ours (ms)")
        for c in ("N", "llama KB/tok", "ours KB/tok", "llama restore", "ours restore", "llama TTFT", "ours TTFT",
                  "ours/llama speed", "ours bf16 restore", "bf16/llama speed"):
            t.add_column(c, justify="right")
        for r in p["rows"]:
            t.add_row(str(r["tokens"]), f"{r['llama_bytes_per_token'] / 1e3:.1f}",
                      f"{r.get('ours_bytes_per_token', 0) / 1e3:.1f}", _fmt(r["llama_restore_file_s"], 1e3, 2),
                      _fmt(r["ours_restore_s"], 1e3, 2) if "ours_restore_s" in r else "-",
                      _fmt(r["llama_ttft_s"], 1e3, 1), _fmt(r["ours_ttft_s"], 1e3, 1) if "ours_ttft_s" in r else "-",
                      f"{r['restore_ratio']:.2f}x" if "restore_ratio" in r else "-",
                      _fmt(r["ours_bf16_restore_s"], 1e3, 2) if "ours_bf16_restore_s" in r else "-",
                      f"{r['restore_ratio_bf16']:.2f}x" if "restore_ratio_bf16" in r else "-")
        con.print(t)
    else:
        con.print(f"3. Peer (llama.cpp): unavailable — {p['reason']}")
    o = f["harness_overhead"]
    t = Table(title="4. Decode tokens/s (median [min-max])")
    t.add_column("side")
    t.add_column("tokens/s", justify="right")
    t.add_row(o["harness_side"], _fmt(o["harness_tokens_per_s"], 1, 2))
    t.add_row(o["bare_side"], _fmt(o["bare_tokens_per_s"], 1, 2))
    if "llama_cpp_decode" in o:
        t.add_row("llama.cpp (reference, Q4_K_M)", _fmt(o["llama_cpp_decode"]["tokens_per_s"], 1, 2))
    con.print(t)
    if "transformers_vs_llama_cpp_ratio" in o:
        con.print(f"transformers ({o['transformers_mode']}) / llama.cpp greedy decode tokens/s on the same GGUF: "
                  f"{o['transformers_vs_llama_cpp_ratio']:.2f}x")
    t = Table(title="Goals")
    for c in ("goal", "met", "note"):
        t.add_column(c)
    for g in summary["goals"]:
        t.add_row(g["goal"], {True: "yes", False: "NO", None: "n/a"}[g["met"]], g["note"])
    con.print(t)


def _fmt(s: dict, scale: float = 1.0, digits: int = 3) -> str:
    return f"{s['median'] * scale:.{digits}f} [{s['min'] * scale:.{digits}f}-{s['max'] * scale:.{digits}f}]"


# ---------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model", default=BUNDLED)
    ap.add_argument("--sizes", default="128,512,2048,8192", help="prefix lengths N (comma-separated)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="smoke run: fewer prompts and tokens, no cold cache, no peer")
    ap.add_argument("--text", type=Path, default=DEFAULT_PROBLEMS, help="JSONL with problem/solution rows")
    add_arguments(ap)  # --dtype, --threads, ...: one flag per kvstore.Determinism field (the pinned defaults)
    ap.add_argument("--no-peer", action="store_true", help="skip llama.cpp")
    ap.add_argument("--new-tokens", type=int, default=None, help="decode tokens per prompt for figure 4")
    ap.add_argument("--decode-threads", type=int, default=None,
                    help="torch threads of the decode figures (batched sampling, dtype, llama.cpp); default --threads")
    ap.add_argument("--no-decode", action="store_true", help="skip the decode figures (scripts/bench/decode.py)")
    ap.add_argument("--no-invariant", action="store_true",
                    help="skip the batch-invariant mode's cost (scripts/bench/invariant.py)")
    args = ap.parse_args(argv)

    t_start = clock()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    sizes = sorted({int(x) for x in args.sizes.split(",") if x.strip()})
    det = from_arguments(args)
    be = load_backend("transformers", source=args.model, determinism=det)
    stream, text_info = token_stream(be, args.text, max(sizes) + 1)
    work = out / "_bench_store"
    shutil.rmtree(work, ignore_errors=True)
    store = LocalStore(work)
    # warm up kernels and allocator once, outside every timed region
    cache, _ = be.prefill(stream[:16])
    be.forward([stream[16]], cache)

    summary = {"machine": machine_info(det),
               "model": {"name": be.model_name, "fingerprint": be.fingerprint, "dtype": det.dtype,
                         "determinism": det.to_dict(),
                         "layers": be.layer_kinds()},
               "tokens": text_info, "settings": {"sizes": sizes, "repeats": args.repeats, "quick": args.quick},
               "figures": {}, "runtime_s": {}}
    figs = summary["figures"]
    t0 = clock()
    figs["graft_vs_recompute"] = bench_ttft(be, store, stream, sizes, args.repeats)
    summary["runtime_s"]["graft_vs_recompute"] = clock() - t0
    t0 = clock()
    figs["restore_vs_read"], figs["tier"] = bench_restore(be, store, figs["graft_vs_recompute"]["rows"],
                                                          args.repeats, args.quick)
    summary["runtime_s"]["restore_vs_read"] = clock() - t0
    t0 = clock()
    llm, reason, llama_settings = (None, "skipped (--quick / --no-peer)", {}) if (args.quick or args.no_peer) \
        else open_llama(be, max(sizes) + 64, det.threads)
    ours = {"rows": figs["restore_vs_read"]["rows"],
            "ttft": {r["tokens"]: r["graft_s"] for r in figs["graft_vs_recompute"]["rows"]}}
    if llm is not None and det.dtype == "float32":  # the peer's f16 state has half our fp32 bytes per token
        t1 = clock()
        figs["restore_bf16"] = bf16_restore.measure(args.model, stream, sizes, args.repeats,
                                                          work / "bf16", threads=det.threads)
        summary["runtime_s"]["restore_bf16"] = clock() - t1
        ours["bf16"] = {r["tokens"]: r for r in figs["restore_bf16"]["rows"]}
    figs["peer_llama_cpp"] = bench_peer(llm, reason, stream, sizes, args.repeats, ours, work, be)
    if llama_settings:
        figs["peer_llama_cpp"]["settings"] = llama_settings
    summary["runtime_s"]["peer_llama_cpp"] = clock() - t0
    t0 = clock()
    figs["harness_overhead"] = bench_overhead(
        be, args.text, prompts=1 if args.quick else 3, new_tokens=args.new_tokens or (4 if args.quick else 32),
        repeats=args.repeats, llm=llm)
    summary["runtime_s"]["harness_overhead"] = clock() - t0
    decode = None
    if not args.no_decode:  # scripts/bench/decode.py: batched sampling, fp32 vs bf16, harness vs llama.cpp decode
        t0 = clock()
        other = "bfloat16" if det.dtype == "float32" else "float32"
        q = args.quick
        decode = bench_decode.measure(
            model=args.model, problems=2 if q else 8, n=2 if q else 8, max_new_tokens=8 if q else 64,
            dtypes=(det.dtype, other), prefill_tokens=64 if q else 256, decode_tokens=8 if q else 64,
            threads=args.decode_threads or det.threads)
        figs["batched_sampling"], figs["dtype"] = decode["batched_sampling"], decode["dtype"]
        figs["decode_vs_llama_cpp"] = {"llama_cpp": decode["llama_cpp"],
                                       "harness_vs_llama_cpp": decode["harness_vs_llama_cpp"],
                                       "threads": decode["machine"]["torch_threads"]}
        summary["runtime_s"]["decode"] = clock() - t0
    if not args.no_invariant:  # determinism.batch_invariant vs the default: prefill and decode time ratios
        t0 = clock()
        figs["batch_invariant"] = bench_invariant.bench_invariant(
            args.model, stream if len(stream) > 2048 else token_stream(be, args.text, 2049)[0],
            [128] if args.quick else [512, 2048], 1 if args.quick else args.repeats, 4 if args.quick else 16,
            threads=det.threads)
        summary["runtime_s"]["batch_invariant"] = clock() - t0
    peer = figs["peer_llama_cpp"]
    summary["goals"] = [
        {"goal": figs["graft_vs_recompute"]["goal"], "met": figs["graft_vs_recompute"]["met"],
         "note": figs["graft_vs_recompute"]["note"]},
        {"goal": figs["graft_vs_recompute"]["ceiling_goal"], "met": figs["graft_vs_recompute"]["ceiling_met"],
         "note": figs["graft_vs_recompute"]["ceiling_note"]},
        {"goal": figs["restore_vs_read"]["goal"], "met": figs["restore_vs_read"]["met"],
         "note": figs["restore_vs_read"]["note"]},
        {"goal": "restore faster per token than llama.cpp's state restore", "met": peer.get("met"),
         "note": peer.get("note") or peer.get("reason", "")},
        {"goal": figs["harness_overhead"]["goal"], "met": figs["harness_overhead"]["met"],
         "note": figs["harness_overhead"]["note"]},
    ]
    if decode is not None:
        b, vs = decode["batched_sampling"], decode["harness_vs_llama_cpp"]
        summary["goals"].append({"goal": f"batched sampling >= {b['goal']}x the tokens/s of batch size 1",
                                 "met": b["met"], "note": f"speedup {b['speedup']}x"})
        summary["goals"].append({
            "goal": f"harness greedy decode >= {bench_decode.GOALS['harness_vs_llama_cpp']:.0%} of llama.cpp's",
            "met": vs["met"] if vs else None,
            "note": f"ratio {vs['ratio']}" if vs else f"llama.cpp: {decode['llama_cpp']}"})
    if "batch_invariant" in figs:
        inv = figs["batch_invariant"]
        for k in ("prefill", "decode"):
            summary["goals"].append({
                "goal": f"batch-invariant {k} <= {inv['goals'][k]}x the default's time", "met": inv["met"][k],
                "note": ", ".join(f"{r['tokens']}: {r[f'{k}_ratio']:.2f}x" for r in inv["rows"])})
    summary["machine"]["loadavg_end"] = os.getloadavg()
    note = load_note(summary["machine"]["loadavg_start"], summary["machine"]["loadavg_end"])
    if note:
        summary["machine"]["note"] = note
    shutil.rmtree(work, ignore_errors=True)
    summary["runtime_s"]["total"] = clock() - t_start
    summary["plots"] = plot(summary, out)
    write_summary(out / "summary.json", summary)
    print_tables(summary)
    if "batch_invariant" in figs:
        bench_invariant.print_table(figs["batch_invariant"])
    print(f"wrote {out / 'summary.json'} and {', '.join(summary['plots'])} in {summary['runtime_s']['total']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
