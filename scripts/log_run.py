"""Log finished run folders to MLflow after the fact (e.g. when tracking was unreachable during the run).

Run from the repository root::

    python -m scripts.log_run runs/baseline/2025-01-01_12-00-00_ab12cd [MORE_RUN_DIRS ...]
    python -m scripts.log_run RUN_DIR --tracking-uri sqlite:////abs/path/mlflow.db --experiment kvgraft-aime
    python -m scripts.log_run runs/compare/2025-01-01_12-00-00-000000     # a comparison (and its runs not yet logged)

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
from harness.errors import HarnessError, plain
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
        print(plain(f"skip {folder.path}: already logged as run {state['run_id']} in {uri} (use --force to re-log)"))
        return str(state["run_id"])
    experiment = experiment or _experiment_of(folder)
    try:
        run_id = log_run_dir(folder.path, tracking_uri=uri, experiment=experiment)
    except Exception as exc:  # noqa: BLE001 - report every folder, then fail
        print(plain(f"error: logging {folder.path} to {uri} failed: {type(exc).__name__}: {exc}"), file=sys.stderr)
        return None
    print(plain(f"logged {folder.path} -> run {run_id} (experiment {experiment!r}, {uri})"))
    return run_id


def _entries(comp, runs: dict) -> dict[str, dict[str, str]]:
    """entry_id -> {problem_id, answer} of the library the compared runs grafted from, for the per-problem table: read
    through harness.library's Library (its hashes checked) from the folder comparison.json names, and only when it is
    the library the runs' manifests record (a library edited and re-sealed since is another); else none (the table
    then names each entry by its id, without an answer)."""
    from harness.library.build import Library

    recorded = {((r.manifest.get("inputs") or {}).get("library") or {}).get("manifest_sha256") for r in runs.values()}
    recorded.discard(None)
    path = comp.library.path if comp.library is not None else None
    if len(recorded) != 1 or not path:
        return {}
    try:
        lib = Library(Path(path), None)  # type: ignore[arg-type]  (entries only: no store)
    except HarnessError:
        return {}
    if lib.manifest.get("manifest_sha256") not in recorded:
        return {}
    return {e.entry_id: {"problem_id": e.problem_id, "answer": str(e.answer)} for e in lib.entries}


def _log_comparison_folder(path: Path, uri: str, experiment: str | None, force: bool) -> bool:
    """Log a compare folder: the runs it lists (each where its run_links finds it) not yet in this store, then the
    comparison as their parent run. Nothing is logged unless the whole re-checks first (the audit behind `make
    rescore RUN=<compare folder>`: every run, their binding to comparison.json, every figure recomputed); the
    per-problem table is recomputed from the re-checked rows, not read from per_problem.json. False when any of it
    failed (the message says which and why)."""
    import dataclasses

    from harness.compare import per_problem as pp
    from harness.compare.audit import audited_comparison
    from harness.compare.comparison import Comparison
    from harness.compare.mlflow_runs import log_comparison

    compare = RunFolder(path)
    state = compare.read_tracking()
    if state.get("run_id") and state.get("tracking_uri") == uri and not force:
        print(plain(f"skip {path}: comparison already logged as run {state['run_id']} in {uri} (use --force to "
                    "re-log)"))
        return True
    try:
        checked = audited_comparison(path, "log-run")
        comp = Comparison.from_json(checked.raw)
    except (ValueError, KeyError, TypeError, HarnessError) as exc:
        print(plain(f"error: {exc}; nothing of it is logged"), file=sys.stderr)
        return False
    located = {label: run.folder for label, run in checked.runs.items()}
    base = located.get(next(iter(comp.runs), ""), None)
    experiment = experiment or (_experiment_of(base) if base is not None else DEFAULT_EXPERIMENT)
    run_ids = {}
    for label, folder in located.items():
        run_id = _log_folder(folder, uri, experiment, force=False)
        if run_id is None:
            return False
        run_ids[label] = run_id
    comp = dataclasses.replace(comp, runs={label: str(f.path) for label, f in located.items()})
    table = pp.per_problem({label: run.rows for label, run in checked.runs.items()}, _entries(comp, checked.runs),
                           comp.plan)
    try:
        run_id = log_comparison(path / "comparison.json", comp, tracking_uri=uri, experiment=experiment,
                                run_ids=run_ids, records=checked.runs, per_problem=table)
    except Exception as exc:  # noqa: BLE001 - one line, then fail
        print(plain(f"error: logging the comparison {path} to {uri} failed: {type(exc).__name__}: {exc}"),
              file=sys.stderr)
        return False
    compare.write_tracking({"run_id": run_id, "tracking_uri": uri})
    print(plain(f"logged {path} -> comparison run {run_id} over {len(run_ids)} runs (experiment {experiment!r}, "
                f"{uri})"))
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
            print(plain(f"error: {run_dir}: not a run folder (no manifest.json) nor a compare folder (no "
                        "comparison.json)"), file=sys.stderr)
            failures += 1
            continue
        failures += _log_folder(folder, uri, args.experiment, args.force) is None
    if failures:
        print(f"{failures} of {len(args.run_dirs)} run folder(s) not logged", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
