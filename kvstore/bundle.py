"""Bundles: carry artifacts (and optionally one solution library) from one store to another as one file.

A bundle is an uncompressed POSIX ustar archive holding a manifest (`kvgraft-bundle.json`), every artifact's
bytes under its object path and, for a library, its `index.jsonl` and `manifest.json` unchanged; the exact
bytes are specified in FORMAT.md section 7.

    info = export_bundle(store, ids, "lib.kvb", library_dir="runs/libraries/aime-v1-...")
    info = import_bundle("lib.kvb", other_store, library_dir="elsewhere/aime-v1-...")

or from the shell: `kvstore export --library DIR -o lib.kvb`, `kvstore import lib.kvb --store DIR`.

Import trusts nothing in the file: it reads the archive with its own strict parser (not `tarfile`), verifies
every member (hash, size, full admission of every artifact) before anything is written, then publishes
through the store's `put_many` and removes what it added if publishing fails. Errors are `BundleError`.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from kvstore.canonical import canonical_json
from kvstore.errors import BundleError, KVStoreError, NotFoundError
from kvstore.format import from_bytes
from kvstore.store import ArtifactId, Store, atomic_write, id_to_relpath
from kvstore.ustar import read_member, tar_members, write_tar

BUNDLE_FORMAT = "kvgraft-bundle/1"
MANIFEST_NAME = "kvgraft-bundle.json"
LIBRARY_FILES = ("index.jsonl", "manifest.json")
MAX_MANIFEST_BYTES = 16 << 20
MAX_LIBRARY_FILE_BYTES = 256 << 20
PUBLISH_BATCH_BYTES = 256 << 20  # artifacts per put_many call (one index transaction), by total size
_FIX = "export the bundle again from its source store with `kvstore export`"


@dataclass(frozen=True)
class BundleInfo:
    """What a bundle holds (export) or what an import did with it."""

    path: Path
    sha256: str  # of the whole bundle file: compare it out of band
    manifest_sha256: str
    artifacts: tuple[str, ...]  # every artifact id in the bundle, ascending
    size: int  # bytes of all artifacts together
    library_manifest_sha256: str | None  # SHA-256 of the library's manifest.json bytes; None without a library
    added: tuple[str, ...] = ()  # import: the ids the target store did not have before
    library_dir: Path | None = None  # export: the library read; import: the folder the library was written to


def _canonical(obj: object) -> bytes:
    """The manifest's bytes (FORMAT.md section 7): kvstore.canonical with ASCII escapes, so ASCII bytes."""
    return canonical_json(obj, ensure_ascii=True).encode("ascii")


def _sha(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------------------------- export


def export_bundle(store: Store, ids: Iterable[str], path: str | os.PathLike,
                  library_dir: str | os.PathLike | None = None) -> BundleInfo:
    """Write the artifacts `ids` (plus every artifact of the library in `library_dir`, and its index.jsonl and
    manifest.json) as one bundle at `path`, which must not exist. Every artifact is read through the store,
    so it is verified (SHA-256 == id) on the way out. The same content always gives the same bundle bytes."""
    path = Path(path)
    if path.exists() or path.is_symlink():
        raise BundleError(f"{path} already exists; remove it or choose another output path")
    wanted = {ArtifactId(i) for i in ids}
    lib: dict[str, bytes] = {}
    if library_dir is not None:
        lib = _read_library(Path(library_dir))
        wanted |= set(_library_artifact_ids(lib["index.jsonl"], f"{library_dir}/index.jsonl"))
    if not wanted:
        raise BundleError("nothing to export: no artifact ids (give ids, --tag with tagged artifacts, or --library)")
    entries = []
    for aid in sorted(wanted):
        size = len(store.get_bytes(aid))  # NotFoundError / IntegrityError name the artifact
        try:
            tags = sorted(store.info(aid).tags)
        except NotFoundError:  # an object without an index row has no tags
            tags = []
        entries.append({"id": str(aid), "size": size, "sha256": str(aid), "tags": tags})
    manifest: dict = {"format": BUNDLE_FORMAT, "artifacts": entries,
                      "library": {n: {"size": len(b), "sha256": _sha(b)} for n, b in lib.items()} or None}
    manifest["manifest_sha256"] = _sha(_canonical(manifest))

    def members() -> Iterator[tuple[str, bytes]]:
        yield MANIFEST_NAME, _canonical(manifest)
        for e in entries:
            data = store.get_bytes(e["id"])  # verified again: the store may have changed since the first pass
            yield id_to_relpath(e["id"]), data
        for name in LIBRARY_FILES if lib else ():
            yield f"library/{name}", lib[name]

    digest = write_tar(path, members())
    return BundleInfo(path, digest, manifest["manifest_sha256"], tuple(e["id"] for e in entries),
                      sum(e["size"] for e in entries), _sha(lib["manifest.json"]) if lib else None,
                      library_dir=Path(library_dir) if library_dir is not None else None)


def _read_library(folder: Path) -> dict[str, bytes]:
    """The bytes of a library folder's index.jsonl and manifest.json, checked against each other."""
    out = {}
    for name in LIBRARY_FILES:
        p = folder / name
        try:
            if p.stat().st_size > MAX_LIBRARY_FILE_BYTES:
                raise BundleError(f"{p} is over the {MAX_LIBRARY_FILE_BYTES >> 20} MiB a bundle carries")
            out[name] = p.read_bytes()
        except OSError as e:
            raise BundleError(f"{folder} is not a library folder (needs index.jsonl and manifest.json): {e}") from None
    _check_library_index(out, str(folder), "rebuild the library (`make library`)")
    return out


def _check_library_index(lib: dict[str, bytes], where: str, fix: str) -> None:
    """The library's manifest.json is JSON and its index_sha256 (when present) is that of index.jsonl."""
    try:
        lm = json.loads(lib["manifest.json"])
    except ValueError as e:
        raise BundleError(f"{where}/manifest.json is not JSON ({e}); {fix}") from None
    if isinstance(lm, dict) and "index_sha256" in lm and lm["index_sha256"] != _sha(lib["index.jsonl"]):
        raise BundleError(f"{where}/index.jsonl does not hash to the index_sha256 in manifest.json: the library was "
                          f"modified; {fix}")


def _library_artifact_ids(index: bytes, where: str) -> list[ArtifactId]:
    """The artifact_id of every row of a library's index.jsonl."""
    ids = []
    for n, line in enumerate(index.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            ids.append(ArtifactId(json.loads(line)["artifact_id"]))
        except (ValueError, KeyError, TypeError) as e:
            raise BundleError(f"{where}, line {n}: no valid artifact_id ({e}); rebuild the library") from None
    return ids


# --------------------------------------------------------------------------------------------- import


def import_bundle(path: str | os.PathLike, store: Store, library_dir: str | os.PathLike | None = None) -> BundleInfo:
    """Verify every byte of the bundle at `path`, then add its artifacts to `store` (ids it already has are left
    as they are) and, when `library_dir` is given and the bundle holds a library, write the library's two files
    there. All or nothing: a refused bundle changes nothing; a failure while publishing removes what this
    import added (FORMAT.md section 7 says what a kill -9 can leave). Raises BundleError."""
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
        manifest, offsets, lib = _verify(f, st.st_size, str(path))
        entries = manifest["artifacts"]
        ids = tuple(e["id"] for e in entries)
        writes = _plan_library(Path(library_dir), lib) if library_dir is not None and lib else []
        new = [e for e in entries if not store.contains(e["id"])]
        stray = [e for e in entries if store.contains(e["id"]) and not _indexed(store, e["id"])]
        written: list[Path] = []
        made_dir = library_dir is not None and bool(lib) and not Path(library_dir).exists()
        try:
            groups: dict[tuple[str, ...], list[dict]] = {}
            for e in new + stray:  # stray: an object without its index row (an earlier import killed mid-way)
                groups.setdefault(tuple(e["tags"]), []).append(e)
            for tags, group in groups.items():
                for batch in _batches(group):  # put_many holds its batch in memory: bound it
                    store.put_many(_reread(f, offsets, batch, str(path)), tags)
            for p, data in writes:
                atomic_write(p, data)
                written.append(p)
        except BaseException:
            _rollback(store, [e["id"] for e in new], written, Path(library_dir) if made_dir else None)
            raise
    lib_sha = manifest["library"]["manifest.json"]["sha256"] if manifest["library"] else None
    return BundleInfo(path, digest, manifest["manifest_sha256"], ids, sum(e["size"] for e in entries), lib_sha,
                      tuple(e["id"] for e in new), Path(library_dir) if library_dir is not None and lib else None)


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
    """Remove the artifacts and library files this import added."""
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


def _plan_library(folder: Path, lib: dict[str, bytes]) -> list[tuple[Path, bytes]]:
    """The library files to write into `folder` (index.jsonl first, manifest.json last); refuses a folder that
    holds other bytes under those names. Files already there with the same bytes are not rewritten."""
    writes = []
    for name in LIBRARY_FILES:
        p = folder / name
        if p.exists():
            if p.read_bytes() != lib[name]:
                raise BundleError(f"{p} exists and differs from the bundle's library/{name}: {folder} holds another "
                                  "library. Choose another library folder (--library-dir) or remove that one")
            continue
        writes.append((p, lib[name]))
    return writes


def _verify(f: BinaryIO, file_size: int, where: str) -> tuple[dict, dict[str, tuple[int, int]], dict[str, bytes]]:
    """Check the whole archive: the manifest, then every member against it. Returns the manifest, each member's
    (data offset, size), and the library files' bytes. Nothing is written."""
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
    for lname, e in (manifest["library"] or {}).items():
        expected[f"library/{lname}"] = ("library", e)
    offsets: dict[str, tuple[int, int]] = {}
    lib: dict[str, bytes] = {}
    for name, off, size in it:
        if name in offsets or name == MANIFEST_NAME:
            raise BundleError(f"{where}: member {name!r} appears twice; a bundle holds each member once. {_FIX}")
        if name not in expected:
            raise BundleError(f"{where}: member {name!r} is not listed in {MANIFEST_NAME}; refusing the bundle. {_FIX}")
        kind, e = expected[name]
        if size != e["size"]:
            raise BundleError(f"{where}: member {name} is {size} bytes, the manifest lists {e['size']}. {_FIX}")
        offsets[name] = (off, size)
        data = read_member(f, off, size, name, where)
        got = ArtifactId.of(data) if kind == "artifact" else _sha(data)  # an artifact's sha256 field is its id
        if got != e["sha256"]:
            raise BundleError(f"{where}: member {name} hashes to {got[:16]}..., the manifest lists "
                              f"{e['sha256'][:16]}...: the bundle is damaged or was altered. {_FIX}")
        if kind == "artifact":
            try:
                from_bytes(data, verify_tensors=True)  # the admission a store's put applies
            except KVStoreError as ex:
                raise BundleError(f"{where}: member {name} is refused by admission: {ex}. {_FIX}") from ex
        else:
            lib[name.removeprefix("library/")] = data
    missing = sorted(set(expected) - set(offsets))
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise BundleError(f"{where}: {len(missing)} listed member(s) missing from the archive ({shown}); the bundle is "
                          f"incomplete. {_FIX}")
    if lib:
        listed = set(expected)
        for aid in _library_artifact_ids(lib["index.jsonl"], f"{where}: library/index.jsonl"):
            if id_to_relpath(aid) not in listed:
                raise BundleError(f"{where}: library/index.jsonl names artifact {aid}, which the bundle does not "
                                  f"carry. {_FIX}")
        _check_library_index(lib, f"{where}: library", _FIX)
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
    if not isinstance(m, dict) or set(m) != {"format", "artifacts", "library", "manifest_sha256"}:
        keys = sorted(m) if isinstance(m, dict) else type(m).__name__
        raise BundleError(f"{bad}: expected the keys artifacts, format, library, manifest_sha256, got {keys}. {_FIX}")
    if m["format"] != BUNDLE_FORMAT:
        raise BundleError(f"{bad}: format {m['format']!r} is not one this kvgraft reads ({BUNDLE_FORMAT}); import it "
                          "with the kvgraft version that exported it, or export it again with this one")
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
    lib = m["library"]
    if lib is not None:
        if not isinstance(lib, dict) or set(lib) != set(LIBRARY_FILES):
            raise BundleError(f"{bad}: library must be null or have exactly {', '.join(LIBRARY_FILES)}. {_FIX}")
        for name, e in lib.items():
            if (not isinstance(e, dict) or set(e) != {"size", "sha256"}
                    or not _is_size(e["size"], MAX_LIBRARY_FILE_BYTES)
                    or not isinstance(e["sha256"], str) or len(e["sha256"]) != 64):
                raise BundleError(f"{bad}: library {name}: needs size (at most {MAX_LIBRARY_FILE_BYTES >> 20} MiB) and "
                                  f"a 64-digit sha256. {_FIX}")
    return m


def _is_size(x: object, limit: int | None) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0 and (limit is None or x <= limit)
