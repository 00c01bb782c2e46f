"""Experiment tracking: log a finished run folder to MLflow, or record why it is pending.

The run folder (``harness/RUN_FORMAT.md``) is the record; MLflow is an index over it. :func:`log_run_dir`
reads the config, summary and manifest through ``harness.run_folder.RunFolder`` and logs

- params: the flattened resolved config (``decoding.max_new_tokens`` ...),
- metrics: every numeric leaf of the summary (``scores.accuracy``, ``tokens.decode``,
  ``groups.recurring.accuracy``; ``pass@1`` becomes ``pass_at_1`` because MLflow names may not contain ``@``),
- tags: condition, model/tokenizer fingerprints, git commit, manifest SHA-256, run folder,
- artifacts: every file of the folder,

then writes ``tracking.json`` (``{"tracking_uri", "experiment", "run_id"}``) into the folder.
:func:`try_log_run_dir` never raises: on failure it warns and writes ``tracking.json`` with
``{"pending": true, "reason", "tracking_uri", "experiment"}``; log such runs later with
``python scripts/log_run.py RUN_DIR``. :func:`log_comparison` logs the compare job's ``comparison.json``
(``harness.compare``) as a run of its own, its figures as metrics (``graft_recurring.comparison.token_reduction``).

Pitfalls handled (``DESIGN.md``): the store is an absolute ``sqlite:////abs/path/runs/mlflow.db`` URI
(the ``./mlruns`` file store is deprecated) with artifacts next to it in ``mlartifacts/``; the experiment
is get-or-created once and every write is retried on SQLite's "database is locked" (parallel Hydra
jobs). ``mlflow`` is imported lazily because importing it takes seconds.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import re
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import unquote, urlparse

from harness.errors import RunFolderError, TrackingError
from harness.run_folder import TRACKING, RunFolder

if TYPE_CHECKING:
    from mlflow import MlflowClient

    from harness.record import Summary

__all__ = [
    "DEFAULT_EXPERIMENT",
    "MAX_PARAM_VALUE_LENGTH",
    "default_tracking_uri",
    "flatten",
    "log_comparison",
    "log_run_dir",
    "metric_leaves",
    "try_log_run_dir",
]

DEFAULT_EXPERIMENT = "kvgraft-aime"  # the one default experiment name (config, log_run)
MAX_PARAM_VALUE_LENGTH = 6000  # mlflow.utils.validation.MAX_PARAM_VAL_LENGTH
_MAX_PARAMS_PER_BATCH = 100  # mlflow.utils.validation.MAX_PARAMS_TAGS_PER_BATCH
_MAX_METRICS_PER_BATCH = 1000  # mlflow.utils.validation.MAX_METRICS_PER_BATCH
_LOCK_RETRIES = 8
_INVALID_NAME_CHARS = re.compile(r"[^/\w.\- ]")  # MLflow's portable name alphabet (no ':' on Windows)

T = TypeVar("T")


def default_tracking_uri(runs_root: Path) -> str:
    """Absolute SQLite URI of the store under ``runs_root``: ``sqlite:////abs/path/runs/mlflow.db``."""
    return f"sqlite:///{(Path(runs_root).resolve() / 'mlflow.db').as_posix()}"


def _scalar_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Flatten nested dicts into ``{"a.b.c": "value"}`` with string values (MLflow params).

    Lists and non-string scalars are JSON-encoded (``null``, ``true``, ``[1,2]``); an empty dict becomes
    ``"{}"``. Values are truncated to MLflow's param limit of 6000 characters.
    """
    out: dict[str, str] = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, prefix=f"{name}."))
        else:
            out[name] = _scalar_text(value)[:MAX_PARAM_VALUE_LENGTH]
    return out


def _mlflow_name(name: str) -> str:
    """A key MLflow accepts: ``@`` -> ``_at_``, other characters outside ``[/\\w.\\- ]`` -> ``_``."""
    return _INVALID_NAME_CHARS.sub("_", name.replace("@", "_at_"))


def metric_leaves(d: Any, prefix: str = "") -> Iterator[tuple[str, float]]:
    """Every finite numeric leaf of ``d`` as ``(dotted name, value)``; bools, None and strings skipped.

    List items are named by index (``a.0``). Names are made MLflow-safe (``pass@1`` -> ``pass_at_1``).
    """
    if isinstance(d, dict):
        items: Any = d.items()
    elif isinstance(d, list):
        items = enumerate(d)
    else:
        return
    for key, value in items:
        name = f"{prefix}{key}"
        if isinstance(value, (dict, list)):
            yield from metric_leaves(value, prefix=f"{name}.")
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            yield _mlflow_name(name), float(value)


def _is_locked(exc: BaseException) -> bool:
    text = f"{exc} {exc.__cause__ or ''}".lower()
    return "database is locked" in text or "database table is locked" in text


def _retry(fn: Callable[[], T], what: str) -> T:
    """Call ``fn``, retrying SQLite "database is locked" errors with jittered exponential backoff."""
    for attempt in range(_LOCK_RETRIES):
        try:
            return fn()
        except Exception as exc:
            if not _is_locked(exc) or attempt == _LOCK_RETRIES - 1:
                raise
            time.sleep(0.05 * 2**attempt + random.uniform(0, 0.05 * 2**attempt))
    raise AssertionError(f"unreachable: {what}")


def _sqlite_path(tracking_uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI, or None for other stores (and in-memory SQLite)."""
    if not tracking_uri.startswith("sqlite:"):
        return None
    db_path = unquote(urlparse(tracking_uri).path)
    if not db_path or db_path == "/:memory:":
        return None
    return Path(db_path)


def _artifact_location(tracking_uri: str, experiment: str) -> str | None:
    """For a local SQLite store, ``<db folder>/mlartifacts/<experiment>`` (else MLflow's default).

    Without this MLflow puts artifacts in ``./mlruns`` relative to whatever the working directory is.
    """
    db_path = _sqlite_path(tracking_uri)
    if db_path is None:
        return None
    return (db_path.parent / "mlartifacts" / _mlflow_name(experiment)).resolve().as_uri()


@contextlib.contextmanager
def _store_init_lock(tracking_uri: str) -> Iterator[None]:
    """Serialise opening a local SQLite store across processes (``<db>.lock``, ``flock``).

    MLflow creates and migrates the schema on first open; two jobs doing that at once fail with
    "duplicate column name" errors that no retry fixes. Other stores need no lock.
    """
    db_path = _sqlite_path(tracking_uri)
    if db_path is None:
        yield
        return
    db_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # Windows: no flock; parallel first-time creation is then the caller's risk
        yield
        return
    with open(db_path.with_name(db_path.name + ".lock"), "a+b") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def _get_or_create_experiment(client: MlflowClient, tracking_uri: str, name: str) -> str:
    from mlflow.exceptions import MlflowException

    found = _retry(lambda: client.get_experiment_by_name(name), "get experiment")
    if found is not None:
        if found.lifecycle_stage == "deleted":
            raise TrackingError(
                f"MLflow experiment {name!r} is deleted in {tracking_uri}; restore it "
                "(mlflow experiments restore) or choose another tracking.experiment"
            )
        return found.experiment_id
    try:
        location = _artifact_location(tracking_uri, name)
        return _retry(lambda: client.create_experiment(name, artifact_location=location), "create experiment")
    except MlflowException:
        # Another job created it between our lookup and create (RESOURCE_ALREADY_EXISTS).
        found = _retry(lambda: client.get_experiment_by_name(name), "get experiment")
        if found is None:
            raise
        return found.experiment_id


def _tags(run_dir: Path, summary: Summary, manifest: dict[str, Any]) -> dict[str, str]:
    inputs = manifest.get("inputs") or {}
    code = inputs.get("code") or {}
    energy = summary.energy
    tags = {
        "condition": summary.condition,
        "model": summary.model,
        "dataset": summary.dataset,
        "model_fingerprint": inputs.get("model_fingerprint"),
        "tokenizer_fingerprint": inputs.get("tokenizer_fingerprint"),
        "git_commit": code.get("commit"),
        "git_dirty": code.get("dirty"),
        "mlflow.source.git.commit": code.get("commit"),
        "manifest_sha256": manifest.get("manifest_sha256"),
        "energy_status": energy.get("status") if isinstance(energy, dict) else None,
        "run_dir": str(run_dir),
    }
    return {k: _scalar_text(v) for k, v in tags.items() if v is not None}


def _chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


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


def _log(
    tracking_uri: str,
    experiment: str,
    run_name: str,
    *,
    tags: dict[str, str],
    params: dict[str, str],
    metrics: Any,
    files: list[tuple[Path, str | None]],
) -> str:
    """Create one finished MLflow run with these tags, params, metrics and files; return its id."""
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param

    with _store_init_lock(tracking_uri):
        client = MlflowClient(tracking_uri=tracking_uri)
        experiment_id = _get_or_create_experiment(client, tracking_uri, experiment)
    run = _retry(lambda: client.create_run(experiment_id, run_name=run_name, tags=tags), "create run")
    run_id = run.info.run_id
    try:
        now_ms = int(time.time() * 1000)
        params_ = [Param(_mlflow_name(k), v) for k, v in params.items()]
        metrics_ = [Metric(k, v, now_ms, 0) for k, v in metric_leaves(metrics)]
        for chunk in _chunks(params_, _MAX_PARAMS_PER_BATCH):
            _retry(lambda chunk=chunk: client.log_batch(run_id, params=chunk), "log params")
        for chunk in _chunks(metrics_, _MAX_METRICS_PER_BATCH):
            _retry(lambda chunk=chunk: client.log_batch(run_id, metrics=chunk), "log metrics")
        for path, parent in files:
            client.log_artifact(run_id, str(path), artifact_path=parent)
        _retry(lambda: client.set_terminated(run_id, "FINISHED"), "finish run")
    except BaseException:
        with contextlib.suppress(Exception):  # keep the original error
            client.set_terminated(run_id, "FAILED")
        raise
    return run_id


def log_run_dir(
    run_dir: Path,
    *,
    tracking_uri: str,
    experiment: str,
    run_name: str | None = None,
    extra_tags: dict[str, Any] | None = None,
) -> str:
    """Log a complete run folder to MLflow, write ``tracking.json`` into it, and return the run id.

    Raises :class:`TrackingError` when a run file is missing or unreadable; MLflow/connection errors
    propagate (use :func:`try_log_run_dir` when a failure must not stop the caller).
    """
    folder = RunFolder(Path(run_dir).resolve())
    try:
        config, summary, manifest = folder.read_config(), folder.read_summary(), folder.read_manifest()
    except RunFolderError as exc:
        raise TrackingError(f"{exc} (log_run_dir needs a complete run folder)") from exc
    tags = _tags(folder.path, summary, manifest)
    tags.update({k: _scalar_text(v) for k, v in (extra_tags or {}).items() if v is not None})
    files = [(p, None if p.parent == folder.path else p.parent.relative_to(folder.path).as_posix())
             for p in _artifact_files(folder.path)]  # fmt: skip
    run_id = _log(tracking_uri, experiment, run_name or folder.name, tags=tags, params=flatten(config),
                  metrics=summary.to_json(), files=files)  # fmt: skip
    folder.write_tracking({"tracking_uri": tracking_uri, "experiment": experiment, "run_id": run_id})
    return run_id


def log_comparison(path: Path, comparison: dict[str, Any], *, tracking_uri: str, experiment: str) -> str:
    """Log the compare job's comparison (written at `path`) as an MLflow run named after its folder:
    metrics are its numeric leaves, tags its comparable key and the runs it compares; returns the run id."""
    tags = {"job": "compare", "comparable_key": comparison.get("comparable_key"),
            **{f"run.{_slug(k)}": v for k, v in (comparison.get("runs") or {}).items()}}  # fmt: skip
    metrics = {_slug(label): figures for label, figures in (comparison.get("summaries") or {}).items()}
    return _log(tracking_uri, experiment, f"compare-{Path(path).parent.name}",
                tags={k: _scalar_text(v) for k, v in tags.items() if v is not None}, params={},
                metrics=metrics, files=[(Path(path), None)])  # fmt: skip


def _slug(label: str) -> str:
    """A run label as a metric prefix: "graft (held-out)" -> "graft_held_out"."""
    return re.sub(r"\W+", "_", label).strip("_")


def try_log_run_dir(
    run_dir: Path,
    *,
    tracking_uri: str,
    experiment: str,
    run_name: str | None = None,
    extra_tags: dict[str, Any] | None = None,
) -> str | None:
    """Like :func:`log_run_dir`, but on any failure warn, write a pending ``tracking.json`` and return None.

    The run folder stays complete; log it later with ``python scripts/log_run.py RUN_DIR``.
    """
    try:
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
            f"log it later with `python scripts/log_run.py {run_dir}`",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
