"""The recurring-case factor as a command (`make recurring-factor`): `python scripts/recurring_factor.py
[--incontext] [--graft-prompt=PROMPT] [HYDRA_OVERRIDE ...]`. What it runs and how it counts is
harness/recurring_factor.py."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.recurring_factor import main  # noqa: E402

if __name__ == "__main__":
    main()
