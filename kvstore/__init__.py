"""kvstore: byte-exact KV artifacts — capture a cache into a snapshot, store it by content, graft it back.

Public API (what a user of the engine needs; everything else stays importable from its module):
    load_frozen_model, FrozenModel, Determinism, environment_fingerprint
                                        the frozen model, the pinned settings, the machine facts (kvstore.model)
    Backend, as_backend, load_backend   the generation-engine seam (kvstore.backend): transformers, llamacpp,
                                        fake; check_graft and the harness talk to a model through it
    prefill, forward, new_cache, capture_snapshot, deposit_tokens
                                        compute a prefix under the pinned schedule and snapshot its cache
    graft_snapshot                      rebuild a fresh cache from a snapshot at its own position
    Snapshot, to_bytes, from_bytes, read_metadata, tokens_sha256, FORMAT
                                        the artifact and its bytes (kvstore/FORMAT.md)
    LocalStore, MemoryStore, CachedStore, ArtifactId, atomic_write
                                        content-addressed storage, its host-memory tier, the one atomic write
    check_graft, GraftCheck, compare_logits, logits_sha256
                                        the exactness procedure: graft vs fresh reference (kvstore.verify)
    Prefetcher                          read + verify upcoming artifacts in the background (kvstore.prefetch)
    export_bundle, import_bundle, BundleInfo
                                        artifacts (+ opaque attachments) between stores as one file (kvstore.bundle)
    KVStoreError and its subclasses     kvstore.errors

Elsewhere on purpose: kvstore.gguf.BUNDLED (the bundled model's name), kvstore.tiny (test models),
kvstore.graft.check_compatible / graft_repositioned (the checks alone; the position experiment),
kvstore.store.Store / ArtifactInfo (the interface and the index rows), kvstore.verify.Comparison / the
halves of the check.
Importing kvstore changes no process state and imports nothing heavy: the names above are resolved on first
use (PEP 562 module `__getattr__`), so `import kvstore.atomic`, `kvstore.errors` or `kvstore.framing` (standard
library only) never pulls in torch or transformers; `from kvstore import check_graft` imports what that
name needs. `Determinism.apply()` (called by `load_frozen_model`) is where torch's global settings are set.
"""

from __future__ import annotations

import importlib
from typing import Any

# public name -> the module that defines it (the one place a re-export is declared)
_EXPORTS: dict[str, str] = {
    # model and settings
    "Determinism": "kvstore.determinism", "FrozenModel": "kvstore.model",
    "environment_fingerprint": "kvstore.model", "load_frozen_model": "kvstore.model",
    # the backend seam
    "Backend": "kvstore.backend", "as_backend": "kvstore.backends", "load_backend": "kvstore.backends",
    # compute and capture
    "capture_snapshot": "kvstore.capture", "deposit_tokens": "kvstore.capture", "forward": "kvstore.capture",
    "new_cache": "kvstore.capture", "prefill": "kvstore.capture",
    # graft
    "graft_snapshot": "kvstore.graft",
    # the artifact and its bytes
    "FORMAT": "kvstore.format", "Snapshot": "kvstore.format", "from_bytes": "kvstore.format",
    "read_metadata": "kvstore.format", "to_bytes": "kvstore.format", "tokens_sha256": "kvstore.format",
    # stores
    "ArtifactId": "kvstore.ids", "CachedStore": "kvstore.tier", "LocalStore": "kvstore.store",
    "MemoryStore": "kvstore.memory_store", "Prefetcher": "kvstore.prefetch", "atomic_write": "kvstore.atomic",
    # moving artifacts between stores
    "BundleInfo": "kvstore.bundle", "export_bundle": "kvstore.bundle", "import_bundle": "kvstore.bundle",
    # exactness
    "GraftCheck": "kvstore.verify", "check_graft": "kvstore.verify", "compare_logits": "kvstore.verify",
    "logits_sha256": "kvstore.verify",
    # errors
    **{name: "kvstore.errors" for name in (
        "BundleError", "FormatError", "IncompatibleError", "IndexDatabaseError", "IntegrityError",
        "InvalidIdError", "KVStoreError", "ModelLoadError", "NotFoundError", "SettingsError", "ValidationError")},
}  # fmt: skip

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Resolve a public name (or a submodule, `kvstore.store`) on first use and cache it on the package."""
    module = _EXPORTS.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
    else:
        try:
            value = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise  # the submodule exists but one of its own imports is missing: say that, not "no attribute"
            raise AttributeError(f"module 'kvstore' has no attribute {name!r}; the public names are listed in "
                                 "kvstore.__all__ (everything else is imported from its module)") from None  # fmt: skip
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
