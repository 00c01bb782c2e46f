"""A verified read: an artifact's bytes become a Snapshot only once they hash to the id asked for.

The id's hash (BLAKE3 on all usable CPUs for kvgraft-kv/2; it releases the GIL) runs on a worker thread while
the calling thread parses the header and lays tensors over the same bytes; the snapshot is handed back only
after the hash has matched and is dropped otherwise, so no tensor of unverified bytes ever leaves this
function. When the bytes do not hash to the id, that is the error raised (IntegrityError), even if parsing
failed first: a damaged file is reported as damaged, not as malformed. Parsing untrusted bytes is what
`from_bytes` is built for (it checks everything and raises only KVStoreErrors).

Below OVERLAP_MIN bytes the two run one after the other (a thread hop costs more than it hides).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from kvstore.errors import KVStoreError
from kvstore.format.artifact import Snapshot, from_bytes
from kvstore.format.ids import ArtifactId

OVERLAP_MIN = 1 << 20  # bytes: below this, hash then parse on the calling thread
HASH_WORKERS = 8  # concurrent reads hashing at once (each hash itself runs on all usable CPUs)

_pool: tuple[int, ThreadPoolExecutor] | None = None
_pool_lock = threading.Lock()


def _hasher() -> ThreadPoolExecutor:
    """The process's hashing threads, started as reads need them: reads on several threads at once (a caller
    and kvstore.Prefetcher) do not queue behind each other's hash. Made again after a fork: a forked child has
    no threads."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool[0] != os.getpid():
            _pool = (os.getpid(), ThreadPoolExecutor(max_workers=HASH_WORKERS, thread_name_prefix="kvgraft-id-hash"))
        return _pool[1]


def verified_snapshot(data: bytes | bytearray | memoryview, check_id: Callable[[str], None]) -> Snapshot:
    """The snapshot of `data` (tensors view it, no copy), returned only after `check_id(id of data)` returned;
    check_id raises (IntegrityError) when the id is not the one asked for. Raises what check_id raises, else
    FormatError / ValidationError / IntegrityError from parsing."""
    if len(data) < OVERLAP_MIN:
        check_id(ArtifactId.of(data))
        return from_bytes(data, verify_tensors=False)
    pending: Future[ArtifactId] = _hasher().submit(ArtifactId.of, data)
    try:
        snapshot = from_bytes(data, verify_tensors=False)
    except KVStoreError:
        check_id(pending.result())  # damaged bytes: say so rather than how the damage broke the parse
        raise
    except BaseException:
        pending.result()  # never leave the worker hashing a buffer the caller may unmap
        raise
    check_id(pending.result())
    return snapshot
