"""Log finished run folders to MLflow after the fact (e.g. when tracking was unreachable during the run).

Run from the repository root::

    python scripts/log_run.py runs/baseline/2025-01-01_12-00-00_ab12cd [MORE_RUN_DIRS ...]
    python scripts/log_run.py RUN_DIR --tracking-uri sqlite:////abs/path/mlflow.db --experiment kvgraft-aime
    python scripts/log_run.py runs/compare/2025-01-01_12-00-00-000000     # a comparison (and its runs not yet logged)

A compare folder (comparison.json) is logged as the compare job logs it when MLflow is up: each run it lists
(found by its run_links, wherever the folders were moved) that is not yet in the store first, then the comparison
as their parent run; its ``tracking.json`` then names that run.

Defaults: the tracking URI is the project store ``sqlite:////<repo>/runs/mlflow.db``; the experiment is
the run's ``tracking.experiment`` from its ``config.yaml``, else ``harness.config.schema.DEFAULT_EXPERIMENT``. A folder
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

from harness.config.schema import DEFAULT_EXPERIMENT
from harness.errors import HarnessError
from harness.record.folder import RunFolder
from harness.tracking.log import log_run_dir
from harness.tracking.store import default_tracking_uri

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


def _log_folder(folder: RunFolder, uri: str, experiment: str | None, force: bool) -> str | None:
    """Log one complete run folder unless this store has it already; its run id either way (None: failed)."""
    state = folder.read_tracking()
    if state.get("run_id") and state.get("tracking_uri") == uri and not force:
        print(f"skip {folder.path}: already logged as run {state['run_id']} in {uri} (use --force to re-log)")
        return str(state["run_id"])
    experiment = experiment or _experiment_of(folder)
    try:
        run_id = log_run_dir(folder.path, tracking_uri=uri, experiment=experiment)
    except Exception as exc:  # noqa: BLE001 - report every folder, then fail
        print(f"error: logging {folder.path} to {uri} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None
    print(f"logged {folder.path} -> run {run_id} (experiment {experiment!r}, {uri})")
    return run_id


def _log_comparison_folder(path: Path, uri: str, experiment: str | None, force: bool) -> bool:
    """Log a compare folder: the runs it lists (each where its run_links finds it) not yet in this store, then the
    comparison as their parent run. False when any of it failed (the message says which and why)."""
    import dataclasses

    from harness.compare.audit import locate_runs
    from harness.compare.comparison import Comparison
    from harness.compare.mlflow_runs import log_comparison

    compare = RunFolder(path)
    state = compare.read_tracking()
    if state.get("run_id") and state.get("tracking_uri") == uri and not force:
        print(f"skip {path}: comparison already logged as run {state['run_id']} in {uri} (use --force to re-log)")
        return True
    try:
        raw = compare.read_json("comparison.json")
        comp = Comparison.from_json(raw)
    except (OSError, ValueError, KeyError, TypeError, HarnessError) as exc:
        print(f"error: {path / 'comparison.json'}: unreadable ({type(exc).__name__}: {exc}); re-run the compare job",
              file=sys.stderr)
        return False
    located = {label: RunFolder(p) for label, (p, _) in locate_runs(path, raw).items()}
    missing = [f"{label} ({f.path})" for label, f in located.items() if not f.is_complete()]
    if missing:
        print(f"error: {path}: compared run(s) not found or incomplete: {', '.join(missing)}; keep the run folders "
              "beside runs/compare (make rescore RUN=... says which)", file=sys.stderr)
        return False
    base = located.get(next(iter(comp.runs), ""), None)
    experiment = experiment or (_experiment_of(base) if base is not None else DEFAULT_EXPERIMENT)
    run_ids = {}
    for label, folder in located.items():
        run_id = _log_folder(folder, uri, experiment, force=False)
        if run_id is None:
            return False
        run_ids[label] = run_id
    comp = dataclasses.replace(comp, runs={label: str(f.path) for label, f in located.items()})
    try:
        run_id = log_comparison(path / "comparison.json", comp, tracking_uri=uri, experiment=experiment,
                                run_ids=run_ids)
    except Exception as exc:  # noqa: BLE001 - one line, then fail
        print(f"error: logging the comparison {path} to {uri} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return False
    compare.write_tracking({"run_id": run_id, "tracking_uri": uri})
    print(f"logged {path} -> comparison run {run_id} over {len(run_ids)} runs (experiment {experiment!r}, {uri})")
    return True


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
        if (run_dir / "comparison.json").is_file():
            failures += not _log_comparison_folder(run_dir, uri, args.experiment, args.force)
            continue
        folder = RunFolder(run_dir)
        if not folder.is_complete():
            print(f"error: {run_dir}: not a run folder (no manifest.json) nor a compare folder (no comparison.json)",
                  file=sys.stderr)
            failures += 1
            continue
        failures += _log_folder(folder, uri, args.experiment, args.force) is None
    if failures:
        print(f"{failures} of {len(args.run_dirs)} run folder(s) not logged", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
