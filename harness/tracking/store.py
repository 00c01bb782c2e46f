"""The MLflow store a run is logged to: its URI, the experiment (get-or-create, once), retries on SQLite's
"database is locked", and HTTP servers that fail fast. Used by harness/tracking/log.py; ``mlflow`` is imported
lazily because importing it takes seconds.

A local SQLite store is never left half-built (:func:`ensure_sqlite_store`): MLflow creates its schema in place,
table by table and migration by migration, so a crash or a full disk part-way leaves a database on which every
later open re-runs a migration and fails ("duplicate column name: step"). Here the schema is created in a temp file
next to it and renamed into place only when complete; a half-built database that holds no run (the only kind a
failed creation leaves) is moved aside to ``mlflow.db.incomplete-<time>`` and created again. A database holding
runs is never touched.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import re
import socket
import sqlite3
import time
import warnings
from collections.abc import Callable, Iterator
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import unquote, urlparse

from harness.errors import TrackingError
from kvstore import publish, temp_path

if TYPE_CHECKING:
    from mlflow import MlflowClient

EXPERIMENT_KIND = "custom_model_development"  # mlflow.experimentKind: the UI opens on runs, not the GenAI overview
_LOCK_RETRIES = 8
MAX_PARAM_VALUE_LENGTH = 6000  # mlflow.utils.validation.MAX_PARAM_VAL_LENGTH
_INVALID_NAME_CHARS = re.compile(r"[^/\w.\- ]")  # MLflow's portable name alphabet (no ':' on Windows)

T = TypeVar("T")


def default_tracking_uri(runs_root: Path) -> str:
    """Absolute SQLite URI of the store under ``runs_root``: ``sqlite:////abs/path/runs/mlflow.db``."""
    return f"sqlite:///{(Path(runs_root).resolve() / 'mlflow.db').as_posix()}"


def scalar_text(value: Any) -> str:
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
            out[name] = scalar_text(value)[:MAX_PARAM_VALUE_LENGTH]
    return out


def mlflow_name(name: str) -> str:
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
            yield mlflow_name(name), float(value)


def _is_locked(exc: BaseException) -> bool:
    """A transient failure of concurrent writers: SQLite's lock, or two jobs creating the same dataset row at once
    (MLflow's log_inputs checks for the dataset, then inserts it; the loser of that race gets a UNIQUE violation on
    datasets(experiment_id, name, digest) and, retried, finds the winner's row). Seen against `mlflow server` with
    6 parallel loggers (tests/harness/test_mlflow_server.py)."""
    text = f"{exc} {exc.__cause__ or ''}".lower()
    return ("database is locked" in text or "database table is locked" in text
            or "unique constraint failed: datasets." in text)


def retry_locked(fn: Callable[[], T], what: str) -> T:
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
    if not tracking_uri.startswith("sqlite:///"):  # sqlite:// alone is in-memory
        return None
    db_path = unquote(tracking_uri.removeprefix("sqlite:///").split("?", 1)[0])  # sqlite:////abs -> /abs, ///rel -> rel
    if not db_path or db_path == ":memory:":
        return None
    return Path(db_path)


def _artifact_location(tracking_uri: str, experiment: str) -> str | None:
    """For a local SQLite store, ``<db folder>/mlartifacts/<experiment>`` (else MLflow's default).

    Without this MLflow puts artifacts in ``./mlruns`` relative to whatever the working directory is.
    """
    db_path = _sqlite_path(tracking_uri)
    if db_path is None:
        return None
    return (db_path.parent / "mlartifacts" / mlflow_name(experiment)).resolve().as_uri()


@contextlib.contextmanager
def store_init_lock(tracking_uri: str) -> Iterator[None]:
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


_SQLITE_SIDE_FILES = ("", "-journal", "-wal", "-shm")


def _remove_db(path: Path) -> None:
    for suffix in _SQLITE_SIDE_FILES:
        Path(f"{path}{suffix}").unlink(missing_ok=True)


@cache
def _head_revision() -> str:
    """The schema revision this MLflow creates: the single head of its alembic migrations (public alembic API)."""
    from alembic.script import ScriptDirectory
    from mlflow.store import db_migrations

    heads = ScriptDirectory(str(Path(db_migrations.__file__).parent)).get_heads()
    if len(heads) != 1:
        raise TrackingError(f"MLflow's migrations have {len(heads)} heads ({heads}); reinstall mlflow from "
                            "constraints.txt")
    return heads[0]


def _incomplete(db_path: Path) -> str | None:
    """Why the SQLite store at `db_path` is not a complete MLflow schema of this version, or None when it is."""
    import mlflow.store.db.utils  # noqa: F401  (imports every ORM module, so Base.metadata lists every table)
    from mlflow.store.db.base_sql_model import Base

    try:
        with contextlib.closing(sqlite3.connect(f"{db_path.resolve().as_uri()}?mode=ro", uri=True)) as db:
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if not set(Base.metadata.tables) <= tables or "alembic_version" not in tables:
                return "some of MLflow's tables are missing"
            row = db.execute("SELECT version_num FROM alembic_version").fetchone()
    except sqlite3.Error as exc:
        return f"unreadable as SQLite ({exc})"
    version = row[0] if row else None
    return None if version == _head_revision() else f"schema version {version}, expected {_head_revision()}"


def _run_count(db_path: Path) -> int | None:
    """How many runs the store holds: 0 when it has no runs table; None when that cannot be told."""
    try:
        with contextlib.closing(sqlite3.connect(f"{db_path.resolve().as_uri()}?mode=ro", uri=True)) as db:
            return int(db.execute("SELECT count(*) FROM runs").fetchone()[0])
    except sqlite3.OperationalError as exc:
        return 0 if "no such table" in str(exc) else None
    except sqlite3.Error:
        return None


def _forget_engine(tracking_uri: str) -> None:
    """Drop MLflow's cached engine for `tracking_uri`: its pooled connections still point at the file moved aside."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    engine = SqlAlchemyStore._engine_map.pop(tracking_uri, None)
    if engine is not None:
        engine.dispose()


def _create_atomically(db_path: Path) -> None:
    """Create MLflow's schema in `.<name>.<random>.tmp` next to `db_path`, then rename it into place."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    tmp = temp_path(db_path)
    uri = f"sqlite:///{tmp.as_posix()}"
    try:
        store = SqlAlchemyStore(uri, (db_path.parent / "mlartifacts").resolve().as_uri())
        store.engine.dispose()
        SqlAlchemyStore._engine_map.pop(uri, None)
        publish(tmp, db_path)  # fsync, rename, folder fsync
    except BaseException as exc:
        _forget_engine(uri)
        _remove_db(tmp)
        if isinstance(exc, Exception):
            raise TrackingError(
                f"creating the MLflow store {db_path} failed ({type(exc).__name__}: {exc}); nothing was left at that "
                "path. Free space or fix permissions in its folder, then log the run with `make log-run RUN=<run>`"
            ) from exc
        raise


def ensure_sqlite_store(tracking_uri: str) -> None:
    """For a local SQLite URI, make sure a complete MLflow store exists (module docstring); other URIs pass.
    Call it under :func:`store_init_lock`. Raises TrackingError when the store cannot be created."""
    db_path = _sqlite_path(tracking_uri)
    if db_path is None:
        return
    for stale in db_path.parent.glob(f".{db_path.name}.*.tmp"):  # a creator killed part-way (we hold the lock)
        _remove_db(stale)
    if db_path.exists():
        why = _incomplete(db_path)
        if why is None or _run_count(db_path) != 0:
            return  # complete, or holding runs (or unreadable): never touched; MLflow's own message says what to do
        aside = db_path.with_name(f"{db_path.name}.incomplete-{datetime.now().strftime('%Y-%m-%d_%H-%M-%S-%f')}")
        for suffix in _SQLITE_SIDE_FILES:
            if Path(f"{db_path}{suffix}").exists():
                os.replace(f"{db_path}{suffix}", f"{aside}{suffix}")
        _forget_engine(tracking_uri)
        warnings.warn(f"MLflow store {db_path} was half-built ({why}) and held no run: moved aside to {aside.name} "
                      "and created again", RuntimeWarning, stacklevel=2)
    _create_atomically(db_path)


def get_or_create_experiment(client: MlflowClient, tracking_uri: str, name: str) -> str:
    """The experiment's id (created with artifacts next to a SQLite store), tagged with EXPERIMENT_KIND unless
    it already carries a kind (a choice made in the UI is kept)."""
    from mlflow.exceptions import MlflowException

    found = retry_locked(lambda: client.get_experiment_by_name(name), "get experiment")
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
            experiment_id = retry_locked(lambda: client.create_experiment(
                name, artifact_location=location, tags={"mlflow.experimentKind": EXPERIMENT_KIND}), "create")
            return experiment_id
        except MlflowException:
            # Another job created it between our lookup and create (RESOURCE_ALREADY_EXISTS).
            found = retry_locked(lambda: client.get_experiment_by_name(name), "get experiment")
            if found is None:
                raise
    if found is not None:
        experiment_id = found.experiment_id
        if "mlflow.experimentKind" in found.tags:
            return experiment_id
    try:
        retry_locked(lambda: client.set_experiment_tag(experiment_id, "mlflow.experimentKind", EXPERIMENT_KIND), "kind")
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
              "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}
    unset = [k for k in values if k not in os.environ]
    for k in unset:
        os.environ[k] = values[k]
    try:
        yield
    finally:
        for k in unset:
            os.environ.pop(k, None)
