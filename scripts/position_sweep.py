"""Position sweep: is an artifact still exact when it is moved to other positions by re-rotating its keys?

Run from the repository root::

    python -m scripts.position_sweep --out runs/position_sweep                      # or: make position-sweep
    python -m scripts.position_sweep --out /tmp/sweep --model tiny-gemma3 --prefix-tokens 8 --suffix-tokens 4

Options: --model (gemma3-270m), --offsets 0,1,2,7,100,1000,4096 (0 is always included: it is the control),
--prefix-tokens 64, --suffix-tokens 16, --problems (problems/kvgraft_original.jsonl; the text the tokens are cut
from, a built-in sentence when the file is missing).

One artifact of the prefix is computed at position 0 (the backend's prefill and capture, through a store and back).
For each offset the engine's check (``kvstore.check_graft(be, prefix, suffix, snapshot=artifact, offset=off)``) compares
it against computing the prefix fresh at the shifted positions:
  fresh:  ``prefill(prefix, position=off)``; ``forward(suffix, position=off + n)``
  graft:  at offset 0 ``be.graft`` (own position); otherwise ``be.graft_repositioned(artifact, off)``
          (keys re-rotated by RoPE composition); then ``forward(suffix, position=off + n)``
Per offset: max |delta logit|, KL max, argmax agreement, SHA-256 equality. Also, for scale: how far the fresh
logits at that offset are from the fresh logits at offset 0 (RoPE is relative only in exact arithmetic).

Writes DIR/position_sweep.json and DIR/position_sweep.png, prints a table and a verdict line. Exit status 1
only when offset 0 (own position) is not exact; non-zero offsets are reported as they come out.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse
import json
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
from rich.table import Table

from harness.errors import console as terminal_console
from harness.experiments.text import DEFAULT_PROBLEMS, joined_text

FALLBACK_TEXT = (
    "Find the number of ordered pairs of positive integers (a, b) such that a + b = 1000 and neither a nor b "
    "has a zero digit.\n\nSolution: Count the numbers from 1 to 999 with no zero digit, then subtract the pairs "
    "in which the partner 1000 - a contains a zero; the final answer is 738."
)


def parse_offsets(text: str) -> list[int]:
    try:
        offsets = sorted({int(x) for x in text.split(",") if x.strip()} | {0})
    except ValueError:
        raise SystemExit(f"--offsets {text!r}: give comma-separated non-negative integers, e.g. 0,1,7,100") from None
    if offsets[0] < 0:
        raise SystemExit(f"--offsets {text!r}: offsets must be >= 0")
    return offsets


def source_text(path: Path) -> str:
    """Every problem's text (problem + "\\n\\nSolution: " + solution) joined, or a built-in sentence."""
    return (joined_text(path) if path.exists() else "") or FALLBACK_TEXT


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="output folder (position_sweep.json, .png)")
    p.add_argument("--model", default="gemma3-270m", help="gemma3-270m | tiny-gemma3 | tiny-llama | folder")
    p.add_argument("--backend", default="transformers", choices=("transformers", "llamacpp"),
                   help="llamacpp: the bundled GGUF in llama.cpp (n_ctx fits prefix + suffix; offsets > 0 are "
                        "refused by the backend and reported as refused)")
    p.add_argument("--offsets", default="0,1,2,7,100,1000,4096", help="comma-separated positions to move to")
    p.add_argument("--batch-invariant", action="store_true",
                   help="transformers, determinism.batch_invariant=true (own position still the only exact one?)")
    p.add_argument("--prefix-tokens", type=int, default=64)
    p.add_argument("--suffix-tokens", type=int, default=16)
    p.add_argument("--problems", type=Path, default=DEFAULT_PROBLEMS, help="text source (jsonl, problem field)")
    args = p.parse_args(argv)
    if args.prefix_tokens < 1 or args.suffix_tokens < 1:
        p.error("--prefix-tokens and --suffix-tokens must be >= 1")
    return args


def _cut(be, text: str, n: int, m: int) -> tuple[list[int], list[int]]:
    """The first n + m token ids of `text` (repeated until long enough): (prefix, suffix)."""
    ids = be.encode(text)
    while len(ids) < n + m:
        text = text + "\n\n" + text
        ids = be.encode(text)
    return ids[:n], ids[n : n + m]


def flag_settings(args: argparse.Namespace):
    """The settings of `args.backend` the flags give, built by its own Settings class (kvstore.settings_for): the
    model (--model) and the batch-invariant mode, and the context a backend that sizes one takes (llama.cpp's
    n_ctx, fitting prefix + suffix, and its prefill schedule)."""
    from kvstore import Determinism, ModelChoice, settings_for

    n, m = args.prefix_tokens, args.suffix_tokens
    offered = {"n_ctx": max(1024, -(-(n + m + 1) // 256) * 256), "n_batch": 512, "n_ubatch": 512}
    choice = ModelChoice(source=args.model, determinism=Determinism(batch_invariant=bool(args.batch_invariant)),
                         offered=offered)
    return settings_for(args.backend, choice)


def _g(x: float) -> str:
    return "0" if x == 0 else f"{x:.2g}"


def plot(results: list[dict], path: Path, title: str) -> None:
    """max |delta| and KL vs offset (symlog x so 0 fits, log y); exact points drawn as stars on the floor."""
    offsets = [r["offset"] for r in results]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, label in ((axes[0], "max_abs_diff", "max |Δ logit|"), (axes[1], "kl_max", "KL max (nats)")):
        values = [r[key] for r in results]
        positive = [v for v in values if v > 0]
        shift = [r["shift_max_abs_diff"] for r in results] if key == "max_abs_diff" else []
        floor = min(positive + [v for v in shift if v > 0] or [1e-6]) / 30
        xs = [o for o, v in zip(offsets, values, strict=True) if v > 0]
        ax.plot(xs, [v for v in values if v > 0], "o-", color="tab:blue", label="re-rotated graft vs fresh")
        ex = [o for o, v in zip(offsets, values, strict=True) if v == 0]
        ax.plot(ex, [floor] * len(ex), "*", ms=14, color="tab:green",
                label="exact (SHA-256 equal, Δ = 0; drawn at the floor)")
        for o in ex:
            ax.annotate(f"offset {o}: exact", (o, floor), textcoords="offset points", xytext=(6, 8), fontsize=8)
        if shift:
            xs2 = [o for o, v in zip(offsets, shift, strict=True) if v > 0]
            ax.plot(xs2, [v for v in shift if v > 0], "s--", color="tab:gray", ms=4,
                    label="fresh at offset vs fresh at 0 (scale)")
        ax.set_xscale("symlog", linthresh=1)
        ax.set_yscale("log")
        ax.set_xlabel("offset (positions)")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    offsets = parse_offsets(args.offsets)

    from kvstore import MemoryStore, atomic_write, batch_invariant_refusal, check_graft, compare_logits, load_backend
    from kvstore.errors import KVStoreError

    console = terminal_console(width=None if sys.stdout.isatty() else 150)
    err = terminal_console(stderr=True)
    t_start = time.perf_counter()
    n, m = args.prefix_tokens, args.suffix_tokens
    if args.batch_invariant and (refusal := batch_invariant_refusal(args.backend)):
        raise SystemExit(f"--batch-invariant: {refusal}")
    err.print(f"loading {args.model} ({args.backend}) ...")
    be = load_backend(args.backend, **flag_settings(args).keywords())
    prefix, suffix = _cut(be, source_text(args.problems), n, m)
    window = be.sliding_window()
    if window and n + m > window:
        err.print(f"[yellow]note: prefix + suffix ({n + m}) exceeds the sliding window ({window}); "
                  "graft_repositioned documents sequences shorter than the window")
    store = MemoryStore()  # the artifact goes through the byte format and back, as a deposit would
    aid = store.put(be.capture(be.prefill(prefix)[0], prefix, extra={"script": "position_sweep"}))
    artifact = store.get(aid)
    facts = {"model": be.model_name, "backend": be.name, "model_fingerprint": be.fingerprint,
             "tokenizer_fingerprint": be.tokenizer_fingerprint, "determinism": be.settings(),
             "environment": be.environment(),
             "layer_layout": [{"kind": x.kind, "window": x.window} for x in artifact.layers],
             "sliding_window": window}

    results, fresh0 = [], None
    with err.status("sweeping offsets ...") as status:
        for off in offsets:
            status.update(f"offset {off}")
            t0 = time.perf_counter()
            try:
                check = check_graft(be, prefix, suffix, snapshot=artifact, offset=off, keep_logits=True)
            except KVStoreError as e:  # the backend does not graft at other positions: that is the result
                results.append({"offset": off, "refused": str(e), "sha256_equal": False,
                                "seconds": time.perf_counter() - t0})
                err.print(f"offset {off}: refused: {e}")
                continue
            fresh = check.reference_logits  # (1, m, vocab), computed at positions off..
            if off == 0:
                fresh0 = fresh
            c = check.graft
            shift = compare_logits(fresh0, fresh)
            results.append({"offset": off, "sha256_fresh": c.sha256_a, "sha256_graft": c.sha256_b,
                            "sha256_equal": c.sha256_equal, "max_abs_diff": c.max_abs_diff, "kl_max": c.kl_max,
                            "argmax_agreement": c.argmax_agreement, "shift_max_abs_diff": shift.max_abs_diff,
                            "shift_kl_max": shift.kl_max, "seconds": time.perf_counter() - t0})
            err.print(f"offset {off}: equal={c.sha256_equal} max|d|={c.max_abs_diff:.3g} KL={c.kl_max:.3g}")

    exact = [r["offset"] for r in results if r["sha256_equal"]]
    zero_exact = 0 in exact
    others = [r for r in results if r["offset"] != 0 and "refused" not in r]
    refused = [r["offset"] for r in results if "refused" in r]
    report = {
        **facts,
        "prefix_tokens": n,
        "suffix_tokens": m,
        "artifact_id": aid,
        "artifact_start_position": artifact.start_position,
        "text_source": str(args.problems) if args.problems.exists() else "built-in sentence",
        "offsets": results,
        "exact_offsets": exact,
        "offset0_exact": zero_exact,
        "only_offset0_exact": exact == [0],
        "refused_offsets": refused,
        "timing_s": {"total": time.perf_counter() - t_start},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    json_path, png_path = args.out / "position_sweep.json", args.out / "position_sweep.png"
    atomic_write(json_path, (json.dumps(report, indent=2) + "\n").encode())
    measured = [r for r in results if "refused" not in r]
    label = f"{facts['model']} on {facts['backend']} ({facts['model_fingerprint'][:12]})"
    plot(measured, png_path, f"{label}: artifact computed at position 0, keys re-rotated to offset vs fresh at "
                             f"offset; prefix {n}, suffix {m} tokens" + (f"; refused: {refused}" if refused else ""))

    table = Table(title=f"position sweep — {label}, prefix {n} + suffix {m} tokens")
    for col in ("offset", "SHA-256 fresh", "SHA-256 graft", "equal", "max |Δ|", "KL max", "argmax",
                "fresh vs offset 0 max |Δ|"):
        table.add_column(col, justify="right")
    for r in results:
        if "refused" in r:
            table.add_row(str(r["offset"]), "-", "-", "[yellow]refused", "-", "-", "-", "-")
            continue
        table.add_row(str(r["offset"]), r["sha256_fresh"][:12], r["sha256_graft"][:12],
                      "[green]yes" if r["sha256_equal"] else "[yellow]no", _g(r["max_abs_diff"]), _g(r["kl_max"]),
                      f"{r['argmax_agreement']:.3f}", _g(r["shift_max_abs_diff"]))
    console.print(table)
    console.print(f"wrote {json_path} and {png_path} ({report['timing_s']['total']:.0f} s)")

    if not zero_exact:
        verdict = "position sweep: FAILED — offset 0 (own position) is NOT exact"
    else:
        inexact = [r for r in others if not r["sha256_equal"]]
        spread = ""
        if inexact:
            spread = (f" (others: max |d| up to {max(r['max_abs_diff'] for r in inexact):.2g}, KL max "
                      f"{_g(max(r['kl_max'] for r in inexact))}, argmax agreement "
                      f"{min(r['argmax_agreement'] for r in inexact):.3f} or better)")
        if exact == [0] and refused:
            verdict = (f"position sweep: exact offsets [0] — own position is exact and the only point grafted: "
                       f"offsets {refused} refused by the {facts['backend']} backend (it grafts at the "
                       f"artifact's own position only){spread}")
        elif exact == [0]:
            verdict = f"position sweep: exact offsets [0] — own position is the only exact point{spread}"
        else:
            verdict = (f"position sweep: exact offsets {exact} — offset 0 is exact but NOT the only exact point"
                       f"{spread}")
    print(verdict, flush=True)
    return 0 if zero_exact else 1


if __name__ == "__main__":
    sys.exit(main())
