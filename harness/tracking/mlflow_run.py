"""One finished MLflow run, created in one call (`log_finished_run`): tags, params, metrics, dataset inputs, a
table and files, batched under MLflow's limits and retried on SQLite's "database is locked". Shared by
harness.tracking.log (one run folder) and harness.compare.mlflow_runs (the compare job, its library, a sweep report).
``mlflow`` is imported lazily because importing it takes seconds.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.tracking.store import (
    ensure_sqlite_store,
    get_or_create_experiment,
    metric_leaves,
    mlflow_name,
    retry_locked,
    store_init_lock,
)

if TYPE_CHECKING:
    import pandas as pd
    from mlflow import MlflowClient

__all__ = ["log_finished_run"]

_MAX_PARAMS_PER_BATCH = 100  # mlflow.utils.validation.MAX_PARAMS_TAGS_PER_BATCH
_MAX_METRICS_PER_BATCH = 1000  # mlflow.utils.validation.MAX_METRICS_PER_BATCH



def _chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def log_finished_run(
    tracking_uri: str,
    experiment: str,
    run_name: str,
    *,
    tags: dict[str, str],
    params: dict[str, str],
    metrics: Any,
    files: list[tuple[Path, str | None]],
    times_ms: tuple[int, int] | None = None,
    datasets: list[Any] | None = None,
    table: dict[str, list[Any]] | pd.DataFrame | None = None,
    table_file: str = "outputs_table.json",
    then: Callable[[MlflowClient, str, str], None] | None = None,
) -> str:
    """Create one finished MLflow run (start/end `times_ms`, default now) with these tags, params, metrics,
    dataset inputs, table and files; `then(client, experiment_id, run_id)` runs before it is marked finished.
    Returns the run id."""
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param

    start_ms, end_ms = times_ms or (int(time.time() * 1000),) * 2
    with store_init_lock(tracking_uri):
        ensure_sqlite_store(tracking_uri)  # never half-built: created in a temp file, a broken empty one rebuilt
        client = MlflowClient(tracking_uri=tracking_uri)
        experiment_id = get_or_create_experiment(client, tracking_uri, experiment)
    run = retry_locked(lambda: client.create_run(experiment_id, start_time=start_ms, tags=tags, run_name=run_name),
                 "create run")
    run_id = run.info.run_id
    try:
        params_ = [Param(mlflow_name(k), v) for k, v in params.items()]
        metrics_ = [Metric(k, v, end_ms, 0) for k, v in metric_leaves(metrics)]
        for chunk in _chunks(params_, _MAX_PARAMS_PER_BATCH):
            retry_locked(lambda chunk=chunk: client.log_batch(run_id, params=chunk), "log params")
        for chunk in _chunks(metrics_, _MAX_METRICS_PER_BATCH):
            retry_locked(lambda chunk=chunk: client.log_batch(run_id, metrics=chunk), "log metrics")
        if datasets:
            retry_locked(lambda: client.log_inputs(run_id, datasets=datasets), "log dataset input")
        if table is not None:
            retry_locked(lambda: client.log_table(run_id, table, table_file), "log table")
        for path, parent in files:
            client.log_artifact(run_id, str(path), artifact_path=parent)
        if then is not None:
            then(client, experiment_id, run_id)
        retry_locked(lambda: client.set_terminated(run_id, "FINISHED", end_time=end_ms), "finish run")
    except BaseException:
        with contextlib.suppress(Exception):  # keep the original error
            client.set_terminated(run_id, "FAILED", end_time=end_ms)
        raise
    return run_id


