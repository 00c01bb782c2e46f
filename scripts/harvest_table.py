"""The harvest loop's table: accuracy before (avg@n of the chain-of-thought samples), after (each problem answered by
graft from the library of the model's own verified solutions: recurring), the ceiling (pass@n: a problem counts when
any sample was verified) and the same library on problems it does not hold (held-out), each with a 95% interval.

    python -m scripts.harvest_table runs/baseline/<sampling run> runs/compare/<harvest_graft compare> \
        [--json runs/harvest/table.json] [--markdown runs/harvest/table.md]

The first folder is step 1 of configs/experiment/harvest_loop_vllm.yaml (n samples per problem), the second the
compare job of step 2 (harvest_graft_vllm.yaml: the model alone, graft recurring and held-out, one row per problem).
Recurring and held-out are also split by whether the library holds the problem (a solved one) or not. Reads only
the run folders (each re-checked by `make rescore`), never the model.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path

from harness.record.audit import audited
from harness.record.metrics import summarize_scores, wilson_interval
from harness.record.rows import Row
from scripts.scales_table import emit_table, read_compare


def _share(k: int, n: int) -> dict:
    lo, hi = wilson_interval(k, n) if n else (0.0, 1.0)
    return {"correct": k, "n": n, "accuracy": k / n if n else None, "ci95": [round(lo, 4), round(hi, 4)],
            "interval": "wilson"}


def loop_table(samples: Sequence[Row], runs: Mapping[str, Sequence[Row]]) -> dict:
    """The table from the sampling run's rows and the compare job's (label -> rows, one per problem)."""
    by_problem: dict[str, list[bool]] = defaultdict(list)
    for r in samples:
        by_problem[r.problem_id].append(r.correct)
    s = summarize_scores([{"problem_id": r.problem_id, "sample": r.sample, "correct": r.correct} for r in samples])
    n = s["n_samples"]
    solved = sorted(p for p, flags in by_problem.items() if any(flags))
    out: dict = {
        "problems": len(by_problem), "samples_per_problem": n, "harvested": solved,
        "before": {"name": f"avg@{n}", "accuracy": s["accuracy"],
                   "ci95": [round(s["accuracy_ci_low"], 4), round(s["accuracy_ci_high"], 4)],
                   "interval": "bootstrap over problems" if n > 1 else "wilson"},
        "ceiling": {"name": f"pass@{n}"} | _share(len(solved), len(by_problem)),
        "runs": {},
    }
    for label, rows in runs.items():
        one = [r for r in rows if r.sample == 0 and r.problem_id in by_problem]
        held = [r for r in one if r.problem_id in solved]
        other = [r for r in one if r.problem_id not in solved]
        out["runs"][label] = _share(sum(r.correct for r in one), len(one)) | {
            "on_solved": _share(sum(r.correct for r in held), len(held)),
            "on_unsolved": _share(sum(r.correct for r in other), len(other)),
            "correct_problems": [r.problem_id for r in one if r.correct]}
    return out


def fmt(a: Mapping) -> str:
    lo, hi = a["ci95"]
    head = f"{a['correct']}/{a['n']} = {a['accuracy']:.3f}" if "correct" in a else f"{a['accuracy']:.3f}"
    return f"{head} [{lo:.3f}, {hi:.3f}]"


def markdown(t: Mapping) -> str:
    b, c = t["before"], t["ceiling"]
    lines = ["| | accuracy [95% CI] | on the solved problems | on the unsolved |", "|---|---:|---:|---:|",
             f"| before: {b['name']} of the CoT samples | {fmt(b)} | | |",
             f"| ceiling: {c['name']} (problems harvested) | {fmt(c)} | | |"]
    for label, r in t["runs"].items():
        lines.append(f"| {label} | {fmt(r)} | {fmt(r['on_solved']) if r['on_solved']['n'] else '-'} | "
                     f"{fmt(r['on_unsolved']) if r['on_unsolved']['n'] else '-'} |")
    lines += ["", f"{t['problems']} problems x {t['samples_per_problem']} samples; harvested "
              f"{len(t['harvested'])}: {', '.join(t['harvested']) or '-'}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("samples", type=Path, help="the sampling run folder (step 1)")
    ap.add_argument("compare", type=Path, help="the compare folder of step 2")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--markdown", type=Path, default=None)
    args = ap.parse_args(argv)
    # the sampling run audited, and its rows taken from the bytes audited (issue 61)
    t = loop_table(audited(args.samples, "harvest_table").rows, read_compare(args.compare)[0])
    text = markdown(t)
    emit_table(text, t, args.json, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
