"""Running a condition over problems: loop.py (run, run_rows, the comparable and resume keys), decode.py (greedy
and seeded sampling on any backend), conditions/ (the registry and one module per condition), distributed.py
(Ray execution), energy.py (meters)."""
