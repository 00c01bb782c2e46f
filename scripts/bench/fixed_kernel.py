"""F.linear (the vendor BLAS) against the batch-invariant mode's fixed-order product (fixed.dot16) at the 270M's
shapes: the min over repeats of each, per row count, and their ratio. A busy machine slows both; the min is the
figure least disturbed by other work.

    .venv/bin/python -m scripts.bench.fixed_kernel [--rows 1,4,64,512,2048] [--repeats 5]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from kvstore import backend_tools

fixed = backend_tools("transformers").fixed  # the batch-invariant mode's own kernel

SHAPES = [(1024, 640), (256, 640), (640, 1024), (2048, 640), (640, 2048), (262144, 640)]  # (out, in) of the 270M


def _best(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,4,64,512,2048")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None, help="intra-op threads (default: torch's)")
    ap.add_argument("--shapes", default=None, help="OUTxIN,... (default: the 270M's)")
    ap.add_argument("--isa", default=None, help="scalar, avx2 or avx512 (default: the best this CPU has)")
    args = ap.parse_args()
    torch.manual_seed(0)
    if args.threads:
        torch.set_num_threads(args.threads)
    shapes = [tuple(map(int, s.split("x"))) for s in args.shapes.split(",")] if args.shapes else SHAPES
    print(f"threads {torch.get_num_threads()}, isa {args.isa or fixed.isa()}")
    print(f"{'shape':>12} {'rows':>5} {'F.linear ms':>12} {'dot16 ms':>10} {'ratio':>6}")
    with torch.inference_mode():
        for n, k in shapes:
            w = torch.randn(n, k) * 0.05
            for m in map(int, args.rows.split(",")):
                if n * m > 2048 * 262144 // 64:
                    continue  # the head only runs a few rows
                x = torch.randn(m, k)
                a = _best(lambda x=x, w=w: F.linear(x, w), args.repeats)
                b = _best(lambda x=x, w=w: fixed.dot16(x, w, isa_name=args.isa), args.repeats)
                print(f"{n:>6}x{k:<5} {m:>5} {a * 1e3:>12.3f} {b * 1e3:>10.3f} {b / a:>6.2f}")


if __name__ == "__main__":
    main()
