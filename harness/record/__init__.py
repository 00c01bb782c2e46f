"""What a run records and how it is re-checked (harness/RUN_FORMAT.md): rows.py (Completion, Row, Summary),
figures.py (typed results), metrics.py, folder.py (RunFolder: the one owner of a run folder), manifest.py,
audit.py (re-check a folder without the model), hashing.py (canonical hashes, atomic writes)."""
