"""The cost of determinism.batch_invariant (kvstore/backends/transformers/invariant.py), measured in one run: one-pass
prefill tokens/s and greedy decode tokens/s of the same model in the default mode and in the batch-invariant mode, at
each context size, the two modes alternating within every repeat (so a busy machine slows both alike). Reported as
invariant/default time ratios (goal, issue 52: prefill <= 1.1x, decode <= 1.3x), printed side by side with the CPU
and the load average, and written to --out.

    .venv/bin/python -m scripts.bench.invariant [--model gemma3-270m] [--sizes 512,2048] [--repeats 3]
    .venv/bin/python scripts/bench/invariant.py ...   (the same)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:  # run as a file (python scripts/bench/invariant.py): run it as the
    # module, from the checkout, as `python -m scripts.bench.invariant` does (its imports name the `scripts` package)
    _root = str(Path(__file__).resolve().parents[2])
    os.execve(sys.executable, [sys.executable, "-m", "scripts.bench.invariant", *sys.argv[1:]],
              {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [_root, os.environ.get("PYTHONPATH")]))})

from harness.experiments.text import DEFAULT_PROBLEMS  # noqa: E402
from kvstore import BUNDLED, Determinism, load_backend  # noqa: E402
from scripts.bench.common import clock, machine_info, token_stream  # noqa: E402

GOALS = {"prefill": 1.1, "decode": 1.3}  # the most the invariant mode may cost, as a ratio of the default's time


def _prefill_s(be, ids: list[int]) -> float:
    t0 = clock()
    be.prefill(ids)  # one pass over the whole prompt (prefill_chunk=0), the last position's logits
    return clock() - t0


def _decode_s(be, ids: list[int], steps: int) -> float:
    state, logits = be.prefill(ids)  # logits (1, vocab)
    t0 = clock()
    for _ in range(steps):  # greedy: each step feeds the argmax back, one row, one token
        logits = be.forward([int(logits[0].argmax())], state)[:, -1, :]
    return (clock() - t0) / steps


def bench_invariant(model: str, stream: list[int], sizes: list[int], repeats: int, decode_steps: int,
                    threads: int | None = None) -> dict:
    base = Determinism(threads=threads or Determinism().threads, prefill_chunk=0, batch_invariant=False)
    invariant = Determinism(**{**base.to_dict(), "batch_invariant": True})
    bes = {"default": load_backend("transformers", source=model, determinism=base),
           "invariant": load_backend("transformers", source=model, determinism=invariant)}
    for be in bes.values():  # warm up kernels and allocator outside the timed regions
        _decode_s(be, stream[:16], 2)
    rows = []
    for n in sizes:
        ids = stream[:n]
        times: dict[str, dict[str, list[float]]] = {m: {"prefill": [], "decode": []} for m in bes}
        for _ in range(repeats):
            for mode, be in bes.items():
                times[mode]["prefill"].append(_prefill_s(be, ids))
                times[mode]["decode"].append(_decode_s(be, ids, decode_steps))
        row = {"tokens": n}
        for mode in bes:
            p, d = statistics.median(times[mode]["prefill"]), statistics.median(times[mode]["decode"])
            row[mode] = {"prefill_s": p, "prefill_tok_s": n / p, "decode_s_per_token": d, "decode_tok_s": 1 / d,
                         "prefill_all_s": times[mode]["prefill"], "decode_all_s": times[mode]["decode"]}
        row["prefill_ratio"] = row["invariant"]["prefill_s"] / row["default"]["prefill_s"]
        row["decode_ratio"] = row["invariant"]["decode_s_per_token"] / row["default"]["decode_s_per_token"]
        rows.append(row)
    met = {k: all(r[f"{k}_ratio"] <= g for r in rows) for k, g in GOALS.items()}
    return {"rows": rows, "goals": GOALS, "met": met, "repeats": repeats, "decode_steps": decode_steps,
            "dtype": base.dtype, "threads": base.threads,
            "note": "invariant/default time (median of the repeats; the modes alternate within each repeat)"}


def print_table(fig: dict) -> None:
    from rich.table import Table

    from harness.errors import console as terminal_console

    t = Table(title=f"Batch-invariant mode: cost vs the default ({fig['dtype']}, {fig['threads']} threads; "
                    f"time ratio, goal prefill <= {fig['goals']['prefill']}x, decode <= {fig['goals']['decode']}x)")
    for c in ("N", "prefill tok/s default", "invariant", "prefill ratio", "decode tok/s default", "invariant",
              "decode ratio"):
        t.add_column(c, justify="right")
    for r in fig["rows"]:
        d, i = r["default"], r["invariant"]
        t.add_row(str(r["tokens"]), f"{d['prefill_tok_s']:.0f}", f"{i['prefill_tok_s']:.0f}",
                  f"{r['prefill_ratio']:.2f}x", f"{d['decode_tok_s']:.2f}", f"{i['decode_tok_s']:.2f}",
                  f"{r['decode_ratio']:.2f}x")
    terminal_console(width=150).print(t)
    m = fig.get("machine", {})
    if m:
        print(f"CPU {m.get('cpu')} ({m.get('cpu_isa')}), load average at start {m.get('loadavg_start')}, at end "
              f"{m.get('loadavg_end')}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=BUNDLED)
    ap.add_argument("--sizes", default="512,2048")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--decode-steps", type=int, default=16)
    ap.add_argument("--text", type=Path, default=DEFAULT_PROBLEMS)
    ap.add_argument("--out", type=Path, default=None, help="write the figure as JSON here")
    args = ap.parse_args(argv)
    sizes = sorted({int(x) for x in args.sizes.split(",") if x.strip()})
    load_start = os.getloadavg()
    be = load_backend("transformers", source=args.model, determinism=Determinism())
    stream, _ = token_stream(be, args.text, max(sizes) + 1)
    del be
    fig = bench_invariant(args.model, stream, sizes, args.repeats, args.decode_steps)
    fig["machine"] = machine_info(Determinism())
    fig["machine"]["loadavg_start"], fig["machine"]["loadavg_end"] = load_start, os.getloadavg()
    print_table(fig)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(fig, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
