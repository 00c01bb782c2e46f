"""Experiment tracking: log a finished run folder to MLflow, or record why it is pending.

The run folder (``harness/RUN_FORMAT.md``) is the record; MLflow is an index over it, laid out with MLflow 3's
own concepts so its UI shows the work. :func:`log_run_dir` reads the folder through
``harness.record.folder.RunFolder`` and logs one run:

- name ``<condition> [recurring|held-out] | <dataset> | <model> | <folder>``, the real start and end time
  (``summary.json`` ``started_at``/``finished_at``; older folders: summary.json's mtime minus ``run_wall_s``),
  a description (``mlflow.note.content``) and tags condition, group, model, dataset, library, comparable_key,
  fingerprints, git commit, manifest SHA-256, run folder;
- params: the flattened resolved config (``decoding.max_new_tokens`` ...); metrics: every numeric leaf of the
  summary (``scores.accuracy``, ``groups.recurring.accuracy``; ``pass@1`` becomes ``pass_at_1``);
- the problem set as a dataset input (:func:`dataset_digest` of the manifest's problem hashes, source the
  file or hub id), so the runs table's Datasets column and filter work;
- the per-problem outputs as an MLflow table, ``outputs_table.json`` (:func:`outputs_table`);
- every file of the folder as artifacts, and (``tracking.traces``, default on) one trace per attempt with
  its score as feedback (``harness.tracking.tracing``);

then writes ``tracking.json`` (``{"tracking_uri", "experiment", "run_id"}``) into the folder.
:func:`try_log_run_dir` never raises: on failure it warns and writes ``tracking.json`` with
``{"pending": true, "reason", "tracking_uri", "experiment"}``; log such runs later with
``python -m scripts.log_run RUN_DIR``. harness/compare/mlflow_runs.py logs the compare job as
the parent run of the runs it compares. The experiment is tagged ``mlflow.experimentKind =
custom_model_development``, so the UI opens on its runs rather than on the GenAI trace overview.

Pitfalls handled in harness/tracking/store.py (``DESIGN.md``): the store is an absolute
``sqlite:////abs/path/runs/mlflow.db`` URI (the ``./mlruns`` file store is deprecated) with artifacts next to it in
``mlartifacts/``; the experiment is get-or-created once and every write is retried on SQLite's "database is locked"
(parallel Hydra jobs). An ``http(s)`` URI fails fast: the server's port is probed first and MLflow's HTTP retries
and timeout are bounded (``tracking.http_retries``, ``tracking.http_timeout_s``; MLflow's defaults wait ~250 s on a
dead port). ``mlflow`` is imported lazily because importing it takes seconds.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.errors import RunFolderError, TrackingError
from harness.record.folder import TRACKING, FinishedRun, RunFolder
from harness.record.rows import budget_of
from harness.tracking import views as run_view
from harness.tracking.mlflow_run import log_finished_run as _log
from harness.tracking.store import (
    flatten,
    http_fail_fast,
    scalar_text,
)

if TYPE_CHECKING:
    from mlflow import MlflowClient

__all__ = [
    "log_run",
    "log_run_dir",
    "try_log_run_dir",
]
def _artifact_files(run_dir: Path) -> list[Path]:
    """Every regular file of the folder except tracking.json and in-flight atomic-write temp files."""
    files = []
    for path in sorted(run_dir.rglob("*")):
        rel = path.relative_to(run_dir)
        if not path.is_file() or rel.as_posix() == TRACKING:
            continue
        if path.name.startswith(".") and path.name.endswith(".tmp"):
            continue
        files.append(path)
    return files


def _tracking_settings(config: dict[str, Any]) -> dict[str, Any]:
    t = config.get("tracking") if isinstance(config.get("tracking"), dict) else {}
    return {"traces": bool(t.get("traces", True)), "retries": int(t.get("http_retries", 2)),
            "timeout_s": int(t.get("http_timeout_s", 10))}


def log_run_dir(run_dir: Path, **options: Any) -> str:
    """Log a complete run folder to MLflow (module docstring), write ``tracking.json`` into it, return the run id.
    `options` are `log_run`'s keywords: tracking_uri, experiment (required), run_name, extra_tags, traces.

    `traces` defaults to the run's ``tracking.traces`` (on when absent). Raises :class:`TrackingError` when a
    run file is missing or unreadable, or an http(s) server is unreachable; other MLflow errors propagate
    (use :func:`try_log_run_dir` when a failure must not stop the caller), and when the folder does not re-check
    (harness.record.audit, as `make rescore`): an edited summary or row never reaches MLflow. A failure while
    logging traces only warns: the run is logged, tagged ``traces=failed: <reason>``.
    """
    from harness.record.audit import audited

    try:  # read back from disk only after it re-checks: no figure of an edited folder reaches MLflow (issues 41, 51)
        run = audited(Path(run_dir).resolve(), "MLflow logging")
    except RunFolderError as exc:
        raise TrackingError(f"{exc} (log_run_dir logs a complete run folder that re-checks; it is not logged)") from exc
    return log_run(run, **options)


def log_run(
    run: FinishedRun,
    *,
    tracking_uri: str,
    experiment: str,
    run_name: str | None = None,
    extra_tags: dict[str, Any] | None = None,
    traces: bool | None = None,
) -> str:
    """Log a finished run from its records (`RunFolder.finish`'s return; nothing is read back but the folder's
    file list for the artifacts), write ``tracking.json`` into its folder, return the run id (`log_run_dir`)."""
    folder = RunFolder(run.folder.path.resolve())
    config, summary, manifest, rows, problems = run.config, run.summary, run.manifest, run.rows, run.problems
    settings = _tracking_settings(config)
    group = run_view.run_group(summary, config)
    tags = run_view.run_tags(folder, summary, manifest, group, config)
    tags.update({k: scalar_text(v) for k, v in (extra_tags or {}).items() if v is not None})
    name = run_name or run_view.run_name(summary, group, folder, budget_of(config), config)
    files = [(p, None if p.parent == folder.path else p.parent.relative_to(folder.path).as_posix())
             for p in _artifact_files(folder.path)]
    times = run_view.run_times_ms(folder, summary)

    def log_traces(client: MlflowClient, experiment_id: str, run_id: str) -> None:
        from harness.tracking.tracing import log_traces

        try:
            log_traces(rows, tracking_uri=tracking_uri, experiment_id=experiment_id, run_id=run_id,
                       started_at=summary.started_at, fallback_start_s=times[0] / 1000,
                       tags={k: tags[k] for k in ("condition", "group", "model", "dataset") if k in tags})
        except Exception as exc:  # noqa: BLE001 - the run itself is logged; say what is missing
            client.set_tag(run_id, "traces", f"failed: {type(exc).__name__}: {exc}"[:500])
            warnings.warn(f"MLflow traces of {folder.path} not logged ({type(exc).__name__}: {exc})",
                          RuntimeWarning, stacklevel=2)

    with http_fail_fast(tracking_uri, retries=settings["retries"], timeout_s=settings["timeout_s"]):
        dataset = run_view.dataset_input(config, summary, manifest, problems)
        run_id = _log(tracking_uri, experiment, name, tags=tags, params=flatten(config),
                      metrics=run_view.headline_metrics(summary),
                      files=files, times_ms=times, datasets=[dataset], table=run_view.outputs_table(rows),
                      then=log_traces if (settings["traces"] if traces is None else traces) else None)
    folder.write_tracking({"tracking_uri": tracking_uri, "experiment": experiment, "run_id": run_id})
    return run_id


def try_log_run_dir(
    run_dir: Path | FinishedRun,
    *,
    tracking_uri: str,
    experiment: str,
    run_name: str | None = None,
    extra_tags: dict[str, Any] | None = None,
) -> str | None:
    """Like :func:`log_run_dir` (or :func:`log_run` for a FinishedRun's records), but on any failure warn, write
    a pending ``tracking.json`` and return None.

    The run folder stays complete; log it later with ``python -m scripts.log_run RUN_DIR``.
    """
    if isinstance(run_dir, FinishedRun):
        record, run_dir = run_dir, run_dir.folder.path
    else:
        record = None
    try:
        if record is not None:
            return log_run(record, tracking_uri=tracking_uri, experiment=experiment, run_name=run_name,
                           extra_tags=extra_tags)
        return log_run_dir(
            run_dir,
            tracking_uri=tracking_uri,
            experiment=experiment,
            run_name=run_name,
            extra_tags=extra_tags,
        )
    except Exception as exc:  # noqa: BLE001 - tracking must never lose a finished run
        reason = f"{type(exc).__name__}: {exc}".strip()
        if len(reason) > 2000:
            reason = reason[:2000] + " ..."
        pending = {"pending": True, "reason": reason, "tracking_uri": tracking_uri, "experiment": experiment}
        try:
            RunFolder(run_dir).write_tracking(pending)
        except OSError as write_exc:
            reason += f" (and writing {TRACKING} failed: {write_exc})"
        warnings.warn(
            f"MLflow logging of {run_dir} to {tracking_uri} failed ({reason}); the run folder is complete: "
            f"log it later with `python -m scripts.log_run {run_dir}`",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
