"""Log finished run folders to MLflow after the fact (e.g. when tracking was unreachable during the run).

Run from the repository root::

    python scripts/log_run.py runs/baseline/2025-01-01_12-00-00_ab12cd [MORE_RUN_DIRS ...]
    python scripts/log_run.py RUN_DIR --tracking-uri sqlite:////abs/path/mlflow.db --experiment kvgraft

Defaults: the tracking URI is the project store ``sqlite:////<repo>/runs/mlflow.db``; the experiment is
the run's ``tracking.experiment`` from its ``config.yaml``, else ``kvgraft``. A folder whose
``tracking.json`` already names a run id in the same store is skipped unless ``--force`` is given.
Each logged folder gets a fresh ``tracking.json`` with the run id. Exit status 0 when every folder was
logged (or skipped), 1 when any failed (the message says which and why).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

if importlib.util.find_spec("harness") is None:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.tracking import DEFAULT_EXPERIMENT, default_tracking_uri, log_run_dir  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]


def _experiment_of(run_dir: Path) -> str:
    """``tracking.experiment`` from the run's config.yaml, else the default experiment."""
    import yaml

    try:
        config = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return DEFAULT_EXPERIMENT  # log_run_dir reports the unreadable file
    tracking = config.get("tracking") if isinstance(config, dict) else None
    name = tracking.get("experiment") if isinstance(tracking, dict) else None
    return str(name) if name else DEFAULT_EXPERIMENT


def _tracking_state(run_dir: Path) -> dict[str, Any]:
    try:
        state = json.loads((run_dir / "tracking.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def main(argv: list[str] | None = None) -> int:
    """Parse arguments and log each run folder; return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR", help="run folder(s) to log")
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (default: sqlite store in <repo>/runs)")
    parser.add_argument(
        "--experiment", help="experiment name (default: config tracking.experiment or kvgraft)"
    )
    parser.add_argument("--force", action="store_true", help="log again even if tracking.json has a run id")
    args = parser.parse_args(argv)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

    uri = args.tracking_uri or default_tracking_uri(REPO_ROOT / "runs")
    failures = 0
    for run_dir in args.run_dirs:
        if not (run_dir / "manifest.json").is_file():
            print(f"error: {run_dir}: not a run folder (no manifest.json)", file=sys.stderr)
            failures += 1
            continue
        state = _tracking_state(run_dir)
        if state.get("run_id") and state.get("tracking_uri") == uri and not args.force:
            print(f"skip {run_dir}: already logged as run {state['run_id']} in {uri} (use --force to re-log)")
            continue
        experiment = args.experiment or _experiment_of(run_dir)
        try:
            run_id = log_run_dir(run_dir, tracking_uri=uri, experiment=experiment)
        except Exception as exc:  # noqa: BLE001 - report every folder, then fail
            print(f"error: logging {run_dir} to {uri} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            failures += 1
            continue
        print(f"logged {run_dir} -> run {run_id} (experiment {experiment!r}, {uri})")
    if failures:
        print(f"{failures} of {len(args.run_dirs)} run folder(s) not logged", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
