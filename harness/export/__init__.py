"""Export a run folder's rows in another tool's per-sample format: `python -m harness.export RUN --format
lm-eval|every-eval-ever [--out DIR]`. lm_eval.py writes lm-evaluation-harness's `samples_<task>_<time>.jsonl`,
every_eval_ever.py the Every Eval Ever instance-level records, both with kvgraft's manifest hashes (common.py), so an
exported sample is checkable against the weights' fingerprint, not only a model name; run.py is the entry point."""

from harness.export.run import FORMATS, export_run

__all__ = ["FORMATS", "export_run"]
