"""The benchmarks, one module per measurement (`python -m scripts.bench.run` is `make bench`; `python -m
scripts.bench.context`, `.decode`, `.scaleout` ... each runs alone), sharing scripts.bench.common (goals, timing,
the machine, the token stream, the summary JSON)."""
