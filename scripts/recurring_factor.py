"""The recurring-case factor as a command (`make recurring-factor`): `python -m scripts.recurring_factor
[--incontext] [--graft-prompt=PROMPT] [HYDRA_OVERRIDE ...]`. What it runs and how it counts is
harness/experiments/recurring_factor.py."""

from __future__ import annotations

from harness.experiments.recurring_factor import main

if __name__ == "__main__":
    main()
