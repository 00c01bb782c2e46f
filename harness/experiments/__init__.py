"""Experiments beyond the main job: replay.py + registry.py (pre-registered replay of exact hashes),
recurring_factor.py (the recurring-case factor), text.py (the problem text the scripts read)."""
