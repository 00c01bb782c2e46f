"""`open_store(spec)`: the store a config value or a command line names, a folder or an S3 prefix.

    open_store("runs/store")               # LocalStore (relative to `base` when given)
    open_store("s3://kvgraft/library")     # S3Store; endpoint and credentials from boto3's chain
                                           # (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ~/.aws)

Used by the `kvstore` command (--store) and the harness (library.store); see docs/scale-out.md.
"""

from __future__ import annotations

import os
from pathlib import Path

from kvstore.store.base import Store
from kvstore.store.local import LocalStore


def open_store(spec: str | os.PathLike, base: str | os.PathLike | None = None) -> Store:
    """`s3://BUCKET[/PREFIX]` is an S3Store, anything else a LocalStore folder (relative to `base` when given)."""
    text = os.fspath(spec)
    if text.startswith("s3://"):
        from kvstore.store.s3 import S3Store  # boto3 is imported only when a bucket is named

        return S3Store(text)
    return LocalStore(Path(base) / text if base is not None else text)
