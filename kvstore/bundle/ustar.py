"""The strict POSIX ustar reader and deterministic writer behind bundles (kvstore/bundle/bundle.py, FORMAT.md section
7).

The reader trusts nothing: only regular files with safe relative names, checked header checksums, no data
hidden after the end-of-archive marker. Every refusal is a `BundleError` naming the bundle and the member.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from kvstore.atomic import atomic_file
from kvstore.errors import BundleError

_BLOCK = 512
_FIX = "export the bundle again from its source store with `kvstore export`"
_TYPES = {b"1": "hard link", b"2": "symbolic link", b"3": "character device", b"4": "block device",
          b"5": "directory", b"6": "FIFO", b"7": "contiguous file", b"x": "pax extended header",
          b"g": "pax global header", b"L": "GNU long-name header", b"K": "GNU long-link header"}


def write_tar(path: Path, members: Iterator[tuple[str, bytes]]) -> str:
    """Stream members into a deterministic ustar file at `path` through the one atomic write (kvstore.atomic;
    streamed because a bundle need not fit in memory). Returns the file's SHA-256."""
    with atomic_file(path) as f:
        with tarfile.open(fileobj=f, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for name, data in members:
                ti = tarfile.TarInfo(name)
                ti.size, ti.mtime, ti.mode, ti.uid, ti.gid, ti.uname, ti.gname = len(data), 0, 0o644, 0, 0, "", ""
                tar.addfile(ti, io.BytesIO(data))
        f.flush()
        f.seek(0)
        return hashlib.file_digest(f, "sha256").hexdigest()

def read_member(f: BinaryIO, off: int, size: int, name: str, where: str) -> bytes:
    f.seek(off)
    data = f.read(size)
    if len(data) != size:
        raise BundleError(f"{where}: member {name} is truncated ({len(data)} of {size} bytes). {_FIX}")
    return data

def tar_members(f: BinaryIO, file_size: int, where: str) -> Iterator[tuple[str, int, int]]:
    """(name, data offset, size) of each member, in archive order. Refuses anything but a plain regular file
    with a safe relative name, a member the file does not fully hold, and non-zero bytes after the end."""
    pos = 0
    while True:
        if pos + _BLOCK > file_size:
            raise BundleError(f"{where}: the archive ends at byte {file_size} without its end-of-archive blocks: "
                              f"the bundle is truncated. {_FIX}")
        f.seek(pos)
        block = f.read(_BLOCK)
        if block == bytes(_BLOCK):
            _check_zero_tail(f, pos, file_size, where)
            return
        name, size = _parse_header(block, pos, where)
        end = pos + _BLOCK + -(-size // _BLOCK) * _BLOCK
        if end > file_size:
            raise BundleError(f"{where}: member {name} is truncated: its header says {size} bytes but the file ends "
                              f"{file_size - pos - _BLOCK} bytes after it. {_FIX}")
        yield name, pos + _BLOCK, size
        pos = end

def _check_zero_tail(f: BinaryIO, pos: int, file_size: int, where: str) -> None:
    f.seek(pos)
    while pos < file_size:
        chunk = f.read(min(1 << 20, file_size - pos))
        if not chunk:
            break
        if chunk.count(0) != len(chunk):
            at = pos + next(i for i, b in enumerate(chunk) if b)
            raise BundleError(f"{where}: non-zero bytes at offset {at}, after the end-of-archive marker (data hidden "
                              f"after the last member); refusing the bundle. {_FIX}")
        pos += len(chunk)

def _octal(field: bytes, what: str, name: str, where: str) -> int:
    if field[:1] and field[0] & 0x80:
        raise BundleError(f"{where}: member {name!r}: {what} in base-256 (an oversized header field); {_FIX}")
    text = field.strip(b" \0")
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise BundleError(f"{where}: member {name!r}: {what} {text!r} is not an octal number; {_FIX}") from None

def _parse_header(block: bytes, pos: int, where: str) -> tuple[str, int]:
    """Name and size of the regular file a ustar header describes; BundleError for anything else."""
    raw = block[:100].split(b"\0", 1)[0]
    prefix = block[345:500].split(b"\0", 1)[0]
    raw = prefix + b"/" + raw if prefix else raw
    name = raw.decode("utf-8", "backslashreplace")
    stored = _octal(block[148:156], "checksum", name, where)
    if stored != sum(block[:148]) + 8 * 32 + sum(block[156:]):
        raise BundleError(f"{where}: bad tar header checksum at byte {pos} (member {name!r}): the bundle is damaged "
                          f"or not a tar file. {_FIX}")
    if block[257:263] != b"ustar\0" or block[263:265] != b"00":
        raise BundleError(f"{where}: header at byte {pos} (member {name!r}) is not POSIX ustar; kvstore export writes "
                          f"only ustar. {_FIX}")
    kind = block[156:157]
    if kind not in (b"0", b"\0"):
        link = block[157:257].split(b"\0", 1)[0].decode("utf-8", "backslashreplace")
        what = _TYPES.get(kind, f"member of tar type {kind!r}")
        raise BundleError(f"{where}: member {name!r} is a {what}" + (f" -> {link!r}" if link else "") +
                          f"; a bundle holds only regular files, so it is refused. {_FIX}")
    parts = name.split("/")
    if (not name or name.startswith("/") or "\\" in name or "\0" in name or any(p in ("", ".", "..") for p in parts)
            or raw != name.encode("utf-8", "backslashreplace")):
        raise BundleError(f"{where}: member {name!r} has an unsafe path (absolute, '..', '.', empty part, backslash "
                          f"or bad UTF-8): refused, as it could write outside the store. {_FIX}")
    return name, _octal(block[124:136], "size", name, where)
