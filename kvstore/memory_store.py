"""`MemoryStore`: the in-memory twin of `LocalStore`, same interface and same admission checks, for tests."""

from __future__ import annotations

import time
from collections.abc import Iterable

from kvstore.errors import IntegrityError, NotFoundError
from kvstore.ids import ArtifactId
from kvstore.store import ArtifactInfo, IndexRow, Store, admit, check_tags


class MemoryStore(Store):
    """In-memory twin of LocalStore (same interface and checks), for tests."""

    def __init__(self) -> None:
        self._data: dict[str, bytes] = {}
        self._info: dict[str, ArtifactInfo] = {}

    def put_bytes(self, data: bytes, tags: Iterable[str] = ()) -> ArtifactId:
        tags = check_tags(tags)
        snap = admit(data)
        aid = ArtifactId.of(data)
        row = IndexRow.of(aid, len(data), snap)
        old = self._info.get(aid)
        self._data[aid] = bytes(data)
        self._info[aid] = ArtifactInfo(aid, row.size, row.token_count, row.tokens_sha256, row.model_fingerprint,
                                       row.model_name, old.created if old else time.time(),
                                       tuple(sorted(set((old.tags if old else ()) + tags))))
        return aid

    def get_bytes(self, aid: str) -> bytes:
        aid = ArtifactId(aid)
        if aid not in self._data:
            raise NotFoundError(f"artifact {aid} is not in the memory store")
        data = self._data[aid]
        if ArtifactId.of(data) != aid:
            raise IntegrityError(f"artifact {aid}: bytes hash to {ArtifactId.of(data)}; it is corrupted")
        return data

    def contains(self, aid: str) -> bool:
        return ArtifactId(aid) in self._data

    def info(self, aid: str) -> ArtifactInfo:
        aid = ArtifactId(aid)
        if aid not in self._info:
            raise NotFoundError(f"artifact {aid} is not in the memory store")
        return self._info[aid]

    def list(self, tag: str | None = None) -> list[ArtifactInfo]:
        return sorted((i for i in self._info.values() if tag is None or tag in i.tags), key=lambda i: i.id)

    def find_tokens(self, tokens_sha256: str) -> list[ArtifactId]:
        return [ArtifactId(i.id) for i in self.list() if i.tokens_sha256 == tokens_sha256]

    def add_tags(self, aid: str, tags: Iterable[str]) -> None:
        """Tag a stored artifact (its bytes are not read)."""
        tags = check_tags(tags)
        old = self.info(aid)
        self._info[old.id] = ArtifactInfo(**{**old.__dict__, "tags": tuple(sorted(set(old.tags) | set(tags)))})

    def remove(self, aid: str) -> None:
        aid = ArtifactId(aid)
        if aid not in self._data:
            raise NotFoundError(f"artifact {aid} is not in the memory store")
        del self._data[aid], self._info[aid]
