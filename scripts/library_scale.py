"""Scale check for the solution library: build one from ~1,000 problems, open it in a fresh process, and
serve lookups + grafts, recording time and peak RSS, to show a library is served without holding its
artifacts in memory.

    python -m scripts.library_scale --problems ../shared/data/aime_1983_2023.jsonl --model tiny-gemma3 \
        --out runs/library_scale

Writes OUT/library_scale.json. With --model gemma3-270m it deposits the real KV (~300k tokens for the AIME
1983-2023 file: about 20 minutes of prefill on 2 CPU cores and ~10 GB of fp32 KV).
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

from kvstore import atomic_write

REPO = Path(__file__).resolve().parents[1]


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _cfg(args):
    from harness.config.schema import compose_config

    return compose_config(
        [
            f"project_root={REPO}",
            f"library.name={Path(args.problems).stem}",
            "library.source=dataset",
            f"library.dataset.path={Path(args.problems).resolve()}",
            f"library.dataset.name={Path(args.problems).stem}",
            f"library.root={Path(args.out).resolve()}/library",
            f"library.store={Path(args.out).resolve()}/store",
            f"model.source={args.model}",
            f"model.name={args.model}",
        ]
    )


def build(args) -> dict:
    from harness.config.model import load_model
    from harness.config.schema import typed
    from harness.library.build import Library, build_library

    cfg = _cfg(args)
    be = load_model(typed(cfg))
    t = time.perf_counter()
    path = build_library(cfg.library, be, REPO)
    m = Library(path, None).manifest  # type: ignore[arg-type]  (read through the library's owner, re-checked)
    return {
        "library": str(path),
        "entries": m["n_entries"],
        "skipped": len(m["skipped"]),
        "tokens_total": m["tokens_total"],
        "build_s": round(time.perf_counter() - t, 1),
        "build_peak_rss_mb": round(_rss_mb(), 1),
    }


def serve(args) -> dict:
    """In a fresh process: open the library, then retrieve + graft for random problems."""
    from harness.config.model import load_model
    from harness.config.schema import typed
    from harness.library.build import Library, open_library
    from harness.task.problems import load_problems

    cfg = _cfg(args)
    be = load_model(typed(cfg))  # the model's backend: retrieval, then its graft and forward
    rss_model = _rss_mb()
    t = time.perf_counter()
    lib = open_library(cfg.library, be, REPO)
    open_s = time.perf_counter() - t
    held_out = Library(lib.path, lib.store, exclude_self=True, retrieval="bm25")  # the same library, held out
    rss_open = _rss_mb()
    problems = load_problems(str(Path(args.problems).resolve()))
    rng = random.Random(0)
    exact, held, restore = [], [], []
    for p in rng.sample(problems, min(args.lookups, len(problems))):
        t = time.perf_counter()
        m = lib.retrieve(p)
        exact.append(time.perf_counter() - t)
        t = time.perf_counter()
        held_out.retrieve(p)
        held.append(time.perf_counter() - t)
        if m is not None:
            t = time.perf_counter()
            snap = lib.store.get(m.entry.artifact_id)
            cache = be.graft(snap, snap.token_ids)
            be.forward(be.encode("\n", add_bos=False), cache)
            restore.append(time.perf_counter() - t)

    def med(x):
        return round(sorted(x)[len(x) // 2] * 1000, 3) if x else None

    return {
        "open_s": round(open_s, 3),
        "lookups": len(exact),
        "exact_lookup_ms_median": med(exact),
        "bm25_lookup_ms_median": med(held),
        "restore_graft_ms_median": med(restore),
        "rss_after_model_mb": round(rss_model, 1),
        "rss_after_open_mb": round(rss_open, 1),
        "peak_rss_mb": round(_rss_mb(), 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problems", required=True)
    ap.add_argument("--model", default="tiny-gemma3")
    ap.add_argument("--out", default="runs/library_scale")
    ap.add_argument("--lookups", type=int, default=100)
    ap.add_argument("--serve-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_only:
        print(json.dumps(serve(args)))
        return
    result = {"model": args.model, "problems": str(args.problems), **build(args)}
    cmd = [
        sys.executable,
        "-m",
        "scripts.library_scale",
        "--serve-only",
        "--problems",
        args.problems,
        "--model",
        args.model,
        "--out",
        args.out,
        "--lookups",
        str(args.lookups),
    ]
    result["serve"] = json.loads(
        subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=REPO).stdout.splitlines()[-1]
    )
    store = Path(args.out) / "store" / "objects"
    result["store_bytes"] = sum(p.stat().st_size for p in store.glob("*/*"))
    atomic_write(Path(args.out) / "library_scale.json", (json.dumps(result, indent=2) + "\n").encode())
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
