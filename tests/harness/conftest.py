"""Fixtures for harness tests: a hand-built run folder (see ``fakerun.py``) and quiet, fast MLflow."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

_HERE = Path(__file__).resolve().parent


def _load_fakerun() -> ModuleType:
    """Import fakerun.py by path, so it works under any pytest import mode (no __init__.py needed)."""
    name = "kvgraft_tests_fakerun"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, _HERE / "fakerun.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def fakerun() -> ModuleType:
    """The fakerun helper module (``build_fake_run``, ``PROBLEMS``, ``make_rows`` ...)."""
    return _load_fakerun()


@pytest.fixture
def fake_run(tmp_path: Path, fakerun: ModuleType) -> Path:
    """A complete, untouched three-row baseline run folder in ``tmp_path/run``."""
    return fakerun.build_fake_run(tmp_path / "run")


@pytest.fixture
def repo_root() -> Path:
    """The repository root (where ``scripts/`` lives)."""
    return _HERE.parents[1]


@pytest.fixture(scope="session")
def _mlflow_template_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty MLflow SQLite store, schema created once per session (creation takes ~5-10 s)."""
    from mlflow import MlflowClient

    db = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{db}").search_experiments()
    return db


@pytest.fixture
def sqlite_uri(tmp_path: Path, _mlflow_template_db: Path) -> str:
    """URI of a fresh, already-initialised SQLite store at ``tmp_path/runs/mlflow.db``."""
    from harness.tracking import default_tracking_uri

    runs = tmp_path / "runs"
    runs.mkdir(exist_ok=True)
    shutil.copyfile(_mlflow_template_db, runs / "mlflow.db")
    return default_tracking_uri(runs)


@pytest.fixture
def fast_mlflow(monkeypatch: pytest.MonkeyPatch) -> None:
    """No retries, short timeouts, no progress bars: an unreachable server fails in seconds."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
