"""The project's entry points: each module here is a command, run from the repository root as `python -m scripts.NAME`
(`python -m scripts.verify_graft --help`); the benchmarks are the `scripts.bench` package. The logic a command shares
with the rest of the project lives in kvstore or harness; a module here parses arguments, calls it, prints and writes.
Not installed with the packages (pyproject.toml installs kvstore and harness): run from a checkout."""
