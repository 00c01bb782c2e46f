"""The MLflow store a run is logged to: its URI, the experiment (get-or-create, once), retries on SQLite's
"database is locked", and HTTP servers that fail fast. Used by harness/tracking.py; ``mlflow`` is imported
lazily because importing it takes seconds.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import re
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import unquote, urlparse

from harness.errors import TrackingError

if TYPE_CHECKING:
    from mlflow import MlflowClient

DEFAULT_EXPERIMENT = "kvgraft-aime"  # the one default experiment name (config, log_run)
EXPERIMENT_KIND = "custom_model_development"  # mlflow.experimentKind: the UI opens on runs, not the GenAI overview
_LOCK_RETRIES = 8
MAX_PARAM_VALUE_LENGTH = 6000  # mlflow.utils.validation.MAX_PARAM_VAL_LENGTH
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
    """The experiment's id (created with artifacts next to a SQLite store), tagged with EXPERIMENT_KIND unless
    it already carries a kind (a choice made in the UI is kept)."""
    from mlflow.exceptions import MlflowException

    found = _retry(lambda: client.get_experiment_by_name(name), "get experiment")
    if found is not None and found.lifecycle_stage == "deleted":
        raise TrackingError(
            f"MLflow experiment {name!r} is deleted in {tracking_uri}; restore it "
            "(mlflow experiments restore) or choose another tracking.experiment"
        )
    if found is None:
        try:
            location = _artifact_location(tracking_uri, name)
            # the kind tag is created with the experiment (one transaction): parallel jobs against a server that
            # all set it afterwards race on the experiment_tags key (IntegrityError, a 500 from the server)
            experiment_id = _retry(lambda: client.create_experiment(
                name, artifact_location=location, tags={"mlflow.experimentKind": EXPERIMENT_KIND}), "create")
            return experiment_id
        except MlflowException:
            # Another job created it between our lookup and create (RESOURCE_ALREADY_EXISTS).
            found = _retry(lambda: client.get_experiment_by_name(name), "get experiment")
            if found is None:
                raise
    if found is not None:
        experiment_id = found.experiment_id
        if "mlflow.experimentKind" in found.tags:
            return experiment_id
    try:
        _retry(lambda: client.set_experiment_tag(experiment_id, "mlflow.experimentKind", EXPERIMENT_KIND), "kind")
    except MlflowException:  # another job tagged it at the same moment: fine when the tag is there now
        if "mlflow.experimentKind" not in client.get_experiment(experiment_id).tags:
            raise
    return experiment_id


@contextlib.contextmanager
def http_fail_fast(tracking_uri: str, *, retries: int = 2, timeout_s: int = 10) -> Iterator[None]:
    """For an ``http(s)`` URI: probe the server's port (a dead one is a TrackingError in at most `timeout_s`),
    then bound MLflow's HTTP retries and per-request timeout for the duration. Variables the user set win.
    Other URIs pass through untouched."""
    parsed = urlparse(tracking_uri)
    if parsed.scheme not in ("http", "https"):
        yield
        return
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        socket.create_connection((parsed.hostname or "localhost", port), timeout=timeout_s).close()
    except OSError as exc:
        raise TrackingError(
            f"MLflow tracking server {tracking_uri} is not reachable ({exc.strerror or exc}); start it, or set "
            "tracking.uri to a reachable server (or tracking=off); the run folder is complete and can be logged "
            "later with `make log-run RUN=<run folder>`"
        ) from exc
    values = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": str(retries), "MLFLOW_HTTP_REQUEST_TIMEOUT": str(timeout_s),
              "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}  # fmt: skip
    unset = [k for k in values if k not in os.environ]
    for k in unset:
        os.environ[k] = values[k]
    try:
        yield
    finally:
        for k in unset:
            os.environ.pop(k, None)
