"""Re-check a run, compare or sweep folder without loading any model: `python -m scripts.rescore RUN_DIR [--json]`
(or `make rescore RUN=...`). The logic and its documentation are in harness/rescore.py; this entry point exists
so the command works from a checkout without installing the package (torch is not needed: docs/extending.md)."""

from __future__ import annotations

import sys

from harness.rescore import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
