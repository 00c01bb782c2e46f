"""`python -m harness.compare`: the compare job (harness/compare/job.py)."""

from harness.compare.job import main

main()
