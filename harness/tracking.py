"""Experiment tracking: log a finished run folder to MLflow, or record why it is pending.

The run folder (``harness/RUN_FORMAT.md``) is the record; MLflow is an index over it. :func:`log_run_dir`
reads ``config.yaml``, ``summary.json`` and ``manifest.json`` and logs

- params: the flattened resolved config (``decoding.max_new_tokens`` ...),
- metrics: every numeric leaf of the summary (``scores.accuracy``, ``tokens.decode``,
  ``groups.recurring.accuracy``, ``comparison.token_reduction``; ``pass@1`` becomes ``pass_at_1``
  because MLflow names may not contain ``@``),
- tags: condition, model/tokenizer fingerprints, git commit, manifest SHA-256, run folder,
- artifacts: every file of the folder,

then writes ``tracking.json`` (``{"tracking_uri", "experiment", "run_id"}``) into the folder.
:func:`try_log_run_dir` never raises: on failure it warns and writes ``tracking.json`` with
``{"pending": true, "reason", "tracking_uri", "experiment"}``; log such runs later with
``python scripts/log_run.py RUN_DIR``.

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

from harness.errors import TrackingError
from harness.hashing import write_json

if TYPE_CHECKING:
    from mlflow import MlflowClient

__all__ = [
    "DEFAULT_EXPERIMENT",
    "MAX_PARAM_VALUE_LENGTH",
    "default_tracking_uri",
    "flatten",
    "log_run_dir",
    "metric_leaves",
    "try_log_run_dir",
]

DEFAULT_EXPERIMENT = "kvgraft"
MAX_PARAM_VALUE_LENGTH = 6000  # mlflow.utils.validation.MAX_PARAM_VAL_LENGTH
_MAX_PARAMS_PER_BATCH = 100  # mlflow.utils.validation.MAX_PARAMS_TAGS_PER_BATCH
_MAX_METRICS_PER_BATCH = 1000  # mlflow.utils.validation.MAX_METRICS_PER_BATCH
_LOCK_RETRIES = 8
_INVALID_NAME_CHARS = re.compile(r"[^/\w.\- ]")  # MLflow's portable name alphabet (no ':' on Windows)
_TRACKING_FILE = "tracking.json"

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


def _read_run_files(run_dir: Path) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    import yaml

    def load(name: str, parse: Callable[[str], Any]) -> dict[str, Any]:
        path = run_dir / name
        try:
            obj = parse(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise TrackingError(f"{path}: missing; log_run_dir needs a complete run folder") from None
        except (OSError, ValueError, yaml.YAMLError) as exc:
            raise TrackingError(f"{path}: cannot read or parse it ({exc})") from exc
        if obj is None and name == "config.yaml":
            return {}
        if not isinstance(obj, dict):
            raise TrackingError(f"{path}: expected a mapping at the top level, found {type(obj).__name__}")
        return obj

    return (
        load("config.yaml", yaml.safe_load),
        load("summary.json", json.loads),
        load("manifest.json", json.loads),
    )


def _tags(
    run_dir: Path, config: dict[str, Any], summary: dict[str, Any], manifest: dict[str, Any]
) -> dict[str, str]:
    inputs = manifest.get("inputs") or {}
    code = inputs.get("code") or {}
    condition = summary.get("condition")
    if condition is None and isinstance(config.get("condition"), dict):
        condition = config["condition"].get("name")
    energy = summary.get("energy") or {}
    tags = {
        "condition": condition,
        "model": summary.get("model"),
        "dataset": summary.get("dataset"),
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
        if not path.is_file() or rel.as_posix() == _TRACKING_FILE:
            continue
        if path.name.startswith(".") and path.name.endswith(".tmp"):
            continue
        files.append(path)
    return files


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
    run_dir = Path(run_dir).resolve()
    config, summary, manifest = _read_run_files(run_dir)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param

    with _store_init_lock(tracking_uri):
        client = MlflowClient(tracking_uri=tracking_uri)
        experiment_id = _get_or_create_experiment(client, tracking_uri, experiment)
    tags = _tags(run_dir, config, summary, manifest)
    tags.update({k: _scalar_text(v) for k, v in (extra_tags or {}).items() if v is not None})
    name = run_name or run_dir.name
    run = _retry(lambda: client.create_run(experiment_id, run_name=name, tags=tags), "create run")
    run_id = run.info.run_id
    try:
        now_ms = int(time.time() * 1000)
        params = [Param(_mlflow_name(k), v) for k, v in flatten(config).items()]
        metrics = [Metric(k, v, now_ms, 0) for k, v in metric_leaves(summary)]
        for chunk in _chunks(params, _MAX_PARAMS_PER_BATCH):
            _retry(lambda chunk=chunk: client.log_batch(run_id, params=chunk), "log params")
        for chunk in _chunks(metrics, _MAX_METRICS_PER_BATCH):
            _retry(lambda chunk=chunk: client.log_batch(run_id, metrics=chunk), "log metrics")
        for path in _artifact_files(run_dir):
            parent = path.relative_to(run_dir).parent.as_posix()
            client.log_artifact(run_id, str(path), artifact_path=None if parent == "." else parent)
        _retry(lambda: client.set_terminated(run_id, "FINISHED"), "finish run")
    except BaseException:
        with contextlib.suppress(Exception):  # keep the original error
            client.set_terminated(run_id, "FAILED")
        raise
    write_json(
        run_dir / _TRACKING_FILE, {"tracking_uri": tracking_uri, "experiment": experiment, "run_id": run_id}
    )
    return run_id


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
            write_json(Path(run_dir) / _TRACKING_FILE, pending)
        except OSError as write_exc:
            reason += f" (and writing {_TRACKING_FILE} failed: {write_exc})"
        warnings.warn(
            f"MLflow logging of {run_dir} to {tracking_uri} failed ({reason}); the run folder is complete: "
            f"log it later with `python scripts/log_run.py {run_dir}`",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
