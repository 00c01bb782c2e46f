"""The backend seam: everything model-shaped the engine and the harness need, behind one small protocol.

A backend is one generation engine with a frozen model loaded in it (transformers, llama.cpp, a scripted fake
for tests). The harness and `check_graft` talk to a backend only through these verbs:

    text      encode(text, add_bos) / decode(ids) / eos_ids()
    compute   new_state() / seen(state) / prefill(ids, state, position) -> (state, last logits (1, vocab))
              forward(ids, state, position) -> logits (1, len, vocab)      (the state advances)
    batch     repeat_rows(state, n) / keep_rows(state, rows) / step(state, tokens, position) -> (rows, vocab)
    artifacts capture(state, ids, extra) -> Snapshot / graft(snapshot, ids) -> a fresh state holding it
    facts     name (the backend), model_name, fingerprint, tokenizer_fingerprint, settings(), environment()

An engine that decodes whole requests itself (vLLM) also has the optional verb

    continue_rows(state, prompt_ids, seeds, max_new_tokens=, stop=, strategy=, temperature=, top_p=, eos=)
              -> [Continuation] (one per seed)

and the harness's decode hands it the whole continuation instead of stepping (harness/run/decode.py). A backend
that cannot graft every artifact its own deposits make (vLLM: whole blocks only) also has

    graft_refusal(token_count) -> str | None
              why an artifact of that many tokens from position 0 would be refused before a longer prompt, naming
              the setting that makes it work; None when it grafts (a library build skips such entries, recorded)

`prefill` is the pinned schedule of that backend (a deposit and a fresh reference run the same one).
`graft` first calls the one admission (kvstore.engine.admission.admit: every recorded fact compared with this
backend's, the first difference an IncompatibleError naming it), then the backend's own layout check and restore;
an artifact records the backend that made it (`determinism["backend"]`, absent = transformers, kvstore/FORMAT.md
section 10) and never grafts into another.

    be = kvstore.load_backend("transformers")     # or "llamacpp", "fake": the registry, kvstore.backends
    state, logits = be.prefill(be.encode("Problem: ..."))

Implementations, one folder or module each under kvstore/backends/ (each declares its `REGISTERED` entry).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from kvstore.errors import IncompatibleError
from kvstore.format.artifact import Snapshot

TRANSFORMERS = "transformers"


def artifact_backend(snapshot: Snapshot) -> str:
    """The backend an artifact was made by: its `determinism["backend"]`; absent means transformers (every
    artifact written before the seam existed)."""
    det = snapshot.determinism if isinstance(snapshot.determinism, dict) else {}
    name = det.get("backend", TRANSFORMERS)
    return name if isinstance(name, str) else repr(name)


@dataclass(frozen=True)
class Continuation:
    """One row decoded inside an engine (`continue_rows`): its tokens up to and including a stop (EOS left out),
    why it ended ("eos" | "stop" | "length"), the SHA-256 of the logits its first token was chosen from (the
    context's, shared by every row) and the seconds until that token."""

    token_ids: list[int]
    stop_reason: str
    first_logits_sha256: str
    ttft_s: float


@dataclass(frozen=True)
class Registered:
    """How a backend plugs in: each backend's face (its folder's `__init__.py`, or its module) declares
    `REGISTERED = Registered(name, settings, loader)` and kvstore.backends finds it there; nothing else names it.

    settings: "module:Class", the backend's Settings dataclass (every field a caller may choose; the harness derives
              its `model.<name>` config schema from it, so it lives in a light module that imports no engine);
    loader:   "module:function", Settings -> a loaded Backend."""

    name: str
    settings: str
    loader: str

    def settings_class(self) -> type:
        module, _, attr = self.settings.partition(":")
        return getattr(importlib.import_module(module), attr)

    def load(self, settings: Any) -> Backend:
        module, _, attr = self.loader.partition(":")
        return getattr(importlib.import_module(module), attr)(settings)


@runtime_checkable
class Backend(Protocol):
    """A generation engine with one frozen model loaded (see the module docstring for the verbs)."""

    name: str  # the backend: "transformers", "llamacpp", "fake"
    model_name: str
    fingerprint: str
    tokenizer_fingerprint: str
    dtype: str  # the dtype of the state an artifact holds

    def encode(self, text: str, add_bos: bool = True, special: bool = False) -> list[int]: ...
    def chat_template(self) -> str | None: ...
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

    def settings(self) -> dict: ...
    def environment(self) -> dict: ...


def as_backend(model: Any) -> Backend:
    """`model` as a Backend: a backend is returned as it is; a model object that carries its backend (a
    kvstore.FrozenModel's `.backend`, its transformers backend) gives that one."""
    if isinstance(model, Backend):
        return model
    be = getattr(model, "backend", None)
    if isinstance(be, Backend):
        return be
    raise IncompatibleError(f"{type(model).__name__} is neither a kvstore backend nor a FrozenModel; load one with "
                            "kvstore.load_backend() or kvstore.load_frozen_model()")
