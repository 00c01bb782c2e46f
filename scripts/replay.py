"""Pre-registered replay as a command (`make replay`): `python -m scripts.replay [--profile P] [--register]
[--speed]`. What it recomputes and how it judges is harness/experiments/replay.py; the registry is
scripts/replay_registry.json."""

from __future__ import annotations

import sys

from harness.experiments.replay import main

if __name__ == "__main__":
    sys.exit(main())
