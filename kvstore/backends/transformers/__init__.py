"""The transformers backend, the whole engine in this folder, and the face of its own functions.

    model.py       FrozenModel, load_frozen_model, fingerprints, the layer layout (smallest_window), the environment
    gguf.py        the bundled GGUF dequantized once;  tiny.py  tiny random-weight models;  lm_head.py  blocked LM head
    capture.py     prefill under the pinned schedule, forward, new_cache, capture_snapshot
    cache_state.py what a cache layer holds;  restore.py  the layout check and rebuild after admission
    backend.py     TransformersBackend: the Backend (core, Stepwise, Repositioning), owning its FrozenModel; its
                   `graft` (and `check`, `graft_repositioned`) is the one graft door, `deposit` the base's
    settings.py    TransformersSettings: what a caller of load_backend("transformers", ...) chooses

The names below are this engine's own vocabulary (kvstore's face holds only the backend-generic ones):

    be = kvstore.load_backend("transformers", source="tiny-gemma3")    # the one object: its verbs and facts
    cache, logits = be.prefill(ids)                                    # (kvstore.engine.protocol.Backend)
    smallest_window(be.layer_layout()), layout_string(be.layer_layout())

The harness and scripts use the backend; FrozenModel and the functions below taking one (prefill, forward,
...) are this folder's own, for its modules and its tests.

Importing this package imports neither torch nor transformers (the registry reads REGISTERED here): each name
loads its module on first use (PEP 562), as kvstore's face does.
"""

from __future__ import annotations

import importlib
from typing import Any

from kvstore.engine.protocol import Registered

REGISTERED = Registered("transformers", "kvstore.backends.transformers.backend:TransformersBackend")

# the module (in this folder, or the seam) that defines each public name
_FACE: dict[str, tuple[str, ...]] = {
    "model": ("FrozenModel", "environment_fingerprint", "layout_string", "load_frozen_model", "smallest_window"),
    "capture": ("capture_snapshot", "forward", "new_cache", "prefill"),
    "backend": ("TransformersBackend",),
    "settings": ("TransformersSettings",),
}
_EXPORTS: dict[str, str] = {name: f"{__name__}.{module}" for module, names in _FACE.items() for name in names}
_EXPORTS["TRANSFORMERS"] = "kvstore.engine.protocol"  # the backend's name (an artifact that records none: this one)
__all__ = sorted([*_EXPORTS, "bare", "fixed"])


def __getattr__(name: str) -> Any:
    if name in ("bare", "fixed"):  # transformers alone on a loaded backend's model; the mode's own kernel (benchmarks)
        return importlib.import_module(f"{__name__}.{name}")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}; its public names are listed in "
                             f"{__name__}.__all__")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
