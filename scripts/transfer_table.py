"""The chain-of-thought transfer table (configs/experiment/transfer_cot*.yaml, docs/models.md): per run, accuracy with
its Wilson 95% interval, the problems it turns wrong -> right and right -> wrong against the model alone, the rows
stopped at the budget (stop reason "length") and cut inside a reasoning trace (overlong), and decode tokens per row;
against the model alone, the exact McNemar p-value of the paired changes (two-sided binomial on the problems that
changed: are wrong -> right and right -> wrong more different than chance on the same problems?). With `--library`
(the runs' library folder, runs/library/<name>-v<version>-...), one more column: the rows whose answer is the grafted
entry's own answer while the problem's is another (the model copied its neighbour's answer).

    python -m scripts.transfer_table --alone runs/baseline/<stamp> --run "held-out=runs/graft/<stamp>" \
        --run "random-entry=runs/graft/<stamp>" --run "recurring=runs/graft/<stamp>" [--library runs/library/<lib>] \
        [--json t.json] [--markdown t.md]

Every folder must be a finished run over the same problems with the same comparable key (same model, data, prompt,
decoding); each is re-checked first by the audit behind `make rescore` (harness.record.audit.audited) and an edited
folder is refused naming its first difference, so no figure is cited from one. --alone must be a baseline run (no
graft), each --run a run that grafts from a library. Reads only the run folders, never the model. Problem ids and
labels reach the terminal and the markdown with their control characters written as escapes (harness.errors.plain).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from harness.errors import LibraryError, RunFolderError, exit_on_error
from harness.library.build import Library
from harness.record.audit import audited
from harness.record.folder import FinishedRun
from harness.record.metrics import wilson_interval
from harness.record.rows import Row
from harness.task.answers import parse_gold
from scripts.scales_table import emit_table  # scripts/: print and write a table


def _id_order(problem_id: str) -> tuple:
    """AIME ids in year-number order (1983-2 before 1983-10); other ids as text."""
    head, _, tail = problem_id.rpartition("-")
    return (0, int(head), int(tail), "") if head.isdigit() and tail.isdigit() else (1, 0, 0, problem_id)


def _first_samples(rows: Sequence[Row]) -> dict[str, Row]:
    return {r.problem_id: r for r in rows if r.sample == 0}


def mcnemar_exact_p(gained: int, lost: int) -> float:
    """Two-sided exact McNemar p-value: P(a split of the gained + lost changed problems at least this uneven) when
    each change is equally likely either way (binomial, p=1/2); 1.0 when nothing changed."""
    n, k = gained + lost, min(gained, lost)
    if n == 0:
        return 1.0
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n)


def copied_entry_answer(row: Row, entry_answers: Mapping[str, str]) -> bool:
    """Whether a graft row answered its grafted entry's answer where the problem's own answer is another: the model
    took its neighbour's answer (never true of a recurring row, whose entry is its own problem's)."""
    got = row.completion.retrieval
    if got is None or got.entry_id not in entry_answers:
        return False
    theirs = parse_gold(entry_answers[got.entry_id])
    return theirs != parse_gold(row.gold) and row.answer == theirs


def library_answers(folder: Path, manifest_sha256: str | None) -> dict[str, str]:
    """entry_id -> the entry's verified answer, read by `harness.library.build.Library` (its manifest, every index
    row and the index checked against their hashes); the folder must be the library the runs grafted from (its
    manifest_sha256 is the one their manifests record)."""
    try:
        lib = Library(folder, store=None)  # only the index is read: no artifact is opened
    except LibraryError as exc:
        raise LibraryError(f"transfer_table: --library {folder}: not a library folder ({exc}); give the folder "
                           "runs/library/<name>-v<version>-... that holds manifest.json and index.jsonl") from None
    got = lib.manifest["manifest_sha256"]
    if manifest_sha256 is None or got != manifest_sha256:
        raise LibraryError(f"transfer_table: --library {folder}: manifest_sha256 {got[:12]}... is not the library the "
                           f"runs grafted from ({str(manifest_sha256)[:12]}..., their manifests' inputs.library); a "
                           "library edited and re-sealed since is another library: give the one the runs read")
    return {e.entry_id: str(e.answer) for e in lib.entries}


def run_figures(rows: Sequence[Row], alone: Mapping[str, Row] | None,
                entry_answers: Mapping[str, str] | None = None) -> dict:
    """One run's figures (its first sample per problem); `alone` (the baseline's) gives the per-problem changes,
    `entry_answers` (entry_id -> answer) the rows that answered their grafted entry's answer."""
    one = _first_samples(rows)
    n, k = len(one), sum(r.correct for r in one.values())
    lo, hi = wilson_interval(k, n)
    out = {"correct": k, "n": n, "accuracy": k / n, "ci95": [round(lo, 4), round(hi, 4)],
           "length": sum(r.completion.stop_reason == "length" for r in one.values()),
           "overlong": sum(bool(r.overlong) for r in one.values()),
           "decode_tokens_per_row": sum(r.completion.decode_tokens for r in one.values()) / n}
    if alone is not None:
        if set(alone) != set(one):
            raise RunFolderError(f"transfer_table: the runs cover other problems ({len(one)} vs {len(alone)}); every "
                                 "run must answer the same problems")
        out["wrong_to_right"] = sorted((p for p, r in one.items() if r.correct and not alone[p].correct), key=_id_order)
        out["right_to_wrong"] = sorted((p for p, r in one.items() if not r.correct and alone[p].correct), key=_id_order)
        out["mcnemar_p"] = round(mcnemar_exact_p(len(out["wrong_to_right"]), len(out["right_to_wrong"])), 4)
    if entry_answers is not None:
        copied = (p for p, r in one.items() if copied_entry_answer(r, entry_answers))
        out["entry_answer"] = sorted(copied, key=_id_order)
    return out


def table(alone: Sequence[Row], runs: Mapping[str, Sequence[Row]],
          entry_answers: Mapping[str, str] | None = None) -> dict:
    base = _first_samples(alone)
    return {"problems": len(base), "alone": run_figures(alone, None),
            "runs": {label: run_figures(rows, base, entry_answers) for label, rows in runs.items()}}


def _fmt(r: Mapping) -> str:
    lo, hi = wilson_interval(r["correct"], r["n"])  # not the JSON's 4-place rounding, rounded again
    return f"{r['correct']}/{r['n']} = {r['accuracy']:.3f} [{lo:.3f}, {hi:.3f}]"


def _problems(ids: Sequence[str], most: int = 12) -> str:
    """Problem ids in a cell: all of them up to `most`, else their count (the JSON keeps every id)."""
    if not ids:
        return "0"
    return ", ".join(ids) if len(ids) <= most else f"{len(ids)} problems"


def markdown(t: Mapping) -> str:
    copies = any("entry_answer" in r for r in t["runs"].values())
    lines = ["| | accuracy [95% CI] | wrong -> right | right -> wrong | paired p (McNemar exact) | "
             "stopped at the budget | overlong | decode tokens / row |"
             + (" answered the grafted entry's answer |" if copies else ""),
             "|---|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if copies else "")]
    for label, r in [("alone", t["alone"]), *t["runs"].items()]:
        w2r = _problems(r["wrong_to_right"]) if "wrong_to_right" in r else ""
        r2w = _problems(r["right_to_wrong"]) if "right_to_wrong" in r else ""
        p = ("< 0.001" if r["mcnemar_p"] < 0.001 else f"{r['mcnemar_p']:.3f}") if "mcnemar_p" in r else ""
        copied = (f" {len(r['entry_answer'])}/{r['n']}" + (f" ({', '.join(r['entry_answer'])})"
                  if 0 < len(r["entry_answer"]) <= 8 else "") + " |") if "entry_answer" in r else " |"
        lines.append(f"| {label} | {_fmt(r)} | {w2r} | {r2w} | {p} | {r['length']}/{r['n']} | "
                     f"{r['overlong']}/{r['n']} | {r['decode_tokens_per_row']:.1f} |" + (copied if copies else ""))
    return "\n".join(lines) + "\n"


#: the condition each role must be: the model alone is a baseline run; every other run grafts from a library
ALONE = "baseline"


def _read(label: str, path: Path) -> FinishedRun:
    """A finished run folder, re-checked first (harness.record.audit.audited): one line naming the first difference,
    or saying the folder is missing or unfinished, else the run."""
    run = audited(path, f"transfer_table ({'--alone' if label == 'alone' else f'--run {label}'})")
    condition, library = run.summary.condition, (run.manifest.get("inputs") or {}).get("library")
    if label == "alone" and (condition != ALONE or library is not None):
        raise RunFolderError(f"--alone {path}: a {condition!r} run" + (" that grafts from a library" if library else "")
                             + f"; the model alone is a {ALONE!r} run (condition={ALONE})")
    if label != "alone" and (condition == ALONE or not isinstance(library, dict)):
        raise RunFolderError(f"--run {label}={path}: a {condition!r} run without a library; each --run is a run that "
                             "grafts from one (condition=graft ...), the model alone is --alone")
    return run


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--alone", type=Path, required=True, help="the model-alone run folder (condition=baseline)")
    ap.add_argument("--run", action="append", default=[], metavar="LABEL=FOLDER", help="a graft run, by label")
    ap.add_argument("--library", type=Path, default=None,
                    help="the runs' library folder: adds the rows that answered their grafted entry's answer")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--markdown", type=Path, default=None)
    args = ap.parse_args(argv)
    specs = {"alone": args.alone}
    for spec in args.run:
        label, sep, path = spec.partition("=")
        if not sep or not label or label == "alone" or label in specs:
            ap.error(f"--run {spec!r}: write LABEL=FOLDER, one label per run, not 'alone'")
        specs[label] = Path(path)
    runs = {label: _read(label, path) for label, path in specs.items()}
    keys = {label: r.summary.comparable_key for label, r in runs.items()}
    if len(set(keys.values())) != 1:
        raise RunFolderError(f"transfer_table: the runs differ in comparable key (model, data, prompt or decoding): "
                             f"{keys}")
    entry_answers = None
    if args.library is not None:
        libs = {label: (r.manifest.get("inputs", {}).get("library") or {}).get("manifest_sha256")
                for label, r in runs.items() if label != "alone"}
        if len(set(libs.values())) != 1:
            raise LibraryError(f"transfer_table: the graft runs grafted from different libraries (or none): {libs}; "
                               "--library needs runs of one library")
        entry_answers = library_answers(args.library, next(iter(libs.values())))
    rows = {label: r.rows for label, r in runs.items()}
    t = table(rows.pop("alone"), rows, entry_answers)
    text = markdown(t)
    emit_table(text, t, args.json, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
