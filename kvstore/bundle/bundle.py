"""Bundles: carry artifacts, and named opaque attachment files, from one store to another as one file.

A bundle is an uncompressed POSIX ustar archive holding a manifest (`kvgraft-bundle.json`), every artifact's
bytes under its object path and each attachment's bytes unchanged under `attachments/<name>`; the exact bytes
are specified in FORMAT.md section 7. The engine does not know what an attachment means: the caller chooses
the files and checks them (`check=`) before an import writes anything. The harness's solution library travels
this way (harness/library/bundle.py: its index and manifest as attachments, its entries' artifacts).

    info = export_bundle(store, ids, "b.kvb", attachments={"notes.txt": b"..."})
    info = import_bundle("b.kvb", other_store, attachments_dir="elsewhere/")

or from the shell: `kvstore export ID... --attach FILE -o b.kvb`, `kvstore import b.kvb --attachments-dir DIR`.

Import trusts nothing in the file: it reads the archive with its own strict parser (not `tarfile`), verifies
every member (hash, size, full admission of every artifact) before anything is written, then publishes
through the store's `put_many` and removes what it added if publishing fails. Errors are `BundleError`.

Memory is bounded by one artifact, whatever the attachments hold (FORMAT.md allows 64 of 256 MiB): attachments are
hashed in 1 MiB chunks as they are verified, handed to `check` as a mapping that reads one when asked (and hashes
it again), and copied from the bundle to their temp files in chunks, hashed once more on the way.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from kvstore.atomic import atomic_file
from kvstore.bundle.ustar import read_member, tar_members, write_tar
from kvstore.errors import BundleError, KVStoreError, NotFoundError
from kvstore.format.artifact import from_bytes
from kvstore.format.canonical import canonical_json
from kvstore.format.ids import ArtifactId, id_to_relpath
from kvstore.store.base import NUMERICS_PREFIX, Store

BUNDLE_FORMAT = "kvgraft-bundle/2"
# format -> the manifest key (and member folder) of the attachments: /1 called them "library" (then always the
# two files of a harness library, or null); /2 holds any named files. Both are read.
ATTACHMENTS_KEY = {"kvgraft-bundle/1": "library", "kvgraft-bundle/2": "attachments"}
MANIFEST_NAME = "kvgraft-bundle.json"
MAX_MANIFEST_BYTES = 16 << 20
MAX_ATTACHMENT_BYTES = 256 << 20
MAX_ATTACHMENTS = 64
_ATTACHMENT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")  # one safe path component
PUBLISH_BATCH_BYTES = 256 << 20  # artifacts per put_many call (one index transaction), by total size
CHUNK = 1 << 20  # attachments are hashed and copied this much at a time
_FIX = "export the bundle again from its source store with `kvstore export`"


@dataclass(frozen=True)
class BundleInfo:
    """What a bundle holds (export) or what an import did with it."""

    path: Path
    sha256: str  # of the whole bundle file: compare it out of band
    manifest_sha256: str
    artifacts: tuple[str, ...]  # every artifact id in the bundle, ascending
    size: int  # bytes of all artifacts together
    attachments: dict[str, str]  # name -> SHA-256 of the attachment's bytes (empty without attachments)
    added: tuple[str, ...] = ()  # import: the ids the target store did not have before
    attachments_dir: Path | None = None  # import: the folder the attachments were written to (None: not written)
    # import: ids whose `numerics:` tags in the bundle were not recorded here: another machine's claim, never this
    # store's record (issue 61); a graft refuses them until re-verified here (`kvstore reverify ID`)
    claims: tuple[str, ...] = ()


def _canonical(obj: object) -> bytes:
    """The manifest's bytes (FORMAT.md section 7): kvstore.format.canonical with ASCII escapes, so ASCII bytes."""
    return canonical_json(obj, ensure_ascii=True).encode("ascii")


def _sha(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------------------------- export


def export_bundle(store: Store, ids: Iterable[str], path: str | os.PathLike,
                  attachments: Mapping[str, bytes] | None = None) -> BundleInfo:
    """Write the artifacts `ids` and the `attachments` (name -> bytes, carried unchanged) as one bundle at
    `path`, which must not exist. Every artifact is read through the store, so it is verified (its bytes hash to
    its id) on the way out. The same content always gives the same bundle bytes."""
    path = Path(path)
    if path.exists() or path.is_symlink():
        raise BundleError(f"{path} already exists; remove it or choose another output path")
    files = dict(sorted((attachments or {}).items()))
    for name, data in files.items():
        _check_attachment(name, len(data), f"export to {path}")
    if len(files) > MAX_ATTACHMENTS:
        raise BundleError(f"export to {path}: {len(files)} attachments, over the {MAX_ATTACHMENTS} a bundle carries")
    wanted = sorted({ArtifactId(i) for i in ids})
    if not wanted:
        raise BundleError("nothing to export: no artifact ids (give ids, or --tag with tagged artifacts)")
    entries = []
    for aid in wanted:
        size = len(store.get_bytes(aid))  # NotFoundError / IntegrityError name the artifact
        try:
            tags = sorted(store.info(aid).tags)
        except NotFoundError:  # an object without an index row has no tags
            tags = []
        entries.append({"id": str(aid), "size": size, "sha256": str(aid), "tags": tags})
    listed = {n: {"size": len(b), "sha256": _sha(b)} for n, b in files.items()}
    manifest: dict = {"format": BUNDLE_FORMAT, "artifacts": entries, "attachments": listed}
    manifest["manifest_sha256"] = _sha(_canonical(manifest))

    def members() -> Iterator[tuple[str, bytes]]:
        yield MANIFEST_NAME, _canonical(manifest)
        for e in entries:
            data = store.get_bytes(e["id"])  # verified again: the store may have changed since the first pass
            yield id_to_relpath(e["id"]), data
        for name, data in files.items():
            yield f"attachments/{name}", data

    digest = write_tar(path, members())
    return BundleInfo(path, digest, manifest["manifest_sha256"], tuple(e["id"] for e in entries),
                      sum(e["size"] for e in entries), {n: e["sha256"] for n, e in listed.items()})


def _check_attachment(name: object, size: int, where: str) -> None:
    if not isinstance(name, str) or not _ATTACHMENT_NAME.fullmatch(name):
        raise BundleError(f"{where}: attachment name {name!r:.80} is not one safe file name (letters, digits, '.', "
                          "'_', '-'; at most 128 characters; not starting with '.' or '-'); rename the file")
    if size > MAX_ATTACHMENT_BYTES:
        raise BundleError(f"{where}: attachment {name} is {size} bytes, over the {MAX_ATTACHMENT_BYTES >> 20} MiB a "
                          "bundle carries")


# --------------------------------------------------------------------------------------------- import


def import_bundle(path: str | os.PathLike, store: Store, attachments_dir: str | os.PathLike | None = None,
                  check: Callable[[Mapping[str, bytes], frozenset[str]], None] | None = None) -> BundleInfo:
    """Verify every byte of the bundle at `path`, then add its artifacts to `store` (ids it already has are left
    as they are) and, when `attachments_dir` is given and the bundle has attachments, write them there.

    `check(attachments, artifact_ids)` runs after the bundle is verified and before anything is written: the
    caller's own test of what the attachments mean (raise to refuse). `attachments` maps each name to its bytes,
    read from the bundle (and hashed again) when asked, during the call only: memory holds what `check` reads.
    All or nothing: a refused bundle changes
    nothing; a failure while publishing removes what this import added (FORMAT.md section 7 says what a kill -9
    can leave). Raises BundleError (or what `check` raises)."""
    target = Path(attachments_dir) if attachments_dir is not None else None
    path = Path(path)
    try:
        f = open(path, "rb")  # noqa: SIM115 - held open across both passes
    except OSError as e:
        raise BundleError(f"cannot open bundle {path}: {e}") from None
    with f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise BundleError(f"{path} is not a regular file; give the bundle file written by `kvstore export`")
        digest = hashlib.file_digest(f, "sha256").hexdigest()
        manifest, offsets, files = _verify(f, st.st_size, str(path))
        entries = manifest["artifacts"]
        ids = tuple(e["id"] for e in entries)
        if check is not None:
            check(_Attachments(f, files, str(path)), frozenset(ids))
        writes = _plan_attachments(target, files) if target is not None and files else []
        new = [e for e in entries if not store.contains(e["id"])]
        stray = [e for e in entries if store.contains(e["id"]) and not _indexed(store, e["id"])]
        written: list[Path] = []
        made_dir = target is not None and bool(files) and not target.exists()
        try:
            groups: dict[tuple[str, ...], list[dict]] = {}
            for e in new + stray:  # stray: an object without its index row (an earlier import killed mid-way)
                # a numerics tag is another machine's claim (a manifest is re-sealable): not written (issue 61)
                groups.setdefault(tuple(t for t in e["tags"] if not t.startswith(NUMERICS_PREFIX)), []).append(e)
            for tags, group in groups.items():
                for batch in _batches(group):  # put_many holds its batch in memory: bound it
                    store.put_many(_reread(f, offsets, batch, str(path)), tags)
            for p, name in writes:
                _copy_attachment(f, files[name], p, name, str(path))
                written.append(p)
        except BaseException:
            _rollback(store, [e["id"] for e in new], written, target if made_dir else None)
            raise
    listed = manifest[ATTACHMENTS_KEY[manifest["format"]]] or {}
    return BundleInfo(path, digest, manifest["manifest_sha256"], ids, sum(e["size"] for e in entries),
                      {n: e["sha256"] for n, e in listed.items()}, tuple(e["id"] for e in new),
                      target if files else None,
                      tuple(e["id"] for e in entries if any(t.startswith(NUMERICS_PREFIX) for t in e["tags"])))


def _batches(entries: list[dict]) -> Iterator[list[dict]]:
    """Consecutive runs of entries of at most PUBLISH_BATCH_BYTES together (at least one entry each)."""
    limit = PUBLISH_BATCH_BYTES
    batch: list[dict] = []
    size = 0
    for e in entries:
        if batch and size + e["size"] > limit:
            yield batch
            batch, size = [], 0
        batch.append(e)
        size += e["size"]
    if batch:
        yield batch


def _indexed(store: Store, aid: str) -> bool:
    try:
        store.info(aid)
        return True
    except NotFoundError:
        return False


def _reread(f: BinaryIO, offsets: dict[str, tuple[int, int]], entries: list[dict], where: str) -> Iterator[bytes]:
    """The verified artifacts' bytes again, one at a time, each checked once more against its id."""
    for e in entries:
        name = id_to_relpath(e["id"])
        off, size = offsets[name]
        f.seek(off)
        data = f.read(size)
        if ArtifactId.of(data) != e["id"]:
            raise BundleError(f"{where}: member {name} changed while it was being imported; nothing was kept. "
                              "Leave the bundle file alone during `kvstore import` and run it again")
        yield data


def _rollback(store: Store, new_ids: list[str], written: list[Path], made_dir: Path | None) -> None:
    """Remove the artifacts and attachment files this import added."""
    for p in written:
        p.unlink(missing_ok=True)
    if made_dir is not None:
        try:
            made_dir.rmdir()
        except OSError:
            pass
    for aid in new_ids:
        try:
            store.remove(aid)
        except NotFoundError:
            pass


@dataclass(frozen=True)
class _Member:
    """Where a verified attachment lies in the bundle file, and its SHA-256."""

    offset: int
    size: int
    sha256: str


def _hash_member(f: BinaryIO, off: int, size: int, name: str, where: str,
                 sink: Callable[[bytes], object] | None = None) -> str:
    """SHA-256 of a member's bytes, read CHUNK at a time (each chunk also given to `sink`)."""
    h = hashlib.sha256()
    f.seek(off)
    left = size
    while left:
        chunk = f.read(min(CHUNK, left))
        if not chunk:
            raise BundleError(f"{where}: member {name} is truncated ({size - left} of {size} bytes). {_FIX}")
        h.update(chunk)
        if sink is not None:
            sink(chunk)
        left -= len(chunk)
    return h.hexdigest()


class _Attachments(Mapping[str, bytes]):
    """The verified attachments as `check` sees them: each read from the bundle when asked, hashed again."""

    def __init__(self, f: BinaryIO, members: dict[str, _Member], where: str) -> None:
        self._f, self._members, self._where = f, members, where

    def __getitem__(self, name: str) -> bytes:
        m = self._members[name]
        data = read_member(self._f, m.offset, m.size, name, self._where)
        if _sha(data) != m.sha256:
            raise BundleError(f"{self._where}: attachment {name} changed while it was being imported; nothing was "
                              "kept. Leave the bundle file alone during `kvstore import` and run it again")
        return data

    def __iter__(self) -> Iterator[str]:
        return iter(self._members)

    def __len__(self) -> int:
        return len(self._members)


def _copy_attachment(f: BinaryIO, m: _Member, path: Path, name: str, where: str) -> None:
    """Copy one attachment from the bundle to `path` (atomically, CHUNK at a time), checking its hash on the way;
    a full disk is one BundleError naming the file."""
    try:
        with atomic_file(path) as out:
            got = _hash_member(f, m.offset, m.size, name, where, sink=out.write)
            if got != m.sha256:
                raise BundleError(f"{where}: attachment {name} changed while it was being imported; nothing was "
                                  "kept. Leave the bundle file alone during `kvstore import` and run it again")
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise BundleError(f"{path}: no space left on the device while writing the bundle's attachment {name} "
                              f"({m.size} bytes) from {where}; nothing of this import was kept. Free space there "
                              "(`df -h`) or choose another folder (--attachments-dir), then import again") from None
        raise


def _plan_attachments(folder: Path, files: dict[str, _Member]) -> list[tuple[Path, str]]:
    """The attachments to write into `folder` (path, name), in name order (a caller that needs one written last
    names it so); refuses a folder that holds other bytes under one of those names. Files already there with the
    same bytes are not rewritten."""
    writes = []
    for name in sorted(files):
        p = folder / name
        if p.exists():
            same = False
            if p.is_file() and p.stat().st_size == files[name].size:
                with open(p, "rb") as existing:
                    same = _hash_member(existing, 0, files[name].size, name, str(p)) == files[name].sha256
            if not same:
                raise BundleError(f"{p} exists and differs from the bundle's attachment {name}: {folder} holds other "
                                  "files. Choose another folder (--attachments-dir) or remove that one")
            continue
        writes.append((p, name))
    return writes


def _verify(f: BinaryIO, file_size: int, where: str) -> tuple[dict, dict[str, tuple[int, int]], dict[str, _Member]]:
    """Check the whole archive: the manifest, then every member against it. Returns the manifest, each member's
    (data offset, size), and where each attachment lies (hashed CHUNK at a time: none is held). Nothing is
    written."""
    it = tar_members(f, file_size, where)
    first = next(it, None)
    if first is None:
        raise BundleError(f"{where}: empty archive, no {MANIFEST_NAME}; this is not a kvgraft bundle, {_FIX}")
    name, off, size = first
    if name != MANIFEST_NAME:
        raise BundleError(f"{where}: first member is {name!r}, not {MANIFEST_NAME}; not a kvgraft bundle, {_FIX}")
    if size > MAX_MANIFEST_BYTES:
        raise BundleError(f"{where}: member {MANIFEST_NAME} is {size} bytes, over the {MAX_MANIFEST_BYTES >> 20} MiB "
                          f"limit; refusing to read it. Split the export into smaller bundles, or {_FIX}")
    manifest = _parse_manifest(read_member(f, off, size, name, where), where)
    expected: dict[str, tuple[str, dict]] = {id_to_relpath(e["id"]): ("artifact", e) for e in manifest["artifacts"]}
    folder = ATTACHMENTS_KEY[manifest["format"]]
    for aname, e in (manifest[folder] or {}).items():
        expected[f"{folder}/{aname}"] = ("attachment", e)
    offsets: dict[str, tuple[int, int]] = {}
    lib: dict[str, _Member] = {}
    for name, off, size in it:
        if name in offsets or name == MANIFEST_NAME:
            raise BundleError(f"{where}: member {name!r} appears twice; a bundle holds each member once. {_FIX}")
        if name not in expected:
            raise BundleError(f"{where}: member {name!r} is not listed in {MANIFEST_NAME}; refusing the bundle. {_FIX}")
        kind, e = expected[name]
        if size != e["size"]:
            raise BundleError(f"{where}: member {name} is {size} bytes, the manifest lists {e['size']}. {_FIX}")
        offsets[name] = (off, size)
        data = read_member(f, off, size, name, where) if kind == "artifact" else b""
        # an artifact's sha256 field is its id
        got = ArtifactId.of(data) if kind == "artifact" else _hash_member(f, off, size, name, where)
        if got != e["sha256"]:
            raise BundleError(f"{where}: member {name} hashes to {got[:16]}..., the manifest lists "
                              f"{e['sha256'][:16]}...: the bundle is damaged or was altered. {_FIX}")
        if kind == "artifact":
            try:
                from_bytes(data, verify_tensors=True)  # the admission a store's put applies
            except KVStoreError as ex:
                raise BundleError(f"{where}: member {name} is refused by admission: {ex}. {_FIX}") from ex
        else:
            lib[name.removeprefix(f"{folder}/")] = _Member(off, size, got)
    missing = sorted(set(expected) - set(offsets))
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise BundleError(f"{where}: {len(missing)} listed member(s) missing from the archive ({shown}); the bundle is "
                          f"incomplete. {_FIX}")
    return manifest, offsets, lib


def _no_duplicate_keys(pairs: list[tuple[str, object]]) -> dict:
    out: dict = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r}")
        out[k] = v
    return out


def _parse_manifest(data: bytes, where: str) -> dict:
    """The bundle manifest, checked field by field (FORMAT.md section 7)."""
    bad = f"{where}: {MANIFEST_NAME}"
    try:
        m = json.loads(data.decode("ascii"), object_pairs_hook=_no_duplicate_keys)
    except ValueError as e:
        raise BundleError(f"{bad} is not valid ASCII JSON ({e}). {_FIX}") from None
    if not isinstance(m, dict):
        raise BundleError(f"{bad}: expected a JSON object, got {type(m).__name__}. {_FIX}")
    fmt = m.get("format")
    if not isinstance(fmt, str) or fmt not in ATTACHMENTS_KEY:
        raise BundleError(f"{bad}: format {fmt!r:.80} is not one this kvgraft reads ({', '.join(ATTACHMENTS_KEY)}); "
                          "import it with the kvgraft version that exported it, or export it again with this one")
    key = ATTACHMENTS_KEY[fmt]
    if set(m) != {"format", "artifacts", key, "manifest_sha256"}:
        raise BundleError(f"{bad}: expected the keys artifacts, {key}, format, manifest_sha256, got {sorted(m)}. "
                          f"{_FIX}")
    if _canonical(m) != data:
        raise BundleError(f"{bad} is not canonical JSON (sorted keys, no spaces); it was not written by kvstore export "
                          f"or was edited. {_FIX}")
    body = {k: v for k, v in m.items() if k != "manifest_sha256"}
    if m["manifest_sha256"] != _sha(_canonical(body)):
        raise BundleError(f"{bad}: manifest_sha256 does not match its content: the manifest is damaged. {_FIX}")
    if not isinstance(m["artifacts"], list):
        raise BundleError(f"{bad}: artifacts must be a list. {_FIX}")
    seen: set[str] = set()
    for i, e in enumerate(m["artifacts"]):
        if not isinstance(e, dict) or set(e) != {"id", "size", "sha256", "tags"}:
            raise BundleError(f"{bad}: artifacts[{i}] must have exactly id, sha256, size, tags. {_FIX}")
        try:
            aid = ArtifactId(e["id"])
        except KVStoreError as ex:
            raise BundleError(f"{bad}: artifacts[{i}]: {ex}. {_FIX}") from None
        if aid in seen:
            raise BundleError(f"{bad}: artifact {aid} is listed twice; a bundle lists each id once. {_FIX}")
        seen.add(aid)
        if e["sha256"] != aid:
            raise BundleError(f"{bad}: artifact {aid}: sha256 {str(e['sha256'])[:16]}... differs from its id, which "
                              f"is the SHA-256 of its bytes. {_FIX}")
        if not _is_size(e["size"], None) or e["size"] == 0:
            raise BundleError(f"{bad}: artifact {aid}: size {e['size']!r} is not a positive integer. {_FIX}")
        if not isinstance(e["tags"], list) or not all(isinstance(t, str) and 0 < len(t) <= 256 for t in e["tags"]):
            raise BundleError(f"{bad}: artifact {aid}: tags must be a list of strings of 1-256 characters. {_FIX}")
    files = m[key]
    if files is None and fmt == "kvgraft-bundle/1":  # /1 wrote null for "no library"
        return m
    if not isinstance(files, dict) or len(files) > MAX_ATTACHMENTS:
        raise BundleError(f"{bad}: {key} must be an object of at most {MAX_ATTACHMENTS} files. {_FIX}")
    for name, e in files.items():
        if (not isinstance(e, dict) or set(e) != {"size", "sha256"} or not _is_size(e["size"], MAX_ATTACHMENT_BYTES)
                or not isinstance(e["sha256"], str) or len(e["sha256"]) != 64):
            raise BundleError(f"{bad}: {key} {name!r:.80}: needs size (at most {MAX_ATTACHMENT_BYTES >> 20} MiB) and a "
                              f"64-digit sha256. {_FIX}")
        _check_attachment(name, e["size"], bad)
    return m


def _is_size(x: object, limit: int | None) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0 and (limit is None or x <= limit)
