"""The backend seam: everything model-shaped the engine and the harness need, as a small core protocol plus typed
optional capabilities (the shape of vLLM's KVConnectorBase: a required core, optional verbs a caller asks for).

A backend is one generation engine with a frozen model loaded in it (transformers, llama.cpp, vLLM, a scripted
fake for tests). The core, `Backend`, every backend has:

    facts     name (the backend), model_name, fingerprint, tokenizer_fingerprint, dtype, settings(), environment(),
              context_size() (the most positions a context may hold; None when the engine does not say)
    policy    allows_environment_mismatch() (admission may let an artifact of another compute environment through,
              marked not guaranteed exact), torch_threads_matter() (torch's thread count is part of its bits)
    text      encode(text, add_bos) / decode(ids) / eos_ids() / vocab_size() / chat_template()
    compute   seen(state) / prefill(ids, state, position) -> (state, last logits (1, vocab))
    artifacts capture(state, ids, extra) -> Snapshot / graft(snapshot, ids) -> a fresh state holding it

and one or both decoding capabilities, each a runtime-checkable protocol (`isinstance(be, Stepwise)`) the harness
picks its path by, never by the backend's name:

    Stepwise          new_state() / forward(ids, state, position) -> logits (1, len, vocab) (the state advances)
                      repeat_rows(state, n) / keep_rows(state, rows) / step(state, tokens, position) -> (rows, vocab)
                      the harness's decode loop (harness/run/decode.py) and check_graft's reference drive these
    InEngineDecoding  continue_rows(state, prompt_ids, seeds, max_new_tokens=, stop=, strategy=, temperature=,
                      top_p=, eos=) -> [Continuation] (one per seed): the engine decodes whole rows itself (vLLM)
                      graft_refusal(token_count) -> str | None: why an artifact of that many tokens from position 0
                      would be refused before a longer prompt, naming the setting that makes it work (vLLM grafts
                      whole blocks only); None when it grafts (a library build skips such entries, recorded)

and, for problems in flight (several contexts decoded together, harness run.in_flight), one of:

    RaggedRows        join_rows(states) -> one state holding every row of the given states, whatever their lengths
                      (left-padded: each row keeps its own positions and sees only its own keys);
                      step_rows(state, tokens, positions) -> (rows, vocab): one token per row at its own position;
                      keep_rows(state, rows) works on a joined state too (a Stepwise backend)
    InEngineBatches   continue_many([RowsRequest], max_new_tokens=, ...) -> [[Continuation]]: every request's rows
                      submitted to the engine together (its scheduler batches them), answered in request order

`BackendDefaults` gives the policy facts their usual values (no context limit known, no environment mismatch
allowed, torch threads not part of the bits); a backend subclasses it and overrides what differs.

`prefill` is the pinned schedule of that backend (a deposit and a fresh reference run the same one).
`graft` first calls the one admission (kvstore.engine.admission.admit: every recorded fact compared with this
backend's, the first difference an IncompatibleError naming it), then the backend's own layout check and restore;
an artifact records the backend that made it (`determinism["backend"]`, absent = transformers, kvstore/FORMAT.md
section 10) and never grafts into another.

    be = kvstore.load_backend("transformers")     # or "llamacpp", "vllm", "fake": the registry, kvstore.backends
    state, logits = be.prefill(be.encode("Problem: ..."))

Implementations, one folder or module each under kvstore/backends/ (each declares its `REGISTERED` entry).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from kvstore.format.artifact import Snapshot

if TYPE_CHECKING:  # annotations only: importing the seam (and the registry) loads no torch
    import torch

#: The backend an artifact that records none was made by (every artifact written before the seam existed).
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
    loader:   "module:function", Settings -> a loaded Backend;
    requires: a module the engine needs that may be absent from this Python ("" = none), and `install`, how to
              get a Python that has it (said when it is missing, before anything loads);
    batch_invariant: "" when the backend offers determinism.batch_invariant (kvstore/determinism.py), else why it
              cannot (said in the one-line refusal before anything loads)."""

    name: str
    settings: str
    loader: str
    requires: str = ""
    install: str = ""
    batch_invariant: str = "it does not implement a batch-invariant computation"

    def batch_invariant_refusal(self) -> str | None:
        """The one-line refusal of determinism.batch_invariant=true on this backend, or None when it offers it."""
        if not self.batch_invariant:
            return None
        return (f"determinism.batch_invariant=true on the {self.name} backend: it cannot offer a batch-invariant "
                f"computation on the CPU ({self.batch_invariant}); use a backend that offers it (transformers) or "
                "leave determinism.batch_invariant off")

    def missing(self) -> str | None:
        """Why this backend cannot load in this Python (its `requires` module is not importable), or None."""
        import importlib.util
        import sys

        if not self.requires or importlib.util.find_spec(self.requires) is not None:
            return None
        return (f"the {self.name} backend needs {self.requires}, which this Python ({sys.executable}) does not have"
                + (f"; {self.install}" if self.install else ""))

    def settings_class(self) -> type:
        module, _, attr = self.settings.partition(":")
        return getattr(importlib.import_module(module), attr)

    def load(self, settings: Any) -> Backend:
        module, _, attr = self.loader.partition(":")
        return getattr(importlib.import_module(module), attr)(settings)


@runtime_checkable
class Backend(Protocol):
    """The core every backend has: a generation engine with one frozen model loaded (module docstring)."""

    name: str  # the backend: "transformers", "llamacpp", "vllm", "fake"
    model_name: str
    fingerprint: str
    tokenizer_fingerprint: str
    dtype: str  # the dtype of the state an artifact holds

    # facts and admission policy
    def settings(self) -> dict: ...
    def environment(self) -> dict: ...
    def context_size(self) -> int | None: ...
    def allows_environment_mismatch(self) -> bool: ...
    def torch_threads_matter(self) -> bool: ...
    def numerics(self) -> str | None: ...
    def row_schedule(self) -> str | None: ...

    # text
    def encode(self, text: str, add_bos: bool = True, special: bool = False) -> list[int]: ...
    def chat_template(self) -> str | None: ...
    def decode(self, ids: list[int]) -> str: ...
    def eos_ids(self) -> set[int]: ...
    def vocab_size(self) -> int: ...

    # compute and artifacts
    def seen(self, state: Any) -> int: ...
    def prefill(self, token_ids: list[int], state: Any = None,
                position: int | None = None) -> tuple[Any, torch.Tensor]: ...
    def capture(self, state: Any, token_ids: list[int], extra: dict | None = None) -> Snapshot: ...
    def graft(self, snapshot: Snapshot, token_ids: list[int] | None = None) -> Any: ...


@runtime_checkable
class Stepwise(Protocol):
    """The step-wise capability: the caller drives decoding one position (and a batch of rows) at a time."""

    def new_state(self) -> Any: ...
    def forward(self, token_ids: list[int], state: Any, position: int | None = None) -> torch.Tensor: ...
    def repeat_rows(self, state: Any, n: int) -> None: ...
    def keep_rows(self, state: Any, rows: list[int]) -> None: ...
    def step(self, state: Any, tokens: list[int], position: int) -> torch.Tensor: ...


@runtime_checkable
class InEngineDecoding(Protocol):
    """The in-engine decoding capability: the engine continues whole rows itself (its own batching and sampler)."""

    def continue_rows(self, state: Any, prompt_ids: list[int], seeds: Sequence[int], *, max_new_tokens: int,
                      stop: Sequence[str] = (), strategy: str = "greedy", temperature: float = 0.7,
                      top_p: float = 0.95, eos: set[int] | None = None) -> list[Continuation]: ...
    def graft_refusal(self, token_count: int) -> str | None: ...


@dataclass(frozen=True)
class RowsRequest:
    """One context of a batch of contexts (`InEngineBatches.continue_many`): the state holding a prefix of
    `prompt_ids` (a graft; None: nothing held) and one seed per row to decode from it."""

    state: Any
    prompt_ids: list[int]
    seeds: Sequence[int]


@runtime_checkable
class RaggedRows(Protocol):
    """Rows of different contexts (any lengths) decoded in one batch: problems in flight on a step-wise engine."""

    def join_rows(self, states: Sequence[Any]) -> Any: ...
    def step_rows(self, state: Any, tokens: list[int], positions: list[int]) -> torch.Tensor: ...


@runtime_checkable
class InEngineBatches(Protocol):
    """Several contexts' rows submitted to the engine at once (its scheduler batches them): problems in flight."""

    def continue_many(self, requests: Sequence[RowsRequest], *, max_new_tokens: int, stop: Sequence[str] = (),
                      strategy: str = "greedy", temperature: float = 0.7, top_p: float = 0.95,
                      eos: set[int] | None = None) -> list[list[Continuation]]: ...


@runtime_checkable
class Repositioning(Protocol):
    """The position experiment's capability (transformers): an artifact's keys re-rotated to start at `offset`."""

    def graft_repositioned(self, snapshot: Snapshot, offset: int) -> Any: ...


class BackendDefaults:
    """The policy facts' usual values, for a backend to subclass (and override what differs): no context limit it
    can name, no artifact of another compute environment admitted, torch's thread count not part of its bits."""

    def context_size(self) -> int | None:
        return None

    def allows_environment_mismatch(self) -> bool:
        return False

    def torch_threads_matter(self) -> bool:
        return False

    def row_schedule(self) -> str | None:
        """How this backend computes a decoded row, named once it changed after runs were recorded (a run's
        comparable and resume keys and its manifest record it, so rows of two schedules are never compared or
        mixed), or None: the schedule every run so far was recorded under, recorded as nothing (keys unchanged)."""
        return None

    def numerics(self) -> str | None:
        """The numerics fingerprint of this backend's kernels (kvstore.environment.numerics_fingerprint), or None for
        a backend that measures none: its artifacts are then compared on the environment record only."""
        return None
