"""Log finished run folders to MLflow after the fact (e.g. when tracking was unreachable during the run).

Run from the repository root::

    python scripts/log_run.py runs/baseline/2025-01-01_12-00-00_ab12cd [MORE_RUN_DIRS ...]
    python scripts/log_run.py RUN_DIR --tracking-uri sqlite:////abs/path/mlflow.db --experiment kvgraft-aime

Defaults: the tracking URI is the project store ``sqlite:////<repo>/runs/mlflow.db``; the experiment is
the run's ``tracking.experiment`` from its ``config.yaml``, else ``harness.tracking.store.DEFAULT_EXPERIMENT``. A folder
whose
``tracking.json`` already names a run id in the same store is skipped unless ``--force`` is given.
Each logged folder gets a fresh ``tracking.json`` with the run id. Exit status 0 when every folder was
logged (or skipped), 1 when any failed (the message says which and why).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from harness.errors import HarnessError
from harness.record.folder import RunFolder
from harness.tracking.log import log_run_dir
from harness.tracking.store import DEFAULT_EXPERIMENT, default_tracking_uri

REPO_ROOT = Path(__file__).resolve().parents[1]


def _experiment_of(folder: RunFolder) -> str:
    """``tracking.experiment`` from the run's config.yaml, else the default experiment."""
    try:
        config = folder.read_config()
    except HarnessError:
        return DEFAULT_EXPERIMENT  # log_run_dir reports the unreadable file
    tracking = config.get("tracking")
    name = tracking.get("experiment") if isinstance(tracking, dict) else None
    return str(name) if name else DEFAULT_EXPERIMENT


def main(argv: list[str] | None = None) -> int:
    """Parse arguments and log each run folder; return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR", help="run folder(s) to log")
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (default: sqlite store in <repo>/runs)")
    parser.add_argument(
        "--experiment", help=f"experiment name (default: config tracking.experiment or {DEFAULT_EXPERIMENT})"
    )
    parser.add_argument("--force", action="store_true", help="log again even if tracking.json has a run id")
    args = parser.parse_args(argv)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

    uri = args.tracking_uri or default_tracking_uri(REPO_ROOT / "runs")
    failures = 0
    for run_dir in args.run_dirs:
        folder = RunFolder(run_dir)
        if not folder.is_complete():
            print(f"error: {run_dir}: not a run folder (no manifest.json)", file=sys.stderr)
            failures += 1
            continue
        state = folder.read_tracking()
        if state.get("run_id") and state.get("tracking_uri") == uri and not args.force:
            print(f"skip {run_dir}: already logged as run {state['run_id']} in {uri} (use --force to re-log)")
            continue
        experiment = args.experiment or _experiment_of(folder)
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
