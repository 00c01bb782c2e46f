"""The local MLflow store is never left half-built: MLflow's own in-place creation, interrupted, leaves a database
on which every later log fails ("duplicate column name: step"); ours creates it in a temp file and renames it, and
rebuilds a half-built one that holds no run."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from harness.errors import TrackingError
from harness.tracking.log import log_run_dir
from harness.tracking.store import default_tracking_uri, ensure_sqlite_store

REPO = Path(__file__).resolve().parents[2]


def _half_built(db: Path) -> None:
    """The state a crash leaves after MLflow's first tables and the DDL of its first migration (metrics.step) but
    before alembic recorded that migration."""
    from mlflow.store.db.utils import create_sqlalchemy_engine
    from mlflow.store.tracking.dbmodels.initial_models import Base as InitialBase

    engine = create_sqlalchemy_engine(f"sqlite:///{db}")
    InitialBase.metadata.create_all(engine)
    engine.dispose()
    with sqlite3.connect(db) as c:
        c.execute("ALTER TABLE metrics ADD COLUMN step BIGINT DEFAULT '0' NOT NULL")


def _tables(db: Path) -> set[str]:
    with sqlite3.connect(db) as c:
        return {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def test_a_half_built_store_breaks_plain_mlflow_and_the_next_log_repairs_it(tmp_path, fake_run):
    from mlflow import MlflowClient

    db = tmp_path / "runs" / "mlflow.db"
    db.parent.mkdir()
    _half_built(db)
    uri = default_tracking_uri(db.parent)
    with pytest.raises(Exception, match="duplicate column name: step"):  # what every later log used to hit
        MlflowClient(tracking_uri=uri).search_experiments()
    with pytest.warns(RuntimeWarning, match=r"was half-built \(some of MLflow's tables are missing\) and held no run"):
        run_id = log_run_dir(fake_run, tracking_uri=uri, experiment="kvgraft-test", traces=False)
    assert MlflowClient(tracking_uri=uri).get_run(run_id).info.status == "FINISHED"
    aside = list(db.parent.glob("mlflow.db.incomplete-*"))
    assert len(aside) == 1 and "latest_metrics" not in _tables(aside[0])  # the half-built one, kept for inspection
    assert not list(db.parent.glob(".mlflow.db.*.tmp"))


def test_a_store_holding_runs_is_never_moved(tmp_path, sqlite_uri, fake_run):
    run_id = log_run_dir(fake_run, tracking_uri=sqlite_uri, experiment="kvgraft-test", traces=False)
    db = tmp_path / "runs" / "mlflow.db"
    with sqlite3.connect(db) as c:
        c.execute("UPDATE alembic_version SET version_num = 'older'")  # an old MLflow's store, with a run in it
    ensure_sqlite_store(sqlite_uri)
    assert db.is_file() and not list(db.parent.glob("mlflow.db.incomplete-*"))
    with sqlite3.connect(db) as c:
        assert c.execute("SELECT run_uuid FROM runs").fetchall() == [(run_id,)]


def test_a_failure_while_creating_leaves_nothing_and_the_next_log_works(tmp_path, fake_run, monkeypatch):
    import mlflow.store.db.utils as db_utils

    def disk_full(engine):
        raise OSError(28, "No space left on device")

    db = tmp_path / "runs" / "mlflow.db"
    uri = default_tracking_uri(db.parent)
    with monkeypatch.context() as m:
        m.setattr(db_utils, "_upgrade_db", disk_full)  # after the first tables, before the migrations
        with pytest.raises(TrackingError, match=r"creating the MLflow store .*mlflow.db failed \(OSError: \[Errno 28\] "
                                                r"No space left on device\); nothing was left at that path"):
            ensure_sqlite_store(uri)
    assert not db.exists() and not list(db.parent.glob(".mlflow.db.*"))
    run_id = log_run_dir(fake_run, tracking_uri=uri, experiment="kvgraft-test", traces=False)
    assert run_id and "alembic_version" in _tables(db)


def test_a_creator_killed_mid_migration_leaves_no_database(tmp_path, fake_run):
    db = tmp_path / "runs" / "mlflow.db"
    uri = default_tracking_uri(db.parent)
    code = ("import os, signal, mlflow.store.db.utils as u\n"
            "u._upgrade_db = lambda engine: os.kill(os.getpid(), signal.SIGKILL)\n"
            "from harness.tracking.store import ensure_sqlite_store\n"
            f"ensure_sqlite_store({uri!r})\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert not db.exists() and list(db.parent.glob(".mlflow.db.*.tmp"))  # only the killed creator's temp file
    run_id = log_run_dir(fake_run, tracking_uri=uri, experiment="kvgraft-test", traces=False)
    assert run_id and not list(db.parent.glob(".mlflow.db.*.tmp"))  # the stale temp file is cleared
