"""The backend seam: everything model-shaped the engine and the harness need, behind one small protocol.

A backend is one generation engine with a frozen model loaded in it (transformers, llama.cpp, a scripted fake
for tests). The harness and `check_graft` talk to a backend only through these verbs:

    text      encode(text, add_bos) / decode(ids) / eos_ids()
    compute   new_state() / seen(state) / prefill(ids, state, position) -> (state, last logits (1, vocab))
              forward(ids, state, position) -> logits (1, len, vocab)      (the state advances)
    batch     repeat_rows(state, n) / keep_rows(state, rows) / step(state, tokens, position) -> (rows, vocab)
    artifacts capture(state, ids, extra) -> Snapshot / graft(snapshot, ids) -> a fresh state holding it
    facts     name (the backend), model_name, fingerprint, tokenizer_fingerprint, settings(), environment()

`prefill` is the pinned schedule of that backend (a deposit and a fresh reference run the same one).
`graft` runs every admission check of the backend before any byte reaches the engine and raises a
kvstore.errors.IncompatibleError naming the first difference; an artifact records the backend that made it
(`determinism["backend"]`, absent = transformers, kvstore/FORMAT.md section 10) and never grafts into another.

    from kvstore.backends import as_backend
    be = as_backend(load_frozen_model())          # a FrozenModel becomes the transformers backend
    state, logits = be.prefill(be.encode("Problem: ..."))

Implementations: kvstore.backends.transformers (the default; the bits of the pre-seam code, unchanged),
kvstore.backends.llamacpp (llama-cpp-python), kvstore.backends.fake (scripted, for the harness's unit tests).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

from kvstore.errors import IncompatibleError
from kvstore.format import Snapshot

TRANSFORMERS = "transformers"


def artifact_backend(snapshot: Snapshot) -> str:
    """The backend an artifact was made by: its `determinism["backend"]`; absent means transformers (every
    artifact written before the seam existed)."""
    det = snapshot.determinism if isinstance(snapshot.determinism, dict) else {}
    name = det.get("backend", TRANSFORMERS)
    return name if isinstance(name, str) else repr(name)


def refuse_other_backend(snapshot: Snapshot, backend: str) -> None:
    """IncompatibleError unless `snapshot` was made by `backend`: an artifact never grafts into another engine
    (their states hold other bytes for the same tokens)."""
    made_by = artifact_backend(snapshot)
    if made_by != backend:
        raise IncompatibleError(
            f"{snapshot.model_name or 'artifact'}: deposited by the {made_by} backend, this is the {backend} "
            f"backend; an artifact grafts only into the engine that made it: deposit it again with {backend} "
            f"or load the model with the {made_by} backend"
        )


@runtime_checkable
class Backend(Protocol):
    """A generation engine with one frozen model loaded (see the module docstring for the verbs)."""

    name: str  # the backend: "transformers", "llamacpp", "fake"
    model_name: str
    fingerprint: str
    tokenizer_fingerprint: str
    dtype: str  # the dtype of the state an artifact holds

    def encode(self, text: str, add_bos: bool = True) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...
    def eos_ids(self) -> set[int]: ...
    def vocab_size(self) -> int: ...

    def new_state(self) -> Any: ...
    def seen(self, state: Any) -> int: ...
    def prefill(self, token_ids: list[int], state: Any = None,
                position: int | None = None) -> tuple[Any, torch.Tensor]: ...
    def forward(self, token_ids: list[int], state: Any, position: int | None = None) -> torch.Tensor: ...

    def repeat_rows(self, state: Any, n: int) -> None: ...
    def keep_rows(self, state: Any, rows: list[int]) -> None: ...
    def step(self, state: Any, tokens: list[int], position: int) -> torch.Tensor: ...

    def capture(self, state: Any, token_ids: list[int], extra: dict | None = None) -> Snapshot: ...
    def graft(self, snapshot: Snapshot, token_ids: list[int] | None = None) -> Any: ...
    def settings_differences(self, snapshot: Snapshot) -> list[str]: ...

    def settings(self) -> dict: ...
    def environment(self) -> dict: ...
