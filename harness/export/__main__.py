"""`python -m harness.export RUN --format lm-eval|every-eval-ever [--out DIR]`: write a finished run's rows in another
tool's per-sample format (harness/export/). The run folder is read, never written; the files go to --out
(default runs/export/<run folder name>/<format>/).
Exit 2 when the folder is not a finished run or does not re-check (it is audited first, as `make rescore` does)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.errors import HarnessError, plain
from harness.export.run import FORMATS, export_run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.export", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="a finished run folder (holds manifest.json)")
    parser.add_argument("--format", required=True, choices=FORMATS, help="the other tool's per-sample format")
    parser.add_argument("--out", type=Path, default=None,
                        help="output folder (default runs/export/<run folder name>/<format>/)")
    args = parser.parse_args(argv)
    out = args.out or Path("runs") / "export" / args.run_dir.resolve().name / args.format
    try:
        files = export_run(args.run_dir, args.format, out)
    except HarnessError as exc:
        print(f"error: {plain(str(exc))}", file=sys.stderr)
        return 2
    for f in files:
        print(plain(str(f)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
