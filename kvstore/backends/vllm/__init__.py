"""The vLLM backend (its own venv: `make setup-vllm`, .venv-vllm): the engine on CPU and kvgraft's KV connector.

    settings.py   VllmBackendSettings: what a caller of load_backend("vllm") chooses (the harness's model.vllm);
                  VllmSettings: those plus the connector's choices, the engine start_engine starts
    backend.py    VllmBackend: kvgraft's Backend seam on an in-process vllm.LLM (the core and InEngineDecoding), the
                  connector doing every deposit and graft; `load` is the registry's loader
    launch.py     start_engine, engine_kwargs, model_folder: vllm.LLM configured the way the figures are measured
    connector.py  KvgraftConnector: deposits prompt prefixes as artifacts, grafts them back after every check
    identity.py   what binds an artifact to an engine: fingerprints, binding settings, the Facts admission compares
    paged.py      vLLM's CPU paged KV blocks <-> the artifact's (1, kv_heads, tokens, head_dim) tensors
    text.py       VllmText: the model's tokenizer and fingerprints without an engine (a prompt-composing front end)

Importing this package imports no vLLM (only kvstore.engine.protocol, for REGISTERED); the names below load their
module on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from kvstore.engine.protocol import Registered

REGISTERED = Registered("vllm", "kvstore.backends.vllm.backend:VllmBackend")

_EXPORTS = {"VllmBackendSettings": "settings", "VllmSettings": "settings", "VllmBackend": "backend",
            "start_engine": "launch", "engine_kwargs": "launch", "model_folder": "launch",
            "KvgraftConnector": "connector", "journal": "connector", "VllmText": "text", "Server": "serve",
            "LearnedLayout": "paged", "named_maps": "paged", "self_test": "paged",
            # the connector's wire: its request keys, its answers and the ASGI body reader (a front end's)
            "GRAFT_MARK": "params", "GRAFT_TOKENS": "params", "GRAFTED": "params", "REFUSED": "params",
            "read_body": "params"}
__all__ = sorted([*_EXPORTS, "bare"])


def __getattr__(name: str) -> Any:
    if name == "bare":  # vLLM alone on a loaded backend's engine, for benchmarks
        return importlib.import_module(f"{__name__}.bare")
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value
