"""The store fuzz as a command: `python -m scripts.fuzz_store --mutants 100000 [--seed 0] [--out runs/fuzz]`.
The fuzz itself (what it mutates, the outcomes it counts) is kvstore/testing/fuzz.py."""

from __future__ import annotations

import sys

from kvstore.testing.fuzz import main

if __name__ == "__main__":
    sys.exit(main())
