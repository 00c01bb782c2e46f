"""Canonical JSON: the one encoder behind every hashed or byte-compared JSON the project writes.

`json.dumps(obj, sort_keys=True, separators=(",", ":"))`: sorted keys, no spaces. The one open choice is how
non-ASCII text is written, and the stored bytes already fix it per format, so the caller says it explicitly:

    ensure_ascii=True   the engine's formats: an artifact's `kvgraft` metadata (FORMAT.md S4) and a bundle's
                        manifest (FORMAT.md section 7) escape non-ASCII as \\uXXXX, so the bytes are ASCII
    ensure_ascii=False  a run folder's files and hashes (harness/RUN_FORMAT.md, "Canonical JSON"): UTF-8 text

Changing either would change the content id of an artifact, a bundle manifest's SHA-256 or a run manifest's
hashes for any text outside ASCII (problem statements hold some), so both rules stay and this function names
the difference instead of three copies hiding it. Standard library only (re-checking a run needs no torch).
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["canonical_json"]


def canonical_json(obj: Any, *, ensure_ascii: bool) -> str:
    """`obj` as canonical JSON text (sorted keys, compact separators); see the module docstring for
    `ensure_ascii`: True for kvstore's formats, False for run folders."""
    return json.dumps(obj, sort_keys=True, ensure_ascii=ensure_ascii, separators=(",", ":"))
