"""Re-print a finished comparison (the compare job's terminal output) from its folder: no model, no torch.

    python scripts/show_comparison.py runs/compare/2026-12-01_11-00-00-000000
    python scripts/show_comparison.py runs/compare/<stamp> --width 80     # as an 80-column terminal shows it

Reads ``comparison.json`` and ``per_problem.json`` (the misses list) and prints them as the job did
(harness/compare/views.py). Exit status 2 when the folder holds no readable comparison.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


from harness.compare import per_problem  # noqa: E402
from harness.compare.audit import locate_runs  # noqa: E402
from harness.compare.comparison import COMPARISON, Comparison  # noqa: E402
from harness.compare.views import print_comparison  # noqa: E402
from harness.errors import HarnessError  # noqa: E402
from harness.record.folder import RunFolder  # noqa: E402
from harness.record.rows import budget_label, budget_of  # noqa: E402
from harness.terminal import console as terminal_console  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("compare_dir", type=Path, help="runs/compare/<stamp> (holds comparison.json)")
    parser.add_argument("--width", type=int, default=None, help="render at this many columns (default: terminal)")
    args = parser.parse_args(argv)
    folder = RunFolder(args.compare_dir)
    try:
        result = Comparison.from_json(folder.read_json(COMPARISON))
    except HarnessError as exc:
        print(f"show_comparison: {exc}", file=sys.stderr)
        return 2
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        print(f"show_comparison: {folder.file(COMPARISON)}: not a comparison this harness reads ({type(exc).__name__}: "
              f"{exc}); re-check it with make rescore RUN={args.compare_dir}", file=sys.stderr)
        return 2
    try:
        table = folder.read_json(per_problem.PER_PROBLEM).get("rows") or []
    except HarnessError:
        table = []  # written before the per-problem view existed: no misses list
    title = args.compare_dir.name
    try:
        base = RunFolder(locate_runs(folder.path, result.to_json())[result.plan.baseline][0])
        s, budget = base.read_summary(), budget_label(budget_of(base.read_config()))
        title = f"{s.dataset}, {s.model}{f' | {budget}' if budget else ''} ({args.compare_dir.name})"
    except (HarnessError, KeyError, TypeError):
        pass
    print_comparison(title, result, misses=per_problem.misses(table, result.plan),
                     console=terminal_console(width=args.width),
                     reprint=f"python scripts/show_comparison.py {args.compare_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
