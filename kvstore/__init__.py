"""kvstore: byte-exact KV artifacts — capture a cache into a snapshot, store it by content, graft it back.

The face: what a user of the engine (and the harness, which imports nothing else) needs, backend-generic only (an
engine's own vocabulary is its folder's face: kvstore.backends.transformers). The layout, one folder
per concept (docs/extending.md):

    format/    the artifact's bytes: Snapshot, to_bytes/from_bytes, ids, canonical JSON  (kvstore/FORMAT.md)
    store/     content-addressed stores (local folder, S3, memory), their index, the host-memory tier, prefetch
    bundle/    artifacts (+ opaque attachments) between stores as one file
    engine/    the Backend base class (a core and its capabilities), its Tokenizer, the one graft admission, check_graft
    backends/  the registry (load_backend) and one folder per engine: transformers/, llamacpp/, vllm/, fake
               (each engine's own functions are its folder's face: kvstore.backends.transformers.prefill, ...)
    testing/   fuzzing, a local S3 server, random-weight models
    errors, atomic, environment, determinism, processes, cli   (top-level modules)

Importing kvstore changes no process state and imports nothing heavy: the names below are resolved on first
use (PEP 562 module `__getattr__`), so `import kvstore.atomic`, `kvstore.errors` or `kvstore.format.framing`
(standard library only) never pulls in torch or transformers; `from kvstore import check_graft` imports what that
name needs. `Determinism.apply()` (called when a model is loaded) is where torch's global settings are set.
"""

from __future__ import annotations

import importlib
from typing import Any

# the module that defines each public name (the one place a re-export is declared)
_FACE: dict[str, tuple[str, ...]] = {
    # the model, its pinned settings and the machine it runs on
    "kvstore.determinism": ("Determinism",),
    "kvstore.environment": ("KERNEL_RECORD", "PORTABLE_PROFILES", "PROFILES", "UNVERSIONED_KERNEL", "cpu_name",
                            "enter_profile", "environment_differences", "both_invariant", "recorded_kernel",
                            "numerics_differences", "numerics_of_tags", "numerics_tag", "profile_problems"),
    # the backend seam and the registry
    "kvstore.engine.protocol": ("Backend", "BatchedRows", "Continuation", "InEngineBatches", "InEngineDecoding",
                                "RaggedRows", "Registered", "Repositioning", "RowsRequest", "Stepwise",
                                "artifact_backend", "supports_batched_rows", "supports_in_flight"),
    "kvstore.engine.text": ("HFTokenizer", "Tokenizer"),
    "kvstore.backends": ("backend_class", "backend_missing", "backend_names", "backend_tools",
                         "batch_invariant_refusal", "batch_invariant_unavailable", "batched_rows_refusal",
                         "in_flight_refusal", "load_backend", "load_text_model", "settings_class", "settings_for"),
    "kvstore.backends.settings": ("BackendSettings", "ModelChoice"),
    "kvstore.backends.packaged": ("BUNDLED",),
    # the artifact and its bytes
    "kvstore.format.artifact": ("FORMAT", "NumericsRecord", "Snapshot", "from_bytes", "read_metadata", "to_bytes",
                                "tokens_sha256"),
    "kvstore.format.canonical": ("canonical_json",),
    "kvstore.format.ids": ("ArtifactId",),
    # stores
    "kvstore.store.base": ("Store",),
    "kvstore.store.open": ("open_store",),
    "kvstore.store.tier": ("CachedStore",),
    "kvstore.store.local": ("LocalStore",),
    "kvstore.store.memory": ("MemoryStore",),
    "kvstore.store.prefetch": ("Prefetcher",),
    "kvstore.atomic": ("atomic_write", "publish", "temp_path"),
    # moving artifacts between stores
    "kvstore.bundle.bundle": ("BundleInfo", "export_bundle", "import_bundle"),
    # exactness
    "kvstore.engine.admission": ("Difference", "Facts", "admission_differences", "admit", "artifact_differences",
                                 "check_numerics", "numerics_evidence_problem"),
    "kvstore.engine.verify": ("GraftCheck", "check_graft", "compare_logits", "logits_sha256"),
    "kvstore.engine.weights": ("PinnedWeights", "check_weights"),
    # the local servers the project starts
    "kvstore.processes": ("LocalServer", "die_with_parent", "stop_process_group"),
    # errors
    "kvstore.errors": ("BundleError", "EnvironmentMismatchError", "FormatError", "IncompatibleError",
                       "IndexDatabaseError", "IntegrityError", "InvalidIdError", "KVStoreError", "ModelChangedError",
                       "ModelLoadError", "NotFoundError", "SettingsError", "ValidationError"),
}
_EXPORTS: dict[str, str] = {name: module for module, names in _FACE.items() for name in names}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Resolve a public name (or a submodule, `kvstore.store.local`) on first use and cache it on the package."""
    module = _EXPORTS.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
    else:
        try:
            value = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise  # the submodule exists but one of its own imports is missing: say that, not "no attribute"
            raise AttributeError(
                f"module 'kvstore' has no attribute {name!r}; the public names are listed in kvstore.__all__ "
                "(everything else is imported from its module)"
            ) from None
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
