"""kvstore: byte-exact KV artifacts — capture a cache into a snapshot, store it by content, graft it back.

Public API (everything else is private):
    load_frozen_model, FrozenModel, Determinism        the frozen model and the pinned settings
    prefill, capture_snapshot, deposit_tokens, new_cache, forward   compute a prefix and snapshot its cache
    Snapshot, to_bytes, from_bytes, tokens_sha256       the artifact format (kvstore/FORMAT.md)
    LocalStore, MemoryStore, ArtifactId, ArtifactInfo   content-addressed storage
    CachedStore                                         bounded LRU host-memory tier in front of a store
    graft_snapshot, check_compatible, graft_repositioned         rebuild a cache from a snapshot
    compare_logits, logits_sha256                       the exactness check
    KVStoreError and subclasses                         kvstore.errors
"""

from kvstore.capture import capture_snapshot, deposit_tokens, forward, new_cache, prefill
from kvstore.determinism import Determinism
from kvstore.errors import (
    FormatError,
    IncompatibleError,
    IntegrityError,
    InvalidIdError,
    KVStoreError,
    ModelLoadError,
    NotFoundError,
)
from kvstore.format import FORMAT, Snapshot, from_bytes, read_metadata, to_bytes, tokens_sha256
from kvstore.graft import check_compatible, graft_repositioned, graft_snapshot
from kvstore.model import BUNDLED, FrozenModel, environment_fingerprint, load_frozen_model
from kvstore.store import ArtifactId, ArtifactInfo, LocalStore, MemoryStore, Store, atomic_write
from kvstore.tier import CachedStore
from kvstore.verify import Comparison, compare_logits, logits_sha256

__all__ = [
    "BUNDLED", "FORMAT", "ArtifactId", "ArtifactInfo", "Comparison", "Determinism", "FormatError", "FrozenModel",
    "IncompatibleError", "IntegrityError", "InvalidIdError", "KVStoreError", "LocalStore", "MemoryStore",
    "ModelLoadError", "NotFoundError", "Snapshot", "Store", "atomic_write", "capture_snapshot", "check_compatible",
    "compare_logits", "deposit_tokens", "environment_fingerprint", "forward", "from_bytes", "graft_snapshot",
    "graft_repositioned", "load_frozen_model", "logits_sha256", "new_cache", "prefill", "read_metadata",
    "to_bytes", "tokens_sha256",
    "CachedStore",
]
