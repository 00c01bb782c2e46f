"""The llama.cpp backend: llama-cpp-python on a GGUF file (backend.py: the engine; settings.py: what a caller
chooses; state.py: llama.cpp's sequence state bytes <-> kvgraft layers). docs/backends.md."""

import importlib
from typing import Any

from kvstore.engine.protocol import Registered

REGISTERED = Registered("llamacpp", "kvstore.backends.llamacpp.backend:LlamaCppBackend")

# this engine's own names, loaded on first use (importing the face loads no llama_cpp): `bare` (llama.cpp alone on
# a loaded backend's context, for benchmarks), weight_buffers (llama.cpp's extra weight buffer types switch)
_EXPORTS = {"LlamaCppBackend": "backend", "weight_buffers": "backend", "LlamaCppSettings": "settings"}
__all__ = sorted([*_EXPORTS, "bare"])


def __getattr__(name: str) -> Any:
    if name == "bare":
        return importlib.import_module(f"{__name__}.bare")
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}; its public names are {__all__}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
