"""Read and verify upcoming artifacts in the background, within a memory budget, so a graft finds them ready.

    with Prefetcher(store, max_bytes=1 << 30) as pf:
        pf.schedule([next_id])          # while the current problem decodes
        ...
        snapshot = pf.get(next_id)      # verified; waits if it is still being read

The worker thread calls `store.get(aid)` (a LocalStore's with private=True: read into the snapshot's own
buffer, not mapped), which verifies the bytes the snapshot's tensors view (they hash to the id) before
returning it; so `get` hands out exactly what the store would have returned, only earlier, and a change to
the object file after the check cannot reach the tensors. A prefetched snapshot is held until `get` (or `discard`) takes
it; the bytes held plus the one being read never exceed `max_bytes` (from the index's sizes). An id that is
not scheduled, too large for the budget, or still waiting in the queue is read in the caller's thread instead
(counted in `misses`), so asking out of order never deadlocks. A failure in the worker (damaged bytes, missing
object, I/O error) is raised by `get` of that id, as the store's own KVStoreError or a KVStoreError wrapping it.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable

from kvstore.errors import KVStoreError
from kvstore.format.artifact import Snapshot
from kvstore.format.ids import ArtifactId
from kvstore.store.base import Store
from kvstore.store.local import LocalStore


class Prefetcher:
    """Background read + verify of scheduled artifact ids, holding at most `max_bytes` of artifacts.

    hits / misses count `get` calls served by the worker / read in the caller's thread.
    """

    def __init__(self, store: Store, max_bytes: int) -> None:
        if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes < 0:
            raise KVStoreError(f"Prefetcher max_bytes={max_bytes!r} must be an integer >= 0 (0 prefetches nothing)")
        self.store = store
        self.max_bytes = max_bytes
        self.hits = 0
        self.misses = 0
        self.peak_bytes = 0  # most bytes ever held or being read at once (<= max_bytes)
        self._cv = threading.Condition()
        self._queue: deque[ArtifactId] = deque()
        self._ready: dict[ArtifactId, tuple[Snapshot | None, BaseException | None, int]] = {}
        self._busy: ArtifactId | None = None
        self._held = 0
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="kvgraft-prefetch", daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        return (f"Prefetcher({self.store!r}, max_bytes={self.max_bytes}, held={self._held}, "
                f"queued={len(self._queue)}, ready={len(self._ready)})")

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def held_bytes(self) -> int:
        """Bytes of the snapshots ready to hand out plus the one being read now."""
        return self._held

    def schedule(self, ids: Iterable[str]) -> None:
        """Queue ids for background read + verify, in order; ids already queued, ready or being read are skipped.
        InvalidIdError for a malformed id (nothing is queued then)."""
        ids = [ArtifactId(a) for a in ids]
        with self._cv:
            self._check_open()
            for aid in ids:
                if aid != self._busy and aid not in self._ready and aid not in self._queue:
                    self._queue.append(aid)
            self._cv.notify_all()

    def get(self, aid: str, timeout: float | None = None) -> Snapshot:
        """The verified snapshot of `aid`: the prefetched one (waiting while the worker reads it), else read now
        through the store. NotFoundError for an id the store lacks; IntegrityError (or another KVStoreError) when
        the bytes fail verification, wherever they were read; KVStoreError when waiting exceeds `timeout`."""
        aid = ArtifactId(aid)
        with self._cv:
            self._check_open()
            if aid in self._queue:  # not started: read it here rather than wait behind the budget
                self._queue.remove(aid)
            elif self._busy == aid or aid in self._ready:
                if not self._cv.wait_for(lambda: aid in self._ready or self._closed, timeout):
                    raise KVStoreError(f"prefetch of artifact {aid} did not finish within {timeout} s; the store "
                                       "may be on a slow or hung disk. Retry with a longer timeout")
                self._check_open()
                snap, err, size = self._ready.pop(aid)
                self._held -= size
                self._cv.notify_all()
                if err is not None:
                    raise _as_kvstore_error(err, aid)
                self.hits += 1
                return snap
            self.misses += 1
        return self.store.get(aid)

    def discard(self, aid: str) -> None:
        """Drop a scheduled id (queued or ready) without using it, freeing its share of the budget."""
        aid = ArtifactId(aid)
        with self._cv:
            if aid in self._queue:
                self._queue.remove(aid)
            if aid in self._ready:
                self._held -= self._ready.pop(aid)[2]
            self._cv.notify_all()

    def close(self) -> None:
        """Stop the worker and drop everything held; later calls raise KVStoreError. Idempotent."""
        with self._cv:
            self._closed = True
            self._queue.clear()
            self._ready.clear()
            self._held = 0
            self._cv.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join()

    def _check_open(self) -> None:
        if self._closed:
            raise KVStoreError("this Prefetcher is closed; create a new one")

    def _size(self, aid: ArtifactId) -> int:
        """Bytes the artifact will take: its index row's size, else its object's (an object gc has not indexed
        yet, or whose row is damaged: a missing row never blocks a read); NotFoundError when neither exists."""
        return self.store.size(aid)

    def _load(self, aid: ArtifactId) -> Snapshot:
        """The verified snapshot, in memory of its own: a LocalStore reads into a private buffer rather than
        mapping the file, so that the bytes verified now are the bytes used later, even if the object file
        were rewritten in place meanwhile (other stores' get already parses a private copy)."""
        if isinstance(self.store, LocalStore):
            return self.store.get(aid, private=True)
        return self.store.get(aid)

    def _run(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._closed or self._queue)
                if self._closed:
                    return
                aid = self._queue[0]
            try:
                size = self._size(aid)
            except BaseException as e:  # noqa: BLE001 - handed to the caller of get(aid)
                self._finish(aid, None, e, 0, pop=True)
                continue
            with self._cv:
                if not self._queue or self._queue[0] != aid:
                    continue  # taken by get() or discarded meanwhile
                if size > self.max_bytes:  # never fits: get() reads it in the caller's thread
                    self._queue.popleft()
                    continue
                self._cv.wait_for(lambda aid=aid, size=size: self._closed or self._held + size <= self.max_bytes
                                  or not self._queue or self._queue[0] != aid)
                if self._closed:
                    return
                if not self._queue or self._queue[0] != aid:
                    continue
                self._queue.popleft()
                self._busy = aid
                self._held += size
                self.peak_bytes = max(self.peak_bytes, self._held)
            try:
                snap, err = self._load(aid), None
            except BaseException as e:  # noqa: BLE001 - handed to the caller of get(aid)
                snap, err = None, e
            self._finish(aid, snap, err, size, pop=False)

    def _finish(self, aid: ArtifactId, snap: Snapshot | None, err: BaseException | None, size: int,
                pop: bool) -> None:
        with self._cv:
            if pop:
                if not self._queue or self._queue[0] != aid:
                    return
                self._queue.popleft()
            self._busy = None
            if self._closed:
                return
            if err is not None:  # the budget is released at once; only the error is kept
                self._held -= size
                size = 0
            self._ready[aid] = (snap, err, size)
            self._cv.notify_all()


def _as_kvstore_error(err: BaseException, aid: ArtifactId) -> KVStoreError:
    """The worker's failure as the caller sees it: the store's own KVStoreError (same type and message), or a
    KVStoreError naming the artifact and wrapping anything else."""
    if isinstance(err, KVStoreError):
        return err
    wrapped = KVStoreError(f"background read of artifact {aid} failed: {type(err).__name__}: {err}. Check the "
                           "store's disk and permissions, then read it again (the next get reads it directly)")
    wrapped.__cause__ = err
    return wrapped
