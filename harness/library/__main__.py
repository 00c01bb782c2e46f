"""`python -m harness.library`: build the solution library (harness/library/build.py)."""

from harness.library.build import main

main()
