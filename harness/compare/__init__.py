"""The compare job and its record: job.py (`python -m harness.compare`), plan.py (which runs, which pairs),
comparison.py (comparison.json, typed), pairing.py (graft vs in-context twins), per_problem.py, views.py (the
terminal), summary_page.py, plots.py, report.py (a sweep), mlflow_runs.py (the parent run in MLflow), audit.py
(re-check a compare folder)."""
