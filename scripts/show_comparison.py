"""Re-print a finished comparison (the compare job's terminal output) from its folder: no model, no torch.

    python -m scripts.show_comparison runs/compare/2026-12-01_11-00-00-000000
    python -m scripts.show_comparison runs/compare/<stamp> --width 80     # as an 80-column terminal shows it

Reads ``comparison.json`` and ``per_problem.json`` (the misses list) and prints them as the job did
(harness/compare/views.py), only after the whole re-checks (harness.compare.audit.audited_comparison, the audit behind
`make rescore`) and the per-problem view equals the one its re-checked runs give; else one line and
exit status 2, as when the folder holds no readable comparison.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.compare import per_problem
from harness.compare.audit import audited_comparison
from harness.compare.comparison import COMPARISON, Comparison
from harness.compare.views import print_comparison
from harness.errors import HarnessError, plain
from harness.errors import console as terminal_console
from harness.record.folder import RunFolder
from harness.record.rows import budget_label, budget_of

REPO = Path(__file__).resolve().parents[1]


def view_differences(recorded: list[dict], recomputed: list[dict]) -> str | None:
    """The first difference between per_problem.json's rows and the same view recomputed from the re-checked runs
    (every column but the library entry's problem and answer, which the runs alone do not give), or None."""
    if len(recorded) != len(recomputed):
        return f"{len(recorded)} rows, the runs give {len(recomputed)}"
    for i, (old, new) in enumerate(zip(recorded, recomputed, strict=True), start=1):
        for key in new:
            if not key.endswith((" entry", " entry answer")) and old.get(key) != new[key]:
                where = f"row {i} ({new.get('problem_id')}#{new.get('sample')})"
                return f"{where}: {key} {old.get(key)!r}, the runs give {new[key]!r}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("compare_dir", type=Path, help="runs/compare/<stamp> (holds comparison.json)")
    parser.add_argument("--width", type=int, default=None, help="render at this many columns (default: terminal)")
    args = parser.parse_args(argv)
    folder = RunFolder(args.compare_dir)
    try:  # the whole re-checked first (the audit behind `make rescore`): no figure of an edited folder is shown
        checked = audited_comparison(args.compare_dir, "show_comparison")
        result = Comparison.from_json(checked.raw)
    except HarnessError as exc:
        print(plain(f"show_comparison: {exc}"), file=sys.stderr)
        return 2
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        print(plain(f"show_comparison: {folder.file(COMPARISON)}: not a comparison this harness reads "
                    f"({type(exc).__name__}: {exc}); re-check it with make rescore RUN={args.compare_dir}"),
              file=sys.stderr)
        return 2
    try:
        table = folder.read_json(per_problem.PER_PROBLEM).get("rows") or []
    except HarnessError:
        table = []  # written before the per-problem view existed: no misses list
    differs = view_differences(table, per_problem.per_problem({k: r.rows for k, r in checked.runs.items()}, {},
                                                              result.plan))
    if table and differs:
        print(plain(f"show_comparison: {folder.file(per_problem.PER_PROBLEM)}: {differs}; the view was edited: "
                    f"re-run the compare job, or see make rescore RUN={args.compare_dir}"), file=sys.stderr)
        return 2
    title = args.compare_dir.name
    base = checked.runs.get(result.plan.baseline)
    if base is not None:
        s, budget = base.summary, budget_label(budget_of(base.config))
        title = f"{s.dataset}, {s.model}{f' | {budget}' if budget else ''} ({args.compare_dir.name})"
    print_comparison(title, result, misses=per_problem.misses(table, result.plan),
                     console=terminal_console(width=args.width),
                     reprint=f"python -m scripts.show_comparison {args.compare_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
