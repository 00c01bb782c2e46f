"""`make bench`, figure 1: time to the first new token after restoring an N-token artifact from a LocalStore
(get + graft + one forward -> argmax) versus prefilling the same N tokens (+ the same forward)."""


from __future__ import annotations

import statistics

from kvstore import Backend, LocalStore, check_graft
from kvstore.engine.verify import graft_logits, reference_logits
from scripts.bench.common import GOALS, MAX_REPEAT_TOKENS, argmax, clock, goal_row, stats

# ---------------------------------------------------------------- 1. graft vs recompute

def bench_ttft(be: Backend, store: LocalStore, stream: list[int], sizes: list[int], repeats: int) -> dict:
    rows = []
    for n in sizes:
        prefix, new = stream[:n], stream[n : n + 1]
        rec_reps = repeats if n <= MAX_REPEAT_TOKENS else max(1, repeats // 3)
        # The engine's exactness check puts the artifact into the store and compares graft vs fresh reference;
        # its reference (prefill N + the next token) is the first recompute sample.
        check = check_graft(be, prefix, new, store)
        aid = check.artifact_id
        rec = [check.timing_s["reference"]]
        for _ in range(rec_reps - 1):
            t0 = clock()
            argmax(reference_logits(be, prefix, new))
            rec.append(clock() - t0)
        graft_t, parts = [], {"get": [], "graft": [], "forward": []}
        for _ in range(max(repeats, 3)):
            t0 = clock()
            restored = graft_logits(be, prefix, new, store=store, artifact_id=aid)  # get + graft + forward
            argmax(restored.logits)
            graft_t.append(clock() - t0)
            for k in parts:
                parts[k].append(restored.timing_s[k])
        # the harness's path: the artifact was read and verified ahead (kvstore.Prefetcher, while the previous
        # problem decoded), so the time to first token is graft + one forward
        pre_t = []
        for _ in range(max(repeats, 3)):
            snap = store.get(aid, private=True)
            t0 = clock()
            argmax(graft_logits(be, prefix, new, snapshot=snap).logits)
            pre_t.append(clock() - t0)
        g, c = stats(graft_t), stats(rec)
        rows.append({
            "tokens": n, "artifact_id": aid, "artifact_bytes": store.info(aid).size,
            "graft_s": g, "recompute_s": c, "ratio": c["median"] / g["median"],
            "graft_parts_median_s": {k: statistics.median(v) for k, v in parts.items()},
            "ratio_ceiling": c["median"] / statistics.median(parts["forward"]),  # if get + graft took no time
            "graft_prefetched_s": stats(pre_t),
            "prefetched_over_ceiling": statistics.median(parts["forward"]) / statistics.median(pre_t),
            "recompute_repeats": rec_reps, "logits_identical": check.equal,
            "argmax_equal": check.argmax_agreement == 1.0,
        })
    at = goal_row(rows, GOALS["ttft_at"])
    fig = {"goal": f"graft TTFT >= {GOALS['ttft_ratio']:.0f}x faster than recompute at {GOALS['ttft_at']} tokens",
           "rows": rows, "evaluated_at_tokens": at["tokens"], "ratio": at["ratio"],
           "met": at["ratio"] >= GOALS["ttft_ratio"],
           "repeats_note": f"recompute timed {repeats}x up to {MAX_REPEAT_TOKENS} tokens, "
                           f"{max(1, repeats // 3)}x above; graft timed {max(repeats, 3)}x"}
    fig["note"] = _ttft_note(fig, at)
    over = [r for r in rows if r["tokens"] >= GOALS["ceiling_from"]] or [max(rows, key=lambda r: r["tokens"])]
    demand = ", ".join(f"{r['tokens']}: {r['ratio'] / r['ratio_ceiling']:.3f}" for r in over)
    ahead = ", ".join(f"{r['tokens']}: {r['prefetched_over_ceiling']:.3f}" for r in over)
    fig["ceiling_goal"] = (f"graft TTFT within {1 - GOALS['ceiling_fraction']:.0%} of the one-forward ceiling at "
                           f">= {GOALS['ceiling_from']} tokens")
    fig["ceiling_met"] = min(r["ratio"] / r["ratio_ceiling"] for r in over) >= GOALS["ceiling_fraction"]
    fig["ceiling_note"] = ("" if over[-1]["tokens"] >= GOALS["ceiling_from"] else
                           f"({GOALS['ceiling_from']} tokens and above not measured; the largest size shown) ")
    fig["ceiling_note"] += (f"TTFT/ceiling (one forward / graft TTFT) with the artifact read on demand: {demand}; "
                           f"read ahead as the harness does (kvstore.Prefetcher): {ahead}")
    return fig


def _ttft_note(fig: dict, at: dict) -> str:
    where = "" if at["tokens"] == GOALS["ttft_at"] else f" ({GOALS['ttft_at']} not measured; at {at['tokens']})"
    p = at["graft_parts_median_s"]
    fwd, ceiling = p["forward"], at["ratio_ceiling"]
    text = (f"{at['ratio']:.1f}x at {at['tokens']} tokens{where}; graft TTFT {at['graft_s']['median'] * 1e3:.1f} ms = "
            f"get {p['get'] * 1e3:.1f} + graft {p['graft'] * 1e3:.2f} + one forward {fwd * 1e3:.1f} ms. "
            f"Even a free restore caps the ratio at recompute/forward = {ceiling:.0f}x: the one-token forward "
            "(dominated by the output projection over the whole vocabulary) is common to both sides.")
    if not fig["met"]:
        text = (f"missed by {GOALS['ttft_ratio'] / at['ratio']:.2f}x (goal {GOALS['ttft_ratio']:.0f}x): " + text)
    return text


