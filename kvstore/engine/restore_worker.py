"""Restore in a second process: the graft half of the exactness check, run where nothing of the depositing
process survives (its own interpreter, its own model load), spoken to in JSON lines.

    spec = ModelSpec.backend("transformers", source="tiny-gemma3", determinism=det.to_dict())
    with RestoreWorker(spec, store.root) as worker:
        assert worker.ready()["model_fingerprint"] == be.fingerprint
        check = check_graft(be, prefix, suffix, store, restore=worker.restorer(prefix, suffix))

The worker (`python -m kvstore.engine.restore_worker SPEC STORE`) builds its model from a `ModelSpec` (an importable
`module:function` and JSON keyword arguments: `kvstore.backends:load_backend` by default, so any backend,
transformers or llamacpp, and `kvstore.testing.random_models:build_random_model` for random-weight models), opens the
store, and per request gets the artifact by id (bytes re-hashed), grafts it at its own position with
`kvstore.engine.verify.graft_logits`, runs the suffix and hands the logits back as a safetensors file next to the
caller, with their SHA-256, which the caller re-checks. Used by scripts/verify_graft.py, scripts/gpu_bench.py
and tests/kvstore/test_bundled_model.py.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvstore.errors import KVStoreError, RemoteGraftError, RestoreWorkerError

__all__ = ["ModelSpec", "RestoreWorker", "main"]
_LOG_LINES = 15


@dataclass(frozen=True)
class ModelSpec:
    """How the worker builds its model: `loader` ("module:function") called with `kwargs` (JSON values; a
    `determinism` dict becomes a kvstore.Determinism). It returns a Backend."""

    loader: str = "kvstore.backends:load_backend"
    kwargs: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def backend(cls, name: str = "transformers", **kwargs: Any) -> ModelSpec:
        """`kvstore.load_backend(name, **kwargs)` in the worker (transformers: source, determinism, device, seed)."""
        return cls("kvstore.backends:load_backend", {"name": name, **kwargs})

    def to_json(self) -> str:
        return json.dumps({"loader": self.loader, "kwargs": self.kwargs})

    @classmethod
    def from_json(cls, text: str) -> ModelSpec:
        d = json.loads(text)
        return cls(d["loader"], d.get("kwargs", {}))

    def build(self) -> Any:
        """Import the loader and call it (in the worker)."""
        module, sep, name = self.loader.partition(":")
        if not sep:
            raise KVStoreError(f"model spec loader {self.loader!r} is not 'module:function'; name an importable "
                               "function, e.g. 'kvstore.backends:load_backend'")
        kwargs = dict(self.kwargs)
        if isinstance(kwargs.get("determinism"), dict):
            from kvstore.determinism import Determinism

            kwargs["determinism"] = Determinism.from_dict(kwargs["determinism"])
        return getattr(importlib.import_module(module), name)(**kwargs)


# ------------------------------------------------------------------------------------------------ the worker side
def serve(spec: ModelSpec, store_root: str) -> int:
    """Build the model, say hello, then answer one JSON line per request line on stdin."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)  # the protocol channel: the original stdout
    os.dup2(2, 1)  # anything else printed (library warnings, progress bars) goes to stderr, the log
    sys.stdout = sys.stderr

    from safetensors.torch import save_file

    from kvstore.engine.protocol import Backend
    from kvstore.engine.verify import graft_logits, logits_sha256
    from kvstore.store.local import LocalStore

    t0 = time.perf_counter()
    model = spec.build()
    store = LocalStore(store_root)
    if not isinstance(model, Backend):
        raise KVStoreError(f"model spec loader {spec.loader!r} returned a {type(model).__name__}, not a kvstore "
                           "backend; name a loader that returns one (kvstore.backends:load_backend)")
    be = model
    hello = {"ready": True, "pid": os.getpid(), "model_fingerprint": model.fingerprint, "settings": be.settings(),
             "load_s": time.perf_counter() - t0}
    proto.write(json.dumps(hello, default=str) + "\n")
    for line in sys.stdin:
        req = json.loads(line)
        try:
            restored = graft_logits(model, req["prefix"], req["suffix"], store=store, artifact_id=req["id"],
                                    offset=req.get("offset", 0))
            logits = restored.logits.detach().contiguous().cpu()  # (1, suffix, vocab)
            save_file({"logits": logits}, req["out"])
            reply = {"ok": True, "sha256": logits_sha256(logits), "timing_s": restored.timing_s}
        except Exception as e:  # report and keep serving: the caller records the failure per artifact
            reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        proto.write(json.dumps(reply) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m kvstore.engine.restore_worker SPEC_JSON STORE_ROOT` (started by RestoreWorker)."""
    spec_json, store_root = argv if argv is not None else sys.argv[1:]
    return serve(ModelSpec.from_json(spec_json), store_root)


# ------------------------------------------------------------------------------------------------ the caller side
class RestoreWorker:
    """The second process, started at construction; `restore` / `restorer(prefix, suffix)` plug into
    `kvstore.check_graft(restore=...)`. Close it (or use it as a context manager) to end the process."""

    def __init__(self, spec: ModelSpec, store_root: str | os.PathLike[str], *, log_path: Path | None = None,
                 env: dict[str, str] | None = None, logits_device: str | None = None) -> None:
        self.spec, self.logits_device = spec, logits_device
        self._tmp = Path(tempfile.mkdtemp(prefix="kvgraft-restore-"))
        self.log_path = log_path or self._tmp / "worker.log"
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in close()
        repo = str(Path(__file__).resolve().parents[2])
        child_env = dict(os.environ if env is None else env)
        child_env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, child_env.get("PYTHONPATH", "")) if p)
        cmd = [sys.executable, "-m", "kvstore.engine.restore_worker", spec.to_json(), str(store_root)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                     text=True, bufsize=1, env=child_env)
        self.hello: dict[str, Any] | None = None
        self._n = 0

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self._log.flush()
            lines = self.log_path.read_text(errors="replace").splitlines(keepends=True)[-_LOG_LINES:]
            raise RestoreWorkerError(f"the restore worker ({self.spec.loader}) exited with status "
                                     f"{self.proc.returncode}; its log ends:\n{''.join(lines)}")
        return json.loads(line)

    def ready(self) -> dict[str, Any]:
        """The worker's hello, once its model is loaded: pid, model_fingerprint, settings, load_s."""
        if self.hello is None:
            self.hello = self._read()
        return self.hello

    def check_model(self, fingerprint: str) -> None:
        """RestoreWorkerError unless the worker built the model with this fingerprint."""
        theirs = self.ready()["model_fingerprint"]
        if theirs != fingerprint:
            raise RestoreWorkerError(f"the restore worker loaded another model (fingerprint {theirs[:12]}, expected "
                                     f"{fingerprint[:12]}): give it the same model spec and settings")

    def restore(self, artifact_id: str, prefix: list[int], suffix: list[int], offset: int = 0) -> Any:
        """The graft half in the worker: a kvstore.engine.verify.Restored with the logits (re-hashed here) and timings.
        RemoteGraftError when the worker could not graft this artifact (it keeps serving)."""
        from safetensors.torch import load_file

        from kvstore.engine.verify import Restored, logits_sha256

        self.ready()
        self._n += 1
        out = self._tmp / f"logits{self._n}.safetensors"
        req = {"id": artifact_id, "prefix": list(prefix), "suffix": list(suffix), "offset": offset, "out": str(out)}
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # the worker is gone: _read says why
        reply = self._read()
        if not reply.get("ok"):
            raise RemoteGraftError(f"artifact {artifact_id}: the restore worker could not graft it: "
                                   f"{reply.get('error')}")
        try:
            logits = load_file(str(out))["logits"]
        finally:
            out.unlink(missing_ok=True)
        if logits_sha256(logits) != reply["sha256"]:
            raise RestoreWorkerError(f"artifact {artifact_id}: the logits file does not hash to the SHA-256 the "
                                     "restore worker reported; the hand-over is broken, run again")
        if self.logits_device is not None:
            logits = logits.to(self.logits_device)
        return Restored(logits, reply["timing_s"])

    def restorer(self, prefix: list[int], suffix: list[int], offset: int = 0) -> Callable[[str], Any]:
        """`check_graft(..., restore=worker.restorer(prefix, suffix))`: the artifact id in, Restored out."""
        return lambda artifact_id: self.restore(artifact_id, prefix, suffix, offset)

    def close(self) -> None:
        """End the worker (stdin closed, then wait; killed after 60 s) and remove its hand-over folder."""
        import shutil

        if self.proc.stdin and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()
        self._log.close()
        shutil.rmtree(self._tmp, ignore_errors=True)  # the hand-over files (and the log, unless given a path)

    def __enter__(self) -> RestoreWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


if __name__ == "__main__":
    sys.exit(main())
