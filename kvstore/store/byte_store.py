"""The byte-store interface: the five verbs a place that keeps immutable named blobs must offer, and its in-memory twin.

    create(key, data) -> bool   create-if-absent, atomically: a reader sees the whole blob or no blob
    get(key) -> bytes           NotFoundError for a missing key, never None
    contains(key) -> bool
    list(prefix) -> [key, ...]  sorted
    delete(key) -> bool         False when there was nothing to delete

A byte store knows nothing of artifacts: admission (every invariant of FORMAT.md), verification (bytes hash to
their id on every read) and the index are done once, above it, by kvstore.store.objects.ObjectStore, for every
byte store (memory here, a folder in kvstore/store/directory.py,
S3 in kvstore/store/s3.py). Keys are '/'-separated ASCII paths (`objects/ab/cdef...`).
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod

from kvstore.errors import KVStoreError, NotFoundError

_KEY_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._-")


def check_key(key: str) -> str:
    """A key as a byte store accepts it: non-empty relative '/' path of [A-Za-z0-9._-] parts, no '..'."""
    if (not isinstance(key, str) or not key or len(key) > 900 or not set(key) <= _KEY_CHARS
            or key.startswith("/") or any(part in ("", ".", "..") for part in key.split("/"))):
        raise KVStoreError(f"byte-store key {key!r:.120} is not a relative path of [A-Za-z0-9._-] parts")
    return key


class ByteStore(ABC):
    """Immutable named blobs: create-if-absent, get, contains, list, delete. `where` names it in messages."""

    where: str = "a byte store"

    @abstractmethod
    def create(self, key: str, data: bytes | memoryview) -> bool:
        """Store `data` under `key` unless the key exists; True when this call created it. Atomic: a concurrent
        reader sees either nothing or all of `data`; of two racing creators exactly one gets True."""

    @abstractmethod
    def get(self, key: str) -> bytes:
        """The blob's bytes, as stored (not verified: the caller checks them). NotFoundError when absent."""

    @abstractmethod
    def contains(self, key: str) -> bool:
        """Whether a blob is stored under `key`."""

    @abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """Every key starting with `prefix`, sorted."""

    @abstractmethod
    def delete(self, key: str) -> bool:
        """Remove the blob; False when there was none."""

    # What a byte store may do better than `get` (a folder maps its files); the defaults are `get` itself.
    def map(self, key: str) -> bytes | memoryview:
        """The blob's bytes for a read that is verified and then used in place (a folder maps the file)."""
        return self.get(key)

    def read_private(self, key: str) -> bytes | memoryview:
        """The blob's bytes as this process's own copy, whatever later happens to the stored blob."""
        return self.get(key)

    def size(self, key: str) -> int:
        """The blob's length in bytes (a folder stats the file, S3 asks for the head). NotFoundError when absent."""
        return len(self.get(key))

    def where_of(self, key: str) -> str:
        """Where the blob is, for messages (a folder names the file)."""
        return self.where


class MemoryBytes(ByteStore):
    """A byte store in a dict, for tests (thread-safe; create-if-absent under a lock)."""

    where = "the memory store"

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def create(self, key: str, data: bytes | memoryview) -> bool:
        key = check_key(key)
        with self._lock:
            if key in self.blobs:
                return False
            self.blobs[key] = bytes(data)
            return True

    def get(self, key: str) -> bytes:
        try:
            return self.blobs[check_key(key)]
        except KeyError:
            raise NotFoundError(f"{key} is not in {self.where}") from None

    def contains(self, key: str) -> bool:
        return check_key(key) in self.blobs

    def list(self, prefix: str = "") -> list[str]:
        with self._lock:
            return sorted(k for k in self.blobs if k.startswith(prefix))

    def delete(self, key: str) -> bool:
        with self._lock:
            return self.blobs.pop(check_key(key), None) is not None
