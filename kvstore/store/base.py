"""What every artifact store shares: the index fields of an admitted artifact, the admission and read checks, and the
`Store` interface (put / get / contains / list, tags and token lookups) that the harness and the CLI use.

    admit(data)                 every FORMAT.md invariant and every tensor hash, before anything is written
    check_id(aid, data, where)  every read: the bytes hash to their id, or IntegrityError naming where they were
    check_tags(tags)            tags are 1-256 character strings

The one implementation of the interface is kvstore.store.objects.ObjectStore (admission, verification and the
index, once, over any byte store); LocalStore, MemoryStore and S3Store are ObjectStores over a directory, a dict
and a bucket (kvstore/store/local.py, kvstore/store/memory.py, kvstore/store/s3.py).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from kvstore.errors import FormatError, IntegrityError, InvalidIdError, KVStoreError, NotFoundError
from kvstore.format.artifact import NumericsRecord, Snapshot, from_bytes, guard, to_bytes, tokens_sha256
from kvstore.format.ids import ArtifactId
from kvstore.format.measured import measured_fingerprint


@dataclass(frozen=True)
class IndexRow:
    """The index fields of an admitted artifact, taken from its validated snapshot (never from raw metadata)."""

    id: str
    size: int
    token_count: int
    tokens_sha256: str
    model_fingerprint: str
    model_name: str

    @classmethod
    def of(cls, aid: str, size: int, snap: Snapshot) -> IndexRow:
        return cls(aid, size, snap.token_count, tokens_sha256(snap.token_ids), snap.model_fingerprint,
                   snap.model_name)


@dataclass(frozen=True)
class ArtifactInfo(IndexRow):
    """One index row as a store lists it: the admitted fields plus when it was stored and its tags."""

    created: float
    tags: tuple[str, ...]


def admit(data: bytes | memoryview, verify_tensors: bool = True) -> Snapshot:
    """Check bytes entering a store completely (structure, every invariant of FORMAT.md section 6, every
    tensor's SHA-256) and return their snapshot. Every stored object is therefore valid, and a read only has
    to check that the file still hashes to its id: that one SHA-256 covers every byte, tensors included.
    verify_tensors=False only for bytes to_bytes has just written (their tensor hashes are computed, not read)."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise FormatError(f"artifact bytes must be bytes, got {type(data).__name__}")
    return from_bytes(data, verify_tensors=verify_tensors)


def check_id(aid: str, data: bytes | memoryview, where: str, got: str | None = None) -> None:
    """Raise IntegrityError unless the bytes hash to `aid` (got: their hash, when already computed); `where` names
    the object (a file, a bucket key) in the message. Every store's reads end here."""
    got = got or ArtifactId.of(data)
    if got != aid:
        raise IntegrityError(
            f"artifact {aid} in {where}: bytes hash to {got[:12]}... ({len(data)} bytes): corrupted or truncated, or "
            "replaced. Remove it (`kvstore rm ID`) and deposit it again."
        )


NUMERICS_PREFIX = "numerics:"  # kvstore.environment.NUMERICS_TAG: the store tag of a numerics measurement


def check_tags(tags: Iterable[str]) -> tuple[str, ...]:
    out = tuple(tags)
    if not all(isinstance(t, str) and 0 < len(t) <= 256 for t in out):
        raise KVStoreError(f"tags must be non-empty strings of at most 256 characters, got {out!r:.120}")
    return out


def check_numerics_tags(tags: tuple[str, ...], doing: str) -> None:
    """KVStoreError for a `numerics:` tag given as a tag (add_tags, put, put_bytes, put_many): the numerics record
    is a measurement, written only from a measured snapshot's record (a deposit's put, or the put of a recomputation
    that reproduced the bytes: kvstore/format/measured.py), never from a string."""
    bad = [t for t in tags if t.startswith(NUMERICS_PREFIX)]
    if bad:
        raise KVStoreError(
            f"{doing}: {bad[0][:40]!r} is a numerics record, not a free tag: it is written only by what measured it "
            "(a deposit's put, or `kvstore reverify ID`, which recomputes the artifact here and puts what it "
            "measured); deposit the artifact again on this machine instead of tagging it")


def claim_problem(record: NumericsRecord | None, aid: str) -> str:
    """Why `record_numerics` will not write `record` for `aid` ("" when it will)."""
    if measured_fingerprint(record, aid) is None:
        return (f"artifact {aid}: the numerics record offered ({type(record).__name__}) is not a measurement this "
                "process issued for these bytes (a capture's): a claim is not recorded (issue 61); recompute the "
                "artifact here (`kvstore reverify ID`) and put what was measured")
    return ""


def snapshot_numerics_tags(snapshot: Snapshot, aid: str) -> tuple[str, ...]:
    """The `numerics:` tag a put records for a snapshot stored as `aid`: the fingerprint of the measurement its
    record carries, issued in this process by the capture that computed exactly these bytes (kvstore/format/
    measured.py); () for every other record: one read from another store or a bundle, built by hand, pickled from
    another process, or a capture changed since. Those are claims, and a claim is not a record (issue 61)."""
    fp = measured_fingerprint(snapshot.numerics, aid)
    return (NUMERICS_PREFIX + fp,) if fp else ()


class Store(ABC):
    """The store interface: put / get / contains / iterate, plus tags and token lookups."""

    @abstractmethod
    def put_bytes(self, data: bytes, tags: Iterable[str] = ()) -> ArtifactId:
        """Admit artifact bytes (fully validated first); returns their id. Existing ids only gain tags."""

    @abstractmethod
    def get_bytes(self, aid: str) -> bytes:
        """The artifact's bytes, checked to hash to `aid`. NotFoundError, IntegrityError."""

    @abstractmethod
    def contains(self, aid: str) -> bool:
        """Whether the artifact is stored."""

    @abstractmethod
    def info(self, aid: str) -> ArtifactInfo:
        """The artifact's index row. NotFoundError."""

    @abstractmethod
    def list(self, tag: str | None = None) -> list[ArtifactInfo]:
        """Index rows (with `tag` only, when given), by id."""

    @abstractmethod
    def find_tokens(self, tokens_sha256: str) -> list[ArtifactId]:
        """Ids of the artifacts holding exactly the token ids with this SHA-256."""

    @abstractmethod
    def remove(self, aid: str) -> None:
        """Delete an artifact and its index row. NotFoundError."""

    @abstractmethod
    def add_tags(self, aid: str, tags: Iterable[str]) -> None:
        """Tag a stored artifact (its bytes are not read). NotFoundError."""

    def put(self, snapshot: Snapshot, tags: Iterable[str] = ()) -> ArtifactId:
        """Store a snapshot; returns its id. Putting an existing artifact only adds tags. A `numerics:` tag is
        refused (check_numerics_tags); the snapshot's own measured record is written (snapshot_numerics_tags)."""
        with guard("snapshot to store"):
            data = to_bytes(snapshot)
        tags = check_tags(tags)
        check_numerics_tags(tags, "putting an artifact")
        aid = self.put_bytes(data, tags)
        if snapshot_numerics_tags(snapshot, aid):
            self.record_numerics(aid, snapshot.numerics)
        return aid

    def put_many(self, items: Iterable[Snapshot | bytes], tags: Iterable[str] = ()) -> list[ArtifactId]:
        """Store many snapshots (or artifact bytes), each with `tags`; their ids in order. Same result as a
        loop of put/put_bytes; a store may batch it (LocalStore indexes them in one transaction)."""
        tags = check_tags(tags)
        check_numerics_tags(tags, "putting artifacts")
        return [self.put(x, tags) if isinstance(x, Snapshot) else self.put_bytes(x, tags) for x in items]

    def get(self, aid: str) -> Snapshot:
        """The verified snapshot: the bytes hash to the id before any tensor is returned (tensors were checked
        one by one when the artifact entered the store), with the store's numerics record attached
        (`numerics_record`). Raises NotFoundError, IntegrityError."""
        snapshot = from_bytes(self.get_bytes(aid), verify_tensors=False)
        snapshot.numerics = self.numerics_record(aid)
        return snapshot

    def numerics_record(self, aid: str) -> NumericsRecord:
        """The numerics fingerprints this store records for the artifact (its `numerics:` tags; none: not
        recorded, also when it has no index row). A lookup that fails is a record with `error` set: admission
        refuses it, as it refuses no record (absent evidence is not evidence)."""
        where = f"{self!r}"
        try:
            tags = self.info(aid).tags
        except NotFoundError:
            return NumericsRecord((), f"{where} (no index row)")
        except (KVStoreError, OSError) as e:
            return NumericsRecord((), where, f"{type(e).__name__}: {e}")
        return NumericsRecord(tuple(sorted(t[len(NUMERICS_PREFIX):] for t in tags if t.startswith(NUMERICS_PREFIX))),
                              where)

    def record_numerics(self, aid: str, record: NumericsRecord) -> None:
        """Write the numerics record of a stored artifact from `record`, which must carry a measurement issued in
        this process for exactly its bytes (kvstore/format/measured.py; a capture's): it replaces every numerics tag
        the artifact had. Anything else (a fingerprint string, a record read elsewhere or built by hand) is refused
        (KVStoreError): a re-verification puts the recomputed snapshot, whose capture measured it. NotFoundError."""
        raise KVStoreError(f"{self!r} cannot record numerics; re-deposit the artifact into a writable store")

    def size(self, aid: str) -> int:
        """The artifact's size in bytes (its index row's, where the store has no better answer). NotFoundError."""
        return self.info(aid).size

    def __contains__(self, aid: object) -> bool:
        try:
            return isinstance(aid, str) and self.contains(aid)
        except InvalidIdError:
            return False

    def __iter__(self) -> Iterator[ArtifactId]:
        return iter([ArtifactId(i.id) for i in self.list()])

    def __len__(self) -> int:
        return len(self.list())

    def verify(self, aid: str) -> None:
        """Re-hash an artifact's bytes and tensors and re-check every invariant; raises IntegrityError,
        FormatError or ValidationError if it is damaged."""
        from_bytes(self.get_bytes(aid), verify_tensors=True)


__all__ = ["NUMERICS_PREFIX", "ArtifactInfo", "IndexRow", "Store", "admit", "check_id", "check_numerics_tags",
           "check_tags", "claim_problem", "snapshot_numerics_tags"]
