"""Part of `make bench`: verified restore (store.get + graft) of artifacts the model deposited in bfloat16.

The per-token comparison with llama.cpp's state restore (scripts/bench/run.py, figure 3) is between two
different byte counts when our model runs in float32: llama.cpp keeps an f16 KV cache, 2 bytes per value,
ours holds the model's own dtype. Here the same tokens are deposited by the same model loaded in bfloat16
(2 bytes per value, as a GPU deployment runs it), put into a LocalStore and restored by id, so the
comparison can also be made at equal bytes per token. bf16 prefill is slow on a CPU without bf16 arithmetic,
so only prefixes up to `max_tokens` are deposited.

    .venv/bin/python -m scripts.bench.bf16_restore --model tiny-gemma3 --sizes 16,32 --work /tmp/bf16 --out r.json

(alone: the token stream is the bundled problems' text, as `make bench` cuts it; prints and writes the JSON).
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import sys
import time
from pathlib import Path

from harness.experiments.text import DEFAULT_PROBLEMS
from kvstore import Determinism, LocalStore, load_backend
from scripts.bench.common import stats, token_stream, write_summary


def measure(model: str, stream: list[int], sizes: list[int], repeats: int, workdir: Path,
            threads: int | None = None, max_tokens: int = 2048) -> dict:
    """{"dtype", "rows": [{tokens, artifact_bytes, bytes_per_token, restore_s, deposit_s}], "skipped_sizes"}."""
    base = Determinism()
    det = Determinism(threads=threads or base.threads, dtype="bfloat16")
    be = load_backend("transformers", source=model, determinism=det)
    store = LocalStore(workdir)
    rows = []
    try:
        for n in [n for n in sizes if n <= max_tokens]:
            t0 = time.perf_counter()
            aid = store.put(be.deposit(stream[:n]))
            deposit_s = time.perf_counter() - t0
            be.graft(store.get(aid))  # warm: page cache, layout memo
            times = []
            for _ in range(max(repeats, 5)):
                t0 = time.perf_counter()
                be.graft(store.get(aid))
                times.append(time.perf_counter() - t0)
            size = store.info(aid).size
            rows.append({"tokens": n, "artifact_id": aid, "artifact_bytes": size, "bytes_per_token": size / n,
                         "restore_s": stats(times), "deposit_s": deposit_s})
    finally:
        del be
        gc.collect()
    return {"dtype": "bfloat16", "rows": rows, "skipped_sizes": [n for n in sizes if n > max_tokens],
            "note": f"deposited by the same model loaded in bfloat16; sizes above {max_tokens} tokens skipped "
                    "(bf16 prefill is slow on a CPU without bf16 arithmetic)"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--sizes", default="128,512,2048", help="prefix lengths (comma-separated)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=2048, help="deposit no prefix longer than this")
    ap.add_argument("--work", type=Path, required=True, help="folder for the temporary store (removed after)")
    ap.add_argument("--out", type=Path, required=True, help="the JSON to write")
    args = ap.parse_args(argv)
    sizes = sorted({int(x) for x in args.sizes.split(",") if x.strip()})
    stream, _ = token_stream(load_backend("transformers", source=args.model), DEFAULT_PROBLEMS, max(sizes))
    try:
        result = measure(args.model, stream, sizes, args.repeats, args.work, max_tokens=args.max_tokens)
    finally:
        shutil.rmtree(args.work, ignore_errors=True)
    write_summary(args.out, result)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
