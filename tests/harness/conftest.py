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
    from harness.tracking.store import default_tracking_uri

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


def _deposit_library(be, problems, root: Path, entry_text, name: str):
    """A library of `problems` deposited by backend `be` (artifacts in a LocalStore under root/store, index and
    manifest under root/lib); `entry_text(problem)` is each entry's text."""
    from harness.library.build import Entry, Library
    from harness.record.hashing import sha256_json, write_json, write_jsonl
    from kvstore import LocalStore

    store = LocalStore(root / "store")
    rows = []
    for p in problems:
        ids = be.encode(entry_text(p))
        state, _ = be.prefill(ids)
        rows.append(Entry(entry_id=p.id[-8:], problem_id=p.id, problem_fingerprint=p.fingerprint, problem=p.problem,
                          answer=p.answer, artifact_id=str(store.put(be.capture(state, ids))), tokens=len(ids),
                          origin="test", verification={}).to_row())
    manifest = {"name": name, "version": 1, "entries": {r["entry_id"]: sha256_json(r) for r in rows}}
    manifest["manifest_sha256"] = sha256_json(manifest)
    (root / "lib").mkdir()
    write_jsonl(root / "lib" / "index.jsonl", rows)
    write_json(root / "lib" / "manifest.json", manifest)
    return Library(root / "lib", store)


@pytest.fixture(scope="session")
def deposit_library():
    """`deposit_library(be, problems, root, entry_text, name)`: a library deposited by a backend (conftest)."""
    return _deposit_library


def _still_running(seen: dict[int, tuple[str, float]]) -> list[str]:
    """Names of the processes in `seen` (pid -> (name, start time)) still running (zombies count as gone)."""
    import psutil

    alive = []
    for pid, (name, started) in seen.items():
        try:
            p = psutil.Process(pid)
            if p.create_time() == started and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(f"{name} ({pid})")
        except psutil.NoSuchProcess:
            pass
    return alive


@pytest.fixture(scope="session")
def still_running():
    """`still_running(seen)`: which of the processes a test saw (pid -> (name, start time)) still run (conftest)."""
    return _still_running


@pytest.fixture
def reseal():  # noqa: ANN201
    """`reseal(run)`: see `reseal_run`."""
    return reseal_run


def reseal_run(run: Path) -> None:
    """Re-seal a run folder a test edited on purpose (its summary or config): the manifest's hashes of them and its
    own hash recomputed, as a run writes them, so `log_run_dir`'s audit reads the edit as the run's own."""
    import json

    from harness.record.folder import RunFolder
    from harness.record.hashing import sha256_json

    folder = RunFolder(run)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["outputs"]["summary_sha256"] = sha256_json(json.loads((run / "summary.json").read_text()))
    if (run / "config.yaml").exists():
        manifest["inputs"]["config"] = sha256_json(folder.read_config())
    manifest.pop("manifest_sha256", None)
    manifest["manifest_sha256"] = sha256_json(manifest)
    (run / "manifest.json").write_text(json.dumps(manifest, indent=2))
