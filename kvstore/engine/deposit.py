"""Deposit and graft on any backend: the two verbs of the engine that the harness and the `kvstore` command use.

    snap = deposit(backend, token_ids, extra={"why": ...})   # prefill under the backend's pinned schedule, capture
    aid = store.put(snap)
    state = graft(backend, store.get(aid), context_ids)     # the one admission, then the backend's restore

Both are backend-generic: a transformers, llama.cpp or fake backend (kvstore.load_backend) gives the same
artifact bytes as its own prefill + capture, so an artifact id does not depend on which of these made it."""

from __future__ import annotations

from typing import Any

from kvstore.engine.protocol import Backend
from kvstore.errors import KVStoreError
from kvstore.format.artifact import Snapshot


def deposit(backend: Backend, token_ids: list[int], extra: dict | None = None) -> Snapshot:
    """The KV state of `token_ids` computed from position 0 under the backend's pinned prefill schedule, as an
    artifact (a Snapshot: `store.put` it to keep it)."""
    ids = [int(t) for t in token_ids]
    if not ids:
        raise KVStoreError("nothing to deposit: the token sequence is empty")
    state, _ = backend.prefill(ids)
    return backend.capture(state, ids, extra)


def graft(backend: Backend, snapshot: Snapshot, token_ids: list[int] | None = None) -> Any:
    """A fresh state of `backend` holding `snapshot` at its own positions, after every admission check (each an
    IncompatibleError naming the difference); `token_ids`: the context the caller will run (it must begin with the
    snapshot's tokens)."""
    return backend.graft(snapshot, token_ids)
