"""MLflow as an index over run folders: log.py (log_run_dir / try_log_run_dir: one finished run), store.py (the
SQLite store made safely, retries), mlflow_run.py (one MLflow run written in one go), tracing.py (traces with
feedback), views.py (names, tags, datasets), server.py (an MLflow server on 127.0.0.1). The compare job's parent
run is harness/compare/mlflow_runs.py."""
