"""A bounded host-memory tier in front of any Store: verified artifact bytes kept in an LRU map.

    store = CachedStore(LocalStore("runs/library/store"), max_bytes=512 << 20)
    snap = store.get(aid)      # first time: read and verified by the store below, then kept
    snap = store.get(aid)      # again: from memory, no read and no re-hash

Only bytes that the store below returned from get_bytes are kept, and every Store's get_bytes re-hashes what
it read (SHA-256 == id), so a damaged object is refused on its first read and never enters the tier. Kept
bytes are immutable; each get parses them into fresh tensors (one copy), so callers never share a cache.
Whether the tier pays is measured by scripts/bench/restore.py (`make bench`: restore from the tier vs from disk,
warm page cache).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable

from kvstore.errors import KVStoreError
from kvstore.format.artifact import Snapshot
from kvstore.format.ids import ArtifactId
from kvstore.store.base import ArtifactInfo, Store


class CachedStore(Store):
    """LRU host-memory tier (at most `max_bytes` of artifact bytes) in front of `inner`; same interface.

    hits / misses count get_bytes (and get) calls served from memory / from `inner`.
    """

    def __init__(self, inner: Store, max_bytes: int) -> None:
        if max_bytes < 0:
            raise KVStoreError(f"CachedStore max_bytes={max_bytes} must be >= 0 (0 keeps nothing in memory)")
        self.inner = inner
        self.max_bytes = int(max_bytes)
        self.hits = 0
        self.misses = 0
        self._lru: OrderedDict[str, bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"CachedStore({self.inner!r}, max_bytes={self.max_bytes}, held={self._bytes}, items={len(self._lru)})"

    @property
    def cached_bytes(self) -> int:
        """Bytes held in memory now (always <= max_bytes)."""
        return self._bytes

    def cached_ids(self) -> list[ArtifactId]:
        """Ids held in memory, least recently used first."""
        with self._lock:
            return [ArtifactId(a) for a in self._lru]

    def get_bytes(self, aid: str) -> bytes:
        aid = ArtifactId(aid)
        with self._lock:
            data = self._lru.get(aid)
            if data is not None:
                self._lru.move_to_end(aid)
                self.hits += 1
                return data
            self.misses += 1
        data = self.inner.get_bytes(aid)  # verified by the store below (raises on damage: nothing is kept)
        self._keep(aid, bytes(data))
        return data

    def _keep(self, aid: str, data: bytes) -> None:
        if len(data) > self.max_bytes:
            return
        with self._lock:
            if aid in self._lru:
                return
            self._lru[aid] = data
            self._bytes += len(data)
            while self._bytes > self.max_bytes:
                _, old = self._lru.popitem(last=False)
                self._bytes -= len(old)

    def _drop(self, aid: str) -> None:
        with self._lock:
            old = self._lru.pop(aid, None)
            if old is not None:
                self._bytes -= len(old)

    def clear(self) -> None:
        """Empty the tier (the store below is untouched); counters are kept."""
        with self._lock:
            self._lru.clear()
            self._bytes = 0

    def put_bytes(self, data: bytes, tags: Iterable[str] = ()) -> ArtifactId:
        return self.inner.put_bytes(data, tags)

    def put(self, snapshot: Snapshot, tags: Iterable[str] = ()) -> ArtifactId:
        return self.inner.put(snapshot, tags)  # the store below records the snapshot's numerics as it does

    def put_many(self, items: Iterable[Snapshot | bytes], tags: Iterable[str] = ()) -> list[ArtifactId]:
        return self.inner.put_many(items, tags)

    def contains(self, aid: str) -> bool:
        return self.inner.contains(aid)

    def info(self, aid: str) -> ArtifactInfo:
        return self.inner.info(aid)

    def size(self, aid: str) -> int:
        return self.inner.size(aid)

    def list(self, tag: str | None = None) -> list[ArtifactInfo]:
        return self.inner.list(tag)

    def find_tokens(self, tokens_sha256: str) -> list[ArtifactId]:
        return self.inner.find_tokens(tokens_sha256)

    def remove(self, aid: str) -> None:
        self._drop(ArtifactId(aid))
        self.inner.remove(aid)

    def add_tags(self, aid: str, tags: Iterable[str]) -> None:
        self.inner.add_tags(aid, tags)

    def numerics_record(self, aid: str):
        return self.inner.numerics_record(aid)

    def record_numerics(self, aid: str, record) -> None:
        self.inner.record_numerics(aid, record)

    def __len__(self) -> int:
        return len(self.inner)
