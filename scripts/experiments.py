"""What the experiment scripts share, importable as a sibling module (`python scripts/X.py` puts scripts/ first
on sys.path): the problem text (harness/experiment_text.py) and the CPU's name (kvstore.environment). The
benchmarks' own helpers are scripts/bench/common.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from harness.experiment_text import (  # noqa: E402, F401  (re-exported for the scripts)
    DEFAULT_PROBLEMS,
    joined_text,
    problem_text,
    problem_texts,
    read_problems,
)
from kvstore.environment import cpu_name  # noqa: E402, F401  (the benchmarks import it from here)
