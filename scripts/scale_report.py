"""What a compare job's graft rows did, problem by problem: the decode-token distribution, the misses (with the
answer the grafted entry held), and for the held-out group whether the model copied its neighbour's answer.

    python -m scripts.scale_report runs/compare/<stamp>            # after make aime-graft
    python -m scripts.scale_report runs/compare/<stamp> --show 8 --json runs/scale/report.json
    python -m scripts.scale_report --graft recurring=runs/graft/<run> --graft held_out=runs/graft/<run> \
        --baseline runs/baseline/<run> [--incontext recurring=runs/incontext/<run>]   # separate runs

Reads only the run folders and the library (through harness.library.build: entry id -> problem and verified answer),
never the model, and each folder only after it re-checks (the audit behind `make rescore`: a compare folder through
harness.compare.audit.audited_comparison, a run through harness.record.audit.audited); an edited one is refused
naming its first difference.
The library is found from the run manifest's library name, version and manifest SHA-256 under --library-root.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter
from pathlib import Path

from harness.compare.audit import audited_comparison
from harness.compare.comparison import Comparison
from harness.compare.pairing import pair
from harness.errors import HarnessError, LibraryError, plain
from harness.library.build import Library
from harness.record.audit import audited
from harness.record.folder import FinishedRun
from harness.record.hashing import atomic_write_text

REPO = Path(__file__).resolve().parents[1]


def find_library(manifest: dict, root: Path) -> Library:
    """The library the run grafted from, opened (and so re-checked) through harness.library.build; no store needed."""
    lib = manifest["inputs"].get("library") or {}
    for cand in sorted(root.glob(f"{lib.get('name')}-v{lib.get('version')}-*")):
        try:
            opened = Library(cand, None)  # type: ignore[arg-type]  (entries only: no lookups, no store)
        except LibraryError:
            continue  # an incomplete or modified folder is not the library the run used
        if opened.manifest_sha256 == lib.get("manifest_sha256"):
            return opened
    sha = str(lib.get("manifest_sha256"))[:12]
    raise SystemExit(f"no library {lib.get('name')} v{lib.get('version')} with manifest {sha} under {root}; "
                     "pass --library-root")


def say(text: str) -> None:
    """print(), with control characters (a problem id, a completion) written as escapes."""
    print(plain(text))


def distribution(values: list[int]) -> dict:
    s = sorted(values)
    return {"n": len(s), "min": s[0], "median": statistics.median(s), "p90": s[int(0.9 * (len(s) - 1))],
            "max": s[-1], "mean": round(sum(s) / len(s), 2), "histogram": dict(sorted(Counter(s).items()))}


def group_report(run: FinishedRun, entries: dict[str, dict], show: int) -> dict:
    rows = run.rows  # the rows of the bytes audited (issue 61)
    toks = [r.completion.decode_tokens for r in rows]
    misses, copied, from_self = [], 0, 0
    for r in rows:
        e = entries.get(r.completion.retrieval.entry_id if r.completion.retrieval else "")
        entry_answer = str(e["answer"]) if e else None
        if e and e["problem_id"] == r.problem_id:
            from_self += 1
        if entry_answer is not None and r.extracted == entry_answer:
            copied += 1
        if not r.correct:
            misses.append({"problem_id": r.problem_id, "gold": r.gold, "extracted": r.extracted,
                           "completion": r.completion.text[:60], "entry_problem": e["problem_id"] if e else None,
                           "entry_answer": entry_answer, "stop_reason": r.completion.stop_reason})
    n = len(rows)
    return {"run": str(run), "rows": n, "correct": sum(r.correct for r in rows),
            "accuracy": round(sum(r.correct for r in rows) / n, 4), "decode_tokens": distribution(toks),
            "decode_tokens_total": sum(toks), "grafted_own_entry": from_self,
            "wall_s": round(sum(r.wall_s for r in rows), 1), "cpu_s": round(sum(r.cpu_s for r in rows), 1),
            "answered_the_grafted_entry_answer": copied, "misses": len(misses), "examples": misses[:show]}


def _labelled(pairs: list[str], kind: str) -> dict[str, Path]:
    out = {}
    for p in pairs:
        group, sep, path = p.partition("=")
        if not sep:
            raise SystemExit(f"--{kind} {p!r}: write GROUP=RUN_FOLDER, e.g. recurring=runs/{kind}/<run>")
        out[f"{kind} ({group.replace('_', '-')})"] = Path(path)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("compare", type=Path, nargs="?", help="a compare folder (holds comparison.json)")
    ap.add_argument("--graft", action="append", default=[], help="GROUP=RUN_FOLDER, without a compare folder")
    ap.add_argument("--incontext", action="append", default=[], help="GROUP=RUN_FOLDER: pair with the graft run")
    ap.add_argument("--baseline", type=Path, default=None)
    ap.add_argument("--library-root", type=Path, default=REPO / "runs" / "library")
    ap.add_argument("--show", type=int, default=5, help="misses to list per group")
    ap.add_argument("--json", type=Path, default=None, help="also write the report here")
    args = ap.parse_args(argv)
    if args.compare is not None:
        try:
            checked = audited_comparison(args.compare, "scale_report")
        except HarnessError as exc:
            raise SystemExit(f"error: {plain(str(exc))}") from None
        comp = Comparison.from_json(checked.raw)
        runs = {k: r for k, r in checked.runs.items() if k in comp.runs}  # the records of the bytes audited
    elif args.graft:
        paths = {**_labelled(args.graft, "graft"), **_labelled(args.incontext, "incontext")}
        if args.baseline:
            paths["baseline"] = args.baseline
        runs = {}
        for label, path in paths.items():  # each read once: audited, and its records taken from those bytes
            try:
                runs[label] = audited(path, f"scale_report ({label})")
            except HarnessError as exc:
                raise SystemExit(f"error: {plain(str(exc))}") from None
    else:
        raise SystemExit("give a compare folder, or --graft GROUP=RUN_FOLDER (and --baseline, --incontext)")
    graft_runs = {k: v for k, v in runs.items() if k.startswith("graft")}
    lib = find_library(next(iter(graft_runs.values())).manifest, args.library_root)
    entries = {e.entry_id: e.to_row() for e in lib.entries}
    report = {"compare": str(args.compare), "library": str(lib.path), "groups": {}, "pairings": {}}
    base = runs.get("baseline")
    if base:
        b = base.rows
        report["baseline"] = {"rows": len(b), "correct": sum(r.correct for r in b),
                              "decode_tokens": distribution([r.completion.decode_tokens for r in b]),
                              "decode_tokens_total": sum(r.completion.decode_tokens for r in b),
                              "wall_s": round(sum(r.wall_s for r in b), 1), "cpu_s": round(sum(r.cpu_s for r in b), 1)}
    for label, run in sorted(graft_runs.items()):
        g = report["groups"][label] = group_report(run, entries, args.show)
        d = g["decode_tokens"]
        say(f"{label}: {g['correct']}/{g['rows']} correct ({g['accuracy']:.3f}); decode tokens/problem min "
              f"{d['min']} median {d['median']} p90 {d['p90']} max {d['max']} mean {d['mean']} (total "
              f"{g['decode_tokens_total']}); grafted its own entry {g['grafted_own_entry']}x; answered the grafted "
              f"entry's answer {g['answered_the_grafted_entry_answer']}x; histogram {d['histogram']}")
        for m in g["examples"]:
            say(f"  miss {m['problem_id']}: gold {m['gold']}, answered {m['extracted']!r} ({m['completion']!r}, "
                  f"{m['stop_reason']}); grafted entry {m['entry_problem']} holds {m['entry_answer']}")
    for label, run in sorted(runs.items()):
        twin = label.replace("incontext", "graft")
        if label.startswith("incontext") and twin in graft_runs:
            p = pair(graft_runs[twin].rows, run.rows)
            report["pairings"][twin] = p.to_json()
            say(f"{twin} vs {label}: {p.identical} rows identical (completion token ids and first-logits SHA-256), "
                  f"{p.differing} differing")
    if base:
        b = report["baseline"]
        say(f"baseline: {b['correct']}/{b['rows']} correct; decode tokens total {b['decode_tokens_total']} "
              f"(mean {b['decode_tokens']['mean']}/problem); rows' wall {b['wall_s']} s, CPU {b['cpu_s']} s")
        for label, g in sorted(report["groups"].items()):
            g["vs_baseline"] = {"decode_tokens": round(b["decode_tokens_total"] / max(g["decode_tokens_total"], 1), 2),
                                "wall": round(b["wall_s"] / max(g["wall_s"], 1e-9), 2),
                                "cpu": round(b["cpu_s"] / max(g["cpu_s"], 1e-9), 2)}
            v = g["vs_baseline"]
            say(f"  {label}: wall {g['wall_s']} s, CPU {g['cpu_s']} s; baseline / {label}: decode tokens "
                  f"{v['decode_tokens']}x, wall {v['wall']}x, CPU {v['cpu']}x")
    if args.json:
        atomic_write_text(args.json, json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
