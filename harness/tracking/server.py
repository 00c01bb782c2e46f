"""An MLflow tracking server on 127.0.0.1 that parallel jobs log to: SQL backend and artifacts under runs/.

    make mlflow-server                                  # serves http://127.0.0.1:5000 until Ctrl-C
    make mlflow-ui                                      # the dashboard of runs/mlflow.db (--ui): prints its address
    python -m harness condition=baseline tracking=server            # tracking.uri=http://127.0.0.1:5000
    python -m harness -m condition=baseline,graft tracking=server tracking.uri=http://HOST:PORT

One server process owns the SQLite file (runs/mlflow-server.db; another SQL database by --backend-store-uri),
so N jobs on N machines write through HTTP instead of each opening the file (SQLite's "database is locked" is
the server's concern, not theirs). Artifacts are proxied (--serve-artifacts) into runs/mlflow-server-artifacts,
so a client needs no shared filesystem. MLflow's background job runner (GenAI evaluation jobs, a dozen worker
processes) is turned off: it is not used here and would triple the start time on a small machine.
`MlflowServer` is the same server as a context manager, for tests. Both print the one address a reviewer opens
(:func:`dashboard_address`: the experiment's runs table in the headline view).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

from harness.config.schema import DEFAULT_EXPERIMENT
from harness.errors import TrackingError
from harness.tracking.store import default_tracking_uri
from harness.tracking.views import view_url
from kvstore import LocalServer

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(runs: Path, port: int, backend_uri: str | None = None, workers: int = 1) -> list[str]:
    runs = Path(runs).resolve()
    backend = backend_uri or f"sqlite:///{(runs / 'mlflow-server.db').as_posix()}"
    return [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", backend,
            "--artifacts-destination", str(runs / "mlflow-server-artifacts"), "--serve-artifacts",
            "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers)]


def server_env() -> dict[str, str]:
    return {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


class MlflowServer:
    """`mlflow server` on 127.0.0.1:`port` (a free one by default) with its data under `runs`; `uri` is its URL."""

    def __init__(self, runs: str | os.PathLike, port: int | None = None, start_timeout_s: float = 180.0) -> None:
        self.runs = Path(runs)
        self.port = port or free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.start_timeout_s = start_timeout_s
        self.log_path = self.runs / "mlflow-server.log"
        self.server: LocalServer | None = None

    def start(self) -> MlflowServer:
        self.runs.mkdir(parents=True, exist_ok=True)
        self.server = LocalServer(server_command(self.runs, self.port), self.log_path, ready=self.answers,
                                  what=f"mlflow server {self.uri}", error=TrackingError,
                                  timeout_s=self.start_timeout_s, grace_s=15, env=server_env())
        self.server.start()
        return self

    def answers(self) -> bool:
        """Whether the server answers its health check."""
        try:
            with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    @property
    def proc(self) -> subprocess.Popen | None:
        return self.server.proc if self.server is not None else None

    @property
    def started_in_s(self) -> float | None:
        return self.server.started_s if self.server is not None else None

    def stop(self) -> None:
        """SIGTERM the server's process group (uvicorn and its workers), SIGKILL after 15 s. Idempotent."""
        if self.server is not None:
            self.server.stop()

    def __enter__(self) -> MlflowServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def dashboard_address(base: str, tracking_uri: str, experiment: str = DEFAULT_EXPERIMENT) -> str:
    """The dashboard's first screen: `experiment`'s runs table in the shared headline view
    (``harness.tracking.views.view_url``), or the experiment list (in the runs workflow) before any job logged."""
    from mlflow import MlflowClient

    found = MlflowClient(tracking_uri=tracking_uri).get_experiment_by_name(experiment)
    if found is None:
        return f"{base}/#/?workflowType=machine_learning"
    return f"{base}/{view_url(found.experiment_id)}"


def ui_command(runs: Path, port: int) -> list[str]:
    """``mlflow ui`` over the embedded store of the jobs (``runs/mlflow.db``, artifacts beside it)."""
    return [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", default_tracking_uri(runs),
            "--host", "127.0.0.1", "--port", str(port)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.tracking.server", description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", default=str(REPO / "runs"), help="folder of the SQLite backend and artifacts")
    p.add_argument("--port", type=int, default=5000)
    p.add_argument("--backend-store-uri", default=None, help="another SQL database (postgresql://..., mysql://...)")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--ui", action="store_true", help="serve the jobs' embedded store (runs/mlflow.db) instead")
    p.add_argument("--experiment", default=DEFAULT_EXPERIMENT, help="the experiment whose address is printed")
    a = p.parse_args(argv)
    runs = Path(a.runs).resolve()
    runs.mkdir(parents=True, exist_ok=True)
    base = f"http://127.0.0.1:{a.port}"
    if a.ui:
        cmd = ui_command(runs, a.port)
        print(f"open {dashboard_address(base, default_tracking_uri(runs), a.experiment)}", flush=True)
    else:
        cmd = server_command(runs, a.port, a.backend_store_uri, a.workers)
        store = a.backend_store_uri or f"sqlite:///{(runs / 'mlflow-server.db').as_posix()}"
        print(f"MLflow server on {base} (jobs: tracking=server tracking.uri={base}); open "
              f"{dashboard_address(base, store, a.experiment)}", flush=True)
    os.execve(cmd[0], cmd, server_env())
    return 0  # pragma: no cover - execve does not return


if __name__ == "__main__":
    raise SystemExit(main())
