"""Re-check a run folder without loading any model: every hash, every score, the summary.

Run from the repository root::

    python -m scripts.rescore runs/baseline/2025-01-01_12-00-00_ab12cd      # or:
    make rescore RUN=runs/baseline/2025-01-01_12-00-00_ab12cd
    python -m scripts.rescore RUN_DIR --json                                # machine-readable result

It re-hashes ``manifest.json``, ``outputs.jsonl`` (file and every row), ``summary.json`` and
``problems.jsonl``, re-scores every completion with ``harness.task.answers.score`` and recomputes the
summary scores and groups (``harness.record.audit.audit``), then prints recorded vs recomputed scores.

Given a compare folder (``runs/compare/<stamp>``, holding ``comparison.json``), it audits every run the
comparison lists, checks each is the run it was made from (manifest SHA-256), of the condition, group and
comparable key its label says, re-checks the graft-vs-incontext pairing from the recorded rows (same completion
token ids and first-logits SHA-256) and recomputes every figure of comparison.json from those runs, naming any
field that differs (``harness.compare.audit.audit_comparison``)::

    make rescore RUN=runs/compare/2025-01-01_12-00-00-000000

Given a sweep folder (``runs/multirun/<stamp>``, or any folder holding run or compare folders), it re-checks
every job in it and prints one line per job; a Hydra sweep's ``multirun.yaml`` says how many jobs there should
be, and each listed job without a finished run is a ``MISSING`` line and a finding (``harness.record.sweep``)::

    make rescore RUN=runs/multirun/2025-01-01_12-00-00

Exit status: 0 when everything matches, 1 on any mismatch (tampering, edited rows, changed scorer),
2 when the folder or a required file is missing or unreadable.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from harness.compare.audit import ComparisonCheck, audit_comparison
from harness.compare.comparison import COMPARISON
from harness.errors import HarnessError, plain
from harness.errors import console as terminal_console
from harness.record.audit import RunCheck, audit, diff_values
from harness.record.folder import RunFolder
from harness.record.sweep import MULTIRUN, sweep_plan


def say(*parts: Any, **kwargs: Any) -> None:
    """print(), with control characters in the text (a problem id or a path in a finding) written as escapes."""
    print(*(plain(str(p)) for p in parts), **kwargs)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _print_report(run_dir: Path, check: RunCheck) -> None:
    from rich.table import Table

    console = terminal_console(highlight=False)
    table = Table(title=f"scores of {run_dir}")
    table.add_column("metric")
    table.add_column("recorded (summary.json)", justify="right")
    table.add_column("recomputed (outputs.jsonl)", justify="right")
    table.add_column("match", justify="center")
    for key in sorted(set(check.recorded_scores) | set(check.scores)):
        recorded = check.recorded_scores.get(key)
        recomputed = check.scores.get(key)
        same = (
            key in check.recorded_scores
            and key in check.scores
            and not diff_values(recorded, recomputed, key)
        )
        table.add_row(key, _fmt(recorded), _fmt(recomputed), "[green]yes[/]" if same else "[red]NO[/]")
    console.print(table)
    _print_verdict(check.ok, f"{check.n_rows} rows re-scored, all hashes match", run_dir, check.findings)


def _print_verdict(ok: bool, ok_text: str, where: Path, findings: list[str]) -> None:
    """Plain prints: one unwrapped line per finding, easy to grep in logs."""
    if ok:
        say(f"OK: {ok_text}")
    else:
        say(f"FAILED: {len(findings)} finding(s) in {where}:")
        for finding in findings:
            say(f"  - {finding}")


def _print_comparison(compare_dir: Path, check: ComparisonCheck) -> None:
    for label, run in check.runs.items():
        where = (check.located or {}).get(label)
        say(f"run {label}: {'OK' if run.ok else 'FAILED'} ({run.n_rows} rows re-scored" +
              (f"; {where})" if where else ")"))
    for group, p in check.pairs.items():
        n = p["identical_rows"] + p["differing_rows"]
        say(f"pairing {group}: {p['identical_rows']}/{n} graft rows identical to their incontext twin")
    _print_verdict(check.ok, f"{compare_dir}: every run re-scores and is the one compared, every hash matches, every "
                   "figure recomputes, every graft row equals its twin",
                   compare_dir, check.findings)


def _main_comparison(compare_dir: Path, as_json: bool) -> int:
    try:
        check = audit_comparison(compare_dir)
    except HarnessError as exc:
        say(json.dumps({"ok": False, "error": str(exc)}) if as_json else f"error: {exc}",
              file=sys.stdout if as_json else sys.stderr)
        return 2
    if as_json:
        print(json.dumps({"ok": check.ok, "findings": check.findings, "pairs": check.pairs,
                          "runs": {k: {"ok": r.ok, "n_rows": r.n_rows, "located": (check.located or {}).get(k)}
                                   for k, r in check.runs.items()}},
                         indent=2, sort_keys=True))
    else:
        _print_comparison(compare_dir, check)
    return 0 if check.ok else 1


def _main_sweep(sweep_dir: Path, as_json: bool) -> int:
    """Re-check every job of a sweep folder (``runs/multirun/<stamp>``: run folders one level down, or compare
    folders): one line per job, then the verdict. Exit 2 when the folder holds no run at all."""
    jobs = sorted({*(p.parent for p in sweep_dir.glob(f"*/{COMPARISON}")),
                   *(f.path for f in RunFolder.find(sweep_dir))})
    plan = sweep_plan(sweep_dir)
    if not jobs and plan is None:
        message = f"{sweep_dir}: no run folder (manifest.json) or compare folder (comparison.json) in it or below it"
        say(json.dumps({"ok": False, "error": message}) if as_json else f"error: {message}",
              file=sys.stdout if as_json else sys.stderr)
        return 2
    results, findings = {}, []
    for job in jobs:
        try:
            check = audit_comparison(job) if (job / COMPARISON).is_file() else audit(RunFolder(job))
            ok, found = check.ok, check.findings
        except HarnessError as exc:
            ok, found = False, [str(exc)]
        results[str(job)] = {"ok": ok, "findings": found}
        findings += [f"{job.relative_to(sweep_dir)}: {f}" for f in found]
        if not as_json:
            say(f"{'OK' if ok else 'FAILED'}  {job.relative_to(sweep_dir)}")
    listed = None
    if plan is not None:  # a Hydra sweep: every job its multirun.yaml lists must be here
        if plan.jobs is None:
            findings.append(f"{MULTIRUN}: {plan.unknown}; the jobs present re-check, but whether any is missing "
                            "cannot be told")
        else:
            listed = len(plan.jobs)
            missing = plan.missing()
            findings += [f"{MULTIRUN} lists {d}" for d in missing]
            if missing and not as_json:
                for d in missing:
                    say(f"MISSING {d}")
    ok = not findings and all(r["ok"] for r in results.values())
    if as_json:
        print(json.dumps({"ok": ok, "jobs": results, "listed": listed}, indent=2, sort_keys=True))
    else:
        counted = f"all {len(jobs)} jobs re-check" + (f" (all {listed} jobs {MULTIRUN} lists)" if listed else "")
        _print_verdict(ok, f"{sweep_dir}: {counted}", sweep_dir, findings)
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, verify the run folder, print the result; return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path,
                        help="run folder (contains manifest.json) or compare folder (comparison.json)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    args = parser.parse_args(argv)
    if (args.run_dir / COMPARISON).is_file():
        return _main_comparison(args.run_dir, args.json)
    if args.run_dir.is_dir() and not (args.run_dir / "manifest.json").exists():
        return _main_sweep(args.run_dir, args.json)
    try:
        check = audit(RunFolder(args.run_dir))
    except HarnessError as exc:
        if args.json:
            print(json.dumps({"ok": False, "error": str(exc)}))
        else:
            say(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(
            json.dumps(
                {
                    "ok": check.ok,
                    "n_rows": check.n_rows,
                    "findings": check.findings,
                    "scores": check.scores,
                    "recorded_scores": check.recorded_scores,
                },
                indent=2,
                sort_keys=True,
            )
        )
    else:
        _print_report(args.run_dir, check)
    return 0 if check.ok else 1


if __name__ == "__main__":
    sys.exit(main())
