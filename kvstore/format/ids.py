"""Artifact ids: a validated value object, and the one pure mapping from an id to its path in a store.

An id is 64 lowercase hex digits: `kvstore.format.artifact.content_id` of the artifact's bytes (BLAKE3-256 for
kvgraft-kv/2, SHA-256 for kvgraft-kv/1). `id_to_relpath` maps it to `objects/ab/cdef...`;
`relpath_to_id` is its inverse and rejects anything that is not exactly such a path.
"""

from __future__ import annotations

from pathlib import Path

from kvstore.errors import InvalidIdError
from kvstore.format.artifact import content_id

_HEX = frozenset("0123456789abcdef")


class ArtifactId(str):
    """A validated artifact id: 64 lowercase hex digits (`content_id` of the artifact's bytes: BLAKE3-256 for
    kvgraft-kv/2, SHA-256 for kvgraft-kv/1)."""

    def __new__(cls, value: str) -> ArtifactId:
        if not isinstance(value, str) or len(value) != 64 or not set(value) <= _HEX:
            raise InvalidIdError(f"{value!r:.80} is not an artifact id (64 lowercase hex digits); see `kvstore ls`")
        return super().__new__(cls, value)

    @classmethod
    def of(cls, data: bytes | bytearray | memoryview, threads: int | None = None) -> ArtifactId:
        """The id of these bytes (kvstore.format.artifact.content_id), hashed on `threads` threads (default: all
        CPUs)."""
        return cls(content_id(data, threads))


def id_to_relpath(aid: str) -> str:
    """objects/<2 hex>/<62 hex> for an id."""
    aid = ArtifactId(aid)
    return f"objects/{aid[:2]}/{aid[2:]}"


def relpath_to_id(rel: str) -> ArtifactId:
    """Inverse of id_to_relpath; rejects anything that is not exactly such a path."""
    parts = Path(rel).parts
    if len(parts) != 3 or parts[0] != "objects" or len(parts[1]) != 2:
        raise InvalidIdError(f"{rel!r} is not an object path (objects/ab/cdef...)")
    return ArtifactId(parts[1] + parts[2])
