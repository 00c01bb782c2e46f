"""The backend seam: one abstract base class, `Backend`, holding the core contract every backend has and its
defaults, and optional capabilities a backend opts into by inheriting them (the shape of vLLM's KVConnectorBase_V1:
the required members abstract, the rest concrete with documented defaults; optional abilities as nominal mixins, as
its `SupportsHMA`). A caller asks `isinstance(be, Stepwise)`, never the backend's name and never by catching an
error.

A backend is one generation engine with a frozen model loaded in it (transformers, llama.cpp, vLLM, a scripted
fake for tests). `Backend`'s abstract members, which a new backend writes (ABSTRACT, checked by
tests/kvstore/test_backend_base.py and stated in docs/extending.md):

    facts     settings() (the recorded settings), environment() (the compute environment an artifact records)
    text      tokenizer() -> Tokenizer (kvstore.engine.text): encode / decode / eos_ids / vocab_size / chat_template
              are derived from it (HFTokenizer wraps a Hugging Face tokenizer)
    compute   seen(state) / prefill(ids, state, position) -> (state, last logits (1, vocab))
    artifacts capture(state, ids, extra) -> Snapshot / graft(snapshot, ids) -> a fresh state holding it (the one
              graft door: every caller grafts through it; deposit(ids, extra) = prefill + capture, the one deposit)
    loading   load(settings) (a classmethod: the registry's loader)

and the attributes name (a class attribute: the backend), settings_class (a class attribute: its Settings
dataclass), model_name, fingerprint, tokenizer_fingerprint, dtype (set in `__init__` or as properties). The class
answers the registry before anything loads: `requires`/`install` (a module its engine needs: `missing()`),
`batch_invariant_absent` ("" when it offers the mode: `batch_invariant_refusal()`, `mode_unavailable()`),
`in_flight_refusal(n)` / `batched_rows_refusal(n)` (read off its capabilities), `load_text(settings)`. Every other
member is concrete, a fact asked as a method in one place each:

    context_size()                None: the engine names no limit
    allows_environment_mismatch() False: admission lets no artifact of another compute environment through
    torch_threads_matter()        False: torch's thread count is not part of this engine's bits
    numerics()                    None: no measured numerics fingerprint (artifacts compared on the environment)
    row_schedule()                None: rows computed as every run so far recorded them
    batch_invariant()             False: kvgraft's tested batch-invariant mode (determinism.batch_invariant) is off;
                                  an engine's own determinism switch is another fact with another name
    rows_depend_on_batch(n)       n > 1 and not batch_invariant(): rows of n contexts decoded together may differ
                                  in their bits from one context at a time
    pinned_weights()              None: no weight files pinned (kvstore.engine.weights.PinnedWeights otherwise)
    sliding_window()              None: no sliding layer (or the engine does not say)
    layer_kinds()                 None: the layer layout in one word ("SSSSSF..."), where the engine says it

Capabilities (each an abstract mixin; a backend inherits the ones it does and writes their members):

    Stepwise          new_state() / forward(ids, state, position) -> logits (1, len, vocab) (the state advances) /
                      step(state, [token], position) -> (1, vocab): the caller drives decoding one token at a time
                      (the harness's decode loop, check_graft's reference)
    BatchedRows       (a Stepwise) repeat_rows(state, n) / keep_rows(state, rows) and `step` of one token per row:
                      several rows of one context decoded together (decoding.batch_size > 1)
    RaggedRows        (a BatchedRows) join_rows(states) -> one state holding every row of the given states, whatever
                      their lengths (left-padded: each row keeps its own positions and sees only its own keys);
                      step_rows(state, tokens, positions) -> (rows, vocab); keep_rows works on a joined state too:
                      problems in flight on a step-wise engine
    InEngineDecoding  continue_rows(state, prompt_ids, seeds, max_new_tokens=, stop=, strategy=, temperature=,
                      top_p=, eos=) -> [Continuation] (one per seed): the engine decodes whole rows itself (vLLM);
                      graft_refusal(token_count) -> str | None: why an artifact of that many tokens from position 0
                      would be refused before a longer prompt (None when it grafts)
    InEngineBatches   (an InEngineDecoding) continue_many([RowsRequest], max_new_tokens=, ...) -> [[Continuation]]:
                      every request's rows submitted to the engine together: problems in flight
    Repositioning     graft_repositioned(snapshot, offset): an artifact's keys re-rotated (the position experiment)

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
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from kvstore.engine.text import Tokenizer
from kvstore.format.artifact import Snapshot

if TYPE_CHECKING:  # annotations only: importing the seam (and the registry) loads no torch
    import torch

    from kvstore.engine.weights import PinnedWeights

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
    """How a backend plugs in: its face (its folder's `__init__.py`, or its module) declares
    `REGISTERED = Registered(name, "module:Class")` and kvstore.backends finds it there. The entry is a name and a
    class, nothing else: the class answers everything the registry is asked (its Settings dataclass, the module its
    engine needs, its refusals, its loader, its text loader: `Backend`'s class-level members), each written once.
    Importing the class loads no model (nor, for vLLM and llama.cpp, their engines: those load in `load`)."""

    name: str
    backend: str  # "module:Class", the Backend subclass

    def backend_class(self) -> type[Backend]:
        """The Backend class this entry names (imported, nothing loaded); a ModelLoadError when the entry is wrong."""
        from kvstore.errors import ModelLoadError

        module, _, attr = self.backend.partition(":")
        cls = getattr(importlib.import_module(module), attr, None)
        if not (isinstance(cls, type) and issubclass(cls, Backend) and cls.name == self.name):
            raise ModelLoadError(f"backend {self.name!r}: its entry names {self.backend!r}, which is not a Backend "
                                 f"class named {self.name!r}; fix REGISTERED in {module.rsplit('.', 1)[0]} (the "
                                 "backend's face: docs/extending.md)")
        return cls


class Backend(ABC):
    """The core every backend has: a generation engine with one frozen model loaded (module docstring). A subclass
    writes the abstract members and inherits the documented default of every other one (overriding what differs)."""

    name: str  # the backend, a class attribute: "transformers", "llamacpp", "vllm", "fake"
    model_name: str
    fingerprint: str
    tokenizer_fingerprint: str
    dtype: str  # the dtype of the state an artifact holds

    # ------------------------------------------------------------------ the class: what the registry asks
    # Read off the class before anything loads (kvstore.backends: settings_class, backend_missing, the refusals).
    settings_class: ClassVar[type]  # its Settings dataclass (a kvstore.backends.settings.BackendSettings)
    requires: ClassVar[str] = ""  # a module its engine needs that a Python may lack ("" = none) ...
    install: ClassVar[str] = ""  # ... and how to get a Python that has it
    batch_invariant_absent: ClassVar[str] = "it does not implement a batch-invariant computation"  # "" = offers it

    @classmethod
    @abstractmethod
    def load(cls, settings: Any) -> Backend:
        """The registry's loader: this backend with its model loaded under `settings` (an instance of
        `settings_class`)."""

    @classmethod
    def missing(cls) -> str | None:
        """Why this backend cannot load in this Python (its `requires` module is not importable), or None."""
        import importlib.util
        import sys

        if not cls.requires or importlib.util.find_spec(cls.requires) is not None:
            return None
        return (f"the {cls.name} backend needs {cls.requires}, which this Python ({sys.executable}) does not have"
                + (f"; {cls.install}" if cls.install else ""))

    @classmethod
    def batch_invariant_refusal(cls) -> str | None:
        """The one-line refusal of determinism.batch_invariant=true on this backend, or None when it offers it."""
        if not cls.batch_invariant_absent:
            return None
        return (f"determinism.batch_invariant=true on the {cls.name} backend: it cannot offer a batch-invariant "
                f"computation on the CPU ({cls.batch_invariant_absent}); use a backend that offers it (transformers) "
                "or leave determinism.batch_invariant off")

    @classmethod
    def mode_unavailable(cls) -> str | None:
        """Why determinism.batch_invariant, which this backend offers, cannot hold on this machine (one line: e.g.
        no C compiler for its kernel), or None where nothing is known against it. Asked lazily, only of a run that
        would run the mode: it may build or measure. A backend without the mode is `batch_invariant_refusal`'s
        question, not this one. Default None."""
        return None

    # ------------------------------------------------------------------ facts (abstract)
    @abstractmethod
    def settings(self) -> dict:
        """The settings an artifact and a run record (the format's five pinned settings first, FORMAT.md 6): read by
        admission and recorded; a caller asks a fact by its method, never by reading this dict."""

    @abstractmethod
    def environment(self) -> dict:
        """The compute environment an artifact records (kvstore.environment)."""

    # ------------------------------------------------------------------ facts with defaults
    def context_size(self) -> int | None:
        """The most positions a context may hold; None when the engine does not say."""
        return None

    def allows_environment_mismatch(self) -> bool:
        """Whether admission lets an artifact of another compute environment through (marked not guaranteed exact):
        a policy the caller chose, not a recorded setting. Default False."""
        return False

    def torch_threads_matter(self) -> bool:
        """Whether torch's thread count is part of this engine's bits (an artifact then records it). Default False."""
        return False

    def numerics(self) -> str | None:
        """The numerics fingerprint of this backend's kernels (kvstore.environment.numerics_fingerprint), or None for
        a backend that measures none: its artifacts are then compared on the environment record only."""
        return None

    def former_numerics(self) -> tuple[str, ...]:
        """This process's numerics fingerprints under earlier formats of its battery: a record made under one of
        them shows this machine's bits as it did when recorded, so admission and the replay registry accept it beside
        `numerics()`. Default (): one format."""
        return ()

    def row_schedule(self) -> str | None:
        """How this backend computes a decoded row, named once it changed after runs were recorded (a run's
        comparable and resume keys and its manifest record it, so rows of two schedules are never compared or
        mixed), or None: the schedule every run so far was recorded under, recorded as nothing (keys unchanged)."""
        return None

    def batch_invariant(self) -> bool:
        """Whether this backend runs kvgraft's tested batch-invariant mode (determinism.batch_invariant: a row's bits
        do not depend on what shares its batch or how its context was chunked; tested on transformers). An engine's
        own determinism switch (vLLM's VLLM_BATCH_INVARIANT) is not this fact. Default False."""
        return False

    def rows_depend_on_batch(self, in_flight: int) -> bool:
        """Whether rows decoded with `in_flight` contexts together may differ in their bits from the same rows decoded
        one context at a time: with more than one, unless `batch_invariant()`."""
        return in_flight > 1 and not self.batch_invariant()

    def pinned_weights(self) -> PinnedWeights | None:
        """The weight files this model was loaded from, pinned at load (kvstore.engine.weights), or None when there
        are none to watch (a scripted model, an engine that owns its files)."""
        return None

    @classmethod
    def load_text(cls, settings: Any) -> Any:
        """The model without its engine (encode, decode, chat_template, fingerprint, tokenizer_fingerprint,
        model_name), for a front end that composes the engine's prompts in another process (harness.serve); a
        ModelLoadError here (the default): this backend offers none (vLLM's does)."""
        from kvstore.errors import ModelLoadError

        raise ModelLoadError(f"backend {cls.name!r} offers no model without its engine (load_text); use load_backend")

    @classmethod
    def in_flight_refusal(cls, in_flight: int) -> str | None:
        """The one-line refusal of `in_flight` > 1 contexts decoded together on this backend, read off its class's
        capabilities (RaggedRows or InEngineBatches: nothing loaded); None when it offers them."""
        if in_flight <= 1 or supports_in_flight(cls):
            return None
        return (f"the {cls.name} backend decodes one context at a time (it has neither RaggedRows nor "
                f"InEngineBatches: {in_flight} contexts cannot decode together in it)")

    @classmethod
    def batched_rows_refusal(cls, rows: int) -> str | None:
        """The one-line refusal of `rows` > 1 rows of one context decoded together on this backend, read off its
        class's capabilities (BatchedRows or InEngineDecoding: nothing loaded); None when it offers them."""
        if rows <= 1 or supports_batched_rows(cls):
            return None
        return (f"the {cls.name} backend decodes one row at a time (it has no BatchedRows: {rows} rows of a context "
                "cannot decode together in it)")

    def sliding_window(self) -> int | None:
        """The smallest window of the model's sliding (or chunked) layers, or None: no sliding layer (or the engine
        does not say)."""
        return None

    def layer_kinds(self) -> str | None:
        """The model's layer layout in one word, a letter per layer (F full, S sliding, C chunked, ...: the
        transformers folder's `layout_string`), or None when the engine does not say."""
        return None

    # ------------------------------------------------------------------ text, derived from the tokenizer
    @abstractmethod
    def tokenizer(self) -> Tokenizer:
        """The text side of the model (kvstore.engine.text.Tokenizer); the text verbs below are derived from it."""

    def encode(self, text: str, add_bos: bool = True, special: bool = False) -> list[int]:
        return self.tokenizer().encode(text, add_bos=add_bos, special=special)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer().decode(ids)

    def eos_ids(self) -> set[int]:
        return self.tokenizer().eos_ids()

    def vocab_size(self) -> int:
        return self.tokenizer().vocab_size()

    def chat_template(self) -> str | None:
        return self.tokenizer().chat_template()

    # ------------------------------------------------------------------ compute and artifacts (abstract)
    @abstractmethod
    def seen(self, state: Any) -> int:
        """How many tokens `state` holds."""

    @abstractmethod
    def prefill(self, token_ids: list[int], state: Any = None,
                position: int | None = None) -> tuple[Any, torch.Tensor]:
        """`token_ids` after `state` (a fresh one by default) in this backend's pinned schedule: (state, the last
        position's logits (1, vocab))."""

    @abstractmethod
    def capture(self, state: Any, token_ids: list[int], extra: dict | None = None) -> Snapshot:
        """The artifact of exactly `token_ids` (computed from position 0) that `state` holds."""

    @abstractmethod
    def graft(self, snapshot: Snapshot, token_ids: list[int] | None = None) -> Any:
        """A fresh state holding `snapshot` at its own positions, after the one admission (kvstore.engine.admission
        .admit) and this engine's layout check (each an IncompatibleError naming the difference); `token_ids`: the
        context the caller will run (it must begin with the snapshot's tokens). The one graft door."""

    def deposit(self, token_ids: list[int], extra: dict | None = None) -> Snapshot:
        """The artifact of `token_ids` computed from position 0 in this backend's pinned prefill schedule (a
        Snapshot: `store.put` it to keep it): `prefill` then `capture`, the one deposit (an artifact id does not
        depend on who asked for it)."""
        from kvstore.errors import KVStoreError

        ids = [int(t) for t in token_ids]
        if not ids:
            raise KVStoreError("nothing to deposit: the token sequence is empty; give at least one token")
        state, _ = self.prefill(ids)
        return self.capture(state, ids, extra)


#: The members a new backend writes (the abstract ones of `Backend`; docs/extending.md states the count).
ABSTRACT: tuple[str, ...] = tuple(sorted(Backend.__abstractmethods__))


class Stepwise(ABC):
    """The step-wise capability: the caller drives decoding one token at a time (one row; BatchedRows for more)."""

    @abstractmethod
    def new_state(self) -> Any:
        """An empty state."""

    @abstractmethod
    def forward(self, token_ids: list[int], state: Any, position: int | None = None) -> torch.Tensor:
        """`token_ids` after `state` (which advances): every position's logits (1, len, vocab)."""

    @abstractmethod
    def step(self, state: Any, tokens: list[int], position: int) -> torch.Tensor:
        """One token per row of `state` at `position`: the logits (rows, vocab). Without BatchedRows, one row."""


class BatchedRows(Stepwise):
    """Several rows of one context decoded together: `repeat_rows` after the shared prefill, `step` with one token per
    row, `keep_rows` as rows finish (decoding.batch_size > 1 on a step-wise engine)."""

    @abstractmethod
    def repeat_rows(self, state: Any, n: int) -> None:
        """Every row of `state` repeated to `n` rows."""

    @abstractmethod
    def keep_rows(self, state: Any, rows: list[int]) -> None:
        """Keep only the given rows of `state`, in that order."""


class RaggedRows(BatchedRows):
    """Rows of different contexts (any lengths) decoded in one batch: problems in flight on a step-wise engine."""

    @abstractmethod
    def join_rows(self, states: Sequence[Any]) -> Any:
        """One state holding every row of `states`, left-padded, each row at its own positions."""

    @abstractmethod
    def step_rows(self, state: Any, tokens: list[int], positions: list[int]) -> torch.Tensor:
        """One token per row, each at its own position: the logits (rows, vocab)."""


class InEngineDecoding(ABC):
    """The in-engine decoding capability: the engine continues whole rows itself (its own batching and sampler)."""

    @abstractmethod
    def continue_rows(self, state: Any, prompt_ids: list[int], seeds: Sequence[int], *, max_new_tokens: int,
                      stop: Sequence[str] = (), strategy: str = "greedy", temperature: float = 0.7,
                      top_p: float = 0.95, eos: set[int] | None = None) -> list[Continuation]:
        """One Continuation per seed of `prompt_ids` (`state` holds a prefix of it, or None)."""

    def graft_refusal(self, token_count: int) -> str | None:
        """Why an artifact of `token_count` tokens deposited here (from position 0) would be refused before a longer
        prompt, naming the setting that makes it work; None (the default) when it grafts."""
        return None


@dataclass(frozen=True)
class RowsRequest:
    """One context of a batch of contexts (`InEngineBatches.continue_many`): the state holding a prefix of
    `prompt_ids` (a graft; None: nothing held) and one seed per row to decode from it."""

    state: Any
    prompt_ids: list[int]
    seeds: Sequence[int]


class InEngineBatches(InEngineDecoding):
    """Several contexts' rows submitted to the engine at once (its scheduler batches them): problems in flight."""

    @abstractmethod
    def continue_many(self, requests: Sequence[RowsRequest], *, max_new_tokens: int, stop: Sequence[str] = (),
                      strategy: str = "greedy", temperature: float = 0.7, top_p: float = 0.95,
                      eos: set[int] | None = None) -> list[list[Continuation]]:
        """Every request's Continuations, in request order."""


class Repositioning(ABC):
    """The position experiment's capability (transformers): an artifact's keys re-rotated to start at `offset`."""

    @abstractmethod
    def graft_repositioned(self, snapshot: Snapshot, offset: int) -> Any:
        """A fresh state holding `snapshot` re-rotated to start at `offset` (not exact)."""


def supports_in_flight(cls: type) -> bool:
    """Whether a backend class decodes several contexts together (problems in flight): RaggedRows or
    InEngineBatches."""
    return issubclass(cls, (RaggedRows, InEngineBatches))


def supports_batched_rows(cls: type) -> bool:
    """Whether a backend class decodes several rows of one context together: BatchedRows or InEngineDecoding."""
    return issubclass(cls, (BatchedRows, InEngineDecoding))
