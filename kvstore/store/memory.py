"""`MemoryStore`: the in-memory twin of `LocalStore`, for tests: an ObjectStore over a dict of blobs.

Same interface and the same admission, verification and index as every store on a byte store (the S3 store
included: kvstore/store/objects.py), so a test on a MemoryStore exercises the code a shared bucket runs.
"""

from __future__ import annotations

from kvstore.store.byte_store import MemoryBytes
from kvstore.store.objects import ObjectsById, ObjectStore


class MemoryStore(ObjectStore):
    """In-memory twin of LocalStore (same interface and checks), for tests."""

    def __init__(self) -> None:
        super().__init__(MemoryBytes())

    def __repr__(self) -> str:
        return "MemoryStore()"

    @property
    def _data(self) -> ObjectsById:
        """The stored artifact bytes by id, raw: tests damage objects through it."""
        return ObjectsById(self.blobs)
