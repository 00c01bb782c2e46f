"""The solution library: build.py (verified solutions deposited once; `python -m harness.library`), random_entry.py
(the control: a random other entry, library.retrieval=random), source.py
(where entries come from: a dataset, or a run's verified outputs), bundle.py (a library as one bundle file)."""
