"""Canonical JSON, SHA-256 helpers and atomic file writes for run folders.

Canonical JSON (see ``harness/RUN_FORMAT.md``) is
``json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"))`` encoded as UTF-8.
Every hash in a manifest is taken over canonical JSON (or over raw file bytes where the format says so).

All writers here are atomic (design invariant 3): the data goes to a temporary file in the same
folder, is flushed and fsync'ed, then ``os.replace``'d over the target. On any exception the
temporary file is removed and the target is left untouched.

The writes go through the project's one atomic-write helper (``kvstore.atomic``) and the encoding through its one
canonical JSON (``kvstore.format.canonical``, with ``ensure_ascii=False``: the run format's rule). Both modules import
only
the standard library and ``kvstore`` imports its submodules lazily, so re-checking a run folder
(``harness.record.audit``,
``scripts/rescore.py``) works where torch is not installed.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from kvstore import atomic_write
from kvstore import canonical_json as _canonical_json

__all__ = [
    "atomic_write_bytes",
    "atomic_write_text",
    "canonical_json",
    "jsonl_bytes",
    "sha256_hex",
    "sha256_json",
    "write_json",
    "write_jsonl",
]


def canonical_json(obj: Any) -> bytes:
    """Return the canonical JSON encoding of ``obj`` as UTF-8 bytes (sorted keys, no spaces)."""
    return _canonical_json(obj, ensure_ascii=False).encode("utf-8")


def sha256_hex(data: bytes) -> str:
    """Return the lowercase hex SHA-256 digest of ``data``."""
    return hashlib.sha256(data).hexdigest()


def sha256_json(obj: Any) -> str:
    """Return the hex SHA-256 of the canonical JSON of ``obj``."""
    return sha256_hex(canonical_json(obj))


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: kvstore's one atomic-write helper (temp file in the same folder,
    fsync, ``os.replace``, directory fsync; the temp file is removed on any error)."""
    atomic_write(Path(path), data)


def atomic_write_text(path: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> None:
    """Write ``text`` to ``path`` atomically, encoded with ``encoding`` (UTF-8 by default)."""
    atomic_write_bytes(path, text.encode(encoding))


def write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """Write ``obj`` as human-readable JSON (``indent=2, sort_keys=True``, UTF-8, trailing newline)."""
    text = json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    atomic_write_text(path, text)


def jsonl_bytes(rows: Iterable[Any]) -> bytes:
    """Return the bytes of a ``.jsonl`` file: one canonical JSON line per row, each followed by ``\\n``."""
    return b"".join(canonical_json(row) + b"\n" for row in rows)


def write_jsonl(path: str | os.PathLike[str], rows: Iterable[Any]) -> None:
    """Write ``rows`` as canonical JSON lines (each followed by ``\\n``), atomically."""
    atomic_write_bytes(path, jsonl_bytes(rows))
