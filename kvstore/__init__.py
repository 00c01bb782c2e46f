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
                                        move artifacts (and a library) between stores as one file (kvstore.bundle)
    KVStoreError and its subclasses     kvstore.errors

Elsewhere on purpose: kvstore.gguf.BUNDLED (the bundled model's name), kvstore.tiny (test models),
kvstore.graft.check_compatible / graft_repositioned (the checks alone; the position experiment),
kvstore.store.Store / ArtifactInfo (the interface and the index rows), kvstore.verify.Comparison / the
halves of the check.
Importing kvstore changes no process state; `Determinism.apply()` (called by `load_frozen_model`) is where
torch's global settings are set.
"""

from kvstore.backend import Backend
from kvstore.backends import as_backend, load_backend
from kvstore.bundle import BundleInfo, export_bundle, import_bundle
from kvstore.capture import capture_snapshot, deposit_tokens, forward, new_cache, prefill
from kvstore.determinism import Determinism
from kvstore.errors import (
    BundleError,
    FormatError,
    IncompatibleError,
    IndexDatabaseError,
    IntegrityError,
    InvalidIdError,
    KVStoreError,
    ModelLoadError,
    NotFoundError,
    SettingsError,
    ValidationError,
)
from kvstore.format import FORMAT, Snapshot, from_bytes, read_metadata, to_bytes, tokens_sha256
from kvstore.graft import graft_snapshot
from kvstore.memory_store import MemoryStore
from kvstore.model import FrozenModel, environment_fingerprint, load_frozen_model
from kvstore.prefetch import Prefetcher
from kvstore.store import ArtifactId, LocalStore, atomic_write
from kvstore.tier import CachedStore
from kvstore.verify import GraftCheck, check_graft, compare_logits, logits_sha256

__all__ = [
    # model and settings
    "Determinism", "FrozenModel", "environment_fingerprint", "load_frozen_model",
    # the backend seam
    "Backend", "as_backend", "load_backend",
    # compute and capture
    "capture_snapshot", "deposit_tokens", "forward", "new_cache", "prefill",
    # graft
    "graft_snapshot",
    # the artifact and its bytes
    "FORMAT", "Snapshot", "from_bytes", "read_metadata", "to_bytes", "tokens_sha256",
    # stores
    "ArtifactId", "CachedStore", "LocalStore", "MemoryStore", "Prefetcher", "atomic_write",
    # moving artifacts between stores
    "BundleInfo", "export_bundle", "import_bundle",
    # exactness
    "GraftCheck", "check_graft", "compare_logits", "logits_sha256",
    # errors
    "BundleError", "FormatError", "IncompatibleError", "IndexDatabaseError", "IntegrityError", "InvalidIdError",
    "KVStoreError", "ModelLoadError", "NotFoundError", "SettingsError", "ValidationError",
]
