"""The transformers backend: the one object a loaded transformers model is (it owns its FrozenModel, `.fm`), with a
transformers DynamicCache as the state. Core, Stepwise, RaggedRows and Repositioning (kvstore.engine.protocol).

Every verb calls the engine's own functions (kvstore.backends.transformers.capture.prefill/forward/capture_snapshot,
restore.py's layout check and rebuild after the one admission), so the bits are those of the code before the seam
existed (`make replay` reproduces the registered hashes). Its artifacts record no `determinism["backend"]` (absent =
transformers, kvstore/FORMAT.md section 10), so every library deposited before the seam still grafts.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from kvstore.backends.transformers import ragged
from kvstore.backends.transformers.capture import capture_snapshot, forward, new_cache, prefill
from kvstore.backends.transformers.model import (
    FrozenModel,
    cache_kwargs,
    environment_fingerprint,
    layout_string,
    load_frozen_model,
    smallest_window,
)
from kvstore.backends.transformers.restore import check_layout, rebuild, rotate_keys
from kvstore.backends.transformers.settings import TransformersSettings
from kvstore.engine.admission import admit
from kvstore.engine.protocol import TRANSFORMERS, Backend, RaggedRows, Repositioning
from kvstore.engine.text import HFTokenizer, eos_of
from kvstore.engine.weights import PinnedWeights
from kvstore.errors import IncompatibleError
from kvstore.format.artifact import Snapshot, guard


class TransformersBackend(Backend, RaggedRows, Repositioning):
    """kvstore.engine.protocol.Backend (and RaggedRows, so BatchedRows and Stepwise; Repositioning) owning a
    FrozenModel: `load` (the registry's loader) makes one; `TransformersBackend.of(fm)` gives a FrozenModel's one
    backend."""

    name = TRANSFORMERS
    settings_class = TransformersSettings
    batch_invariant_absent = ""  # it offers determinism.batch_invariant (its own fixed-order kernel: invariant.py)

    @classmethod
    def load(cls, settings: TransformersSettings) -> TransformersBackend:
        """The registry's loader (kvstore.backends): the model loaded frozen under the pinned settings."""
        return cls.of(load_frozen_model(settings.source, settings.determinism, device=settings.device,
                                        seed=settings.seed))

    @classmethod
    def mode_unavailable(cls) -> str | None:
        """Why the mode's fixed-order kernel cannot run here (no C compiler, a build error, the compiled kernel
        differing from its scalar reference: kvstore.backends.transformers.invariant), or None. Measured once."""
        from kvstore.backends.transformers.invariant import unavailable

        return unavailable()

    def __init__(self, fm: FrozenModel) -> None:
        self.fm = fm
        self._text: HFTokenizer | None = None

    @classmethod
    def of(cls, model: TransformersBackend | FrozenModel) -> TransformersBackend:
        """`model` when it is a backend; a FrozenModel's one backend (made on first use and kept with it, so every
        caller of the engine's functions shares it)."""
        if isinstance(model, cls):
            return model
        if not isinstance(model, FrozenModel):
            raise IncompatibleError(f"{type(model).__name__} is not a transformers model: give the backend "
                                    "load_backend('transformers', ...) returns, or its FrozenModel")
        be = model.__dict__.get("transformers_backend")
        if be is None:
            be = model.__dict__["transformers_backend"] = cls(model)
        return be

    # facts
    @property
    def model_name(self) -> str:
        return self.fm.name

    @property
    def fingerprint(self) -> str:
        return self.fm.fingerprint

    @property
    def tokenizer_fingerprint(self) -> str:
        return self.fm.tokenizer_fingerprint

    @property
    def dtype(self) -> str:
        return self.fm.determinism.dtype

    def settings(self) -> dict:
        return self.fm.recorded_settings()  # the Determinism's dict (and the mode's kernel version)

    def environment(self) -> dict:
        return environment_fingerprint(self.fm.device)

    def context_size(self) -> int | None:
        """The config's max_position_embeddings (its text config's for a multimodal model); None when unset."""
        config = self.fm.config
        n = getattr(config, "max_position_embeddings", None) or getattr(
            getattr(config, "text_config", None), "max_position_embeddings", None
        )
        return int(n) if n else None

    def allows_environment_mismatch(self) -> bool:
        """determinism.allow_environment_mismatch (a policy, not a recorded setting)."""
        return bool(self.fm.determinism.allow_environment_mismatch)

    def torch_threads_matter(self) -> bool:
        """torch computes every bit here, so its thread count is part of what an artifact records."""
        return True

    def numerics(self) -> str:
        """The numerics fingerprint of this model's kernels in this process (kvstore.environment.
        numerics_fingerprint; measured once per model, on first use)."""
        return self.fm.numerics_sha256

    def former_numerics(self) -> tuple[str, ...]:
        """The mode's fingerprints under its battery's earlier formats (FrozenModel.former_numerics)."""
        return self.fm.former_numerics

    def batch_invariant(self) -> bool:
        """determinism.batch_invariant: every forward batch-invariant (invariant.py), the mode the tests show."""
        return bool(self.fm.determinism.batch_invariant)

    def pinned_weights(self) -> PinnedWeights | None:
        """The checkpoint's weight files pinned at load (None for a tiny random model)."""
        return self.fm.weights

    # text: the model's tokenizer (the config's eos_token_id, int or list, and the tokenizer's; the text config's
    # vocabulary; the chat template from the GGUF for a packaged model)
    def tokenizer(self) -> HFTokenizer:
        if self._text is None:
            fm = self.fm
            self._text = HFTokenizer(fm.tokenizer, eos_of(getattr(fm.config, "eos_token_id", None),
                                                          fm.tokenizer.eos_token_id),
                                     int(fm.config.get_text_config(decoder=True).vocab_size))
        return self._text

    # compute
    def new_state(self) -> DynamicCache:
        return new_cache(self.fm)

    def seen(self, state: DynamicCache) -> int:
        return int(state.get_seq_length())

    def prefill(self, token_ids: list[int], state: DynamicCache | None = None,
                position: int | None = None) -> tuple[DynamicCache, torch.Tensor]:
        return prefill(self.fm, token_ids, state, position=position)

    def forward(self, token_ids: list[int], state: DynamicCache, position: int | None = None) -> torch.Tensor:
        return forward(self.fm, token_ids, state, position=position)

    # batch decode
    def repeat_rows(self, state: DynamicCache, n: int) -> None:
        state.batch_repeat_interleave(n)

    def keep_rows(self, state: DynamicCache | ragged.JoinedRows, rows: list[int]) -> None:
        if isinstance(state, ragged.JoinedRows):
            ragged.keep(self.fm, state, rows)
            return
        state.batch_select_indices(torch.tensor(rows, dtype=torch.long, device=self.fm.device))

    # rows of different contexts in one batch (RaggedRows: problems in flight; ragged.py)
    def join_rows(self, states: list[DynamicCache]) -> ragged.JoinedRows:
        return ragged.join(self.fm, states)

    def step_rows(self, state: ragged.JoinedRows, tokens: list[int], positions: list[int]) -> torch.Tensor:
        return ragged.step(self.fm, state, tokens, positions)

    def step(self, state: DynamicCache, tokens: list[int], position: int) -> torch.Tensor:
        """One token per running row at `position`: the logits (rows, vocab)."""
        device = self.fm.device
        ids = torch.tensor([[t] for t in tokens], dtype=torch.long, device=device)  # (rows, 1)
        pos = torch.full((len(tokens), 1), position, dtype=torch.long, device=device)
        out = self.fm.model(input_ids=ids, position_ids=pos, **cache_kwargs(self.fm.model, state), use_cache=True)
        return out.logits[:, -1, :]

    # artifacts
    def capture(self, state: DynamicCache, token_ids: list[int], extra: dict | None = None) -> Snapshot:
        return capture_snapshot(self.fm, state, token_ids, 0, extra)

    def check(self, snapshot: Snapshot, token_ids: list[int] | None = None, position: int | None = None,
              allow_environment_mismatch: bool | None = None) -> None:
        """The one admission (kvstore.engine.admission.admit) then this engine's layout check: IncompatibleError
        naming the first difference (FORMAT.md section 5). allow_environment_mismatch None: the model's policy."""
        allow = self.allows_environment_mismatch() if allow_environment_mismatch is None else allow_environment_mismatch
        with guard("graft compatibility check", IncompatibleError):
            admit(snapshot, self, token_ids, allow_environment_mismatch=bool(allow))
            check_layout(snapshot, self.fm, position)

    def graft(self, snapshot: Snapshot, token_ids: list[int] | None = None, *, position: int | None = None,
              allow_environment_mismatch: bool | None = None) -> DynamicCache:
        """A fresh cache holding the snapshot at its own positions, after every check (`check`)."""
        self.check(snapshot, token_ids, position, allow_environment_mismatch)
        if snapshot.start_position != 0:
            raise IncompatibleError(
                f"artifact starts at position {snapshot.start_position}; a fresh cache starts at 0. "
                "Graft a snapshot computed from position 0."
            )
        return rebuild(snapshot, self.fm)

    def graft_repositioned(self, snapshot: Snapshot, offset: int) -> DynamicCache:
        """The position experiment (Repositioning): the snapshot's keys re-rotated to start at `offset` (not exact)."""
        self.check(snapshot)
        return rebuild(snapshot, self.fm, rotate_keys(self.fm, snapshot, offset))

    # what a script or benchmark reads of this model beside the seam: through the backend, never its FrozenModel
    @property
    def device(self) -> torch.device:
        """Where the model's tensors (and every state it makes) live."""
        return self.fm.device

    def layer_layout(self) -> list[dict]:
        """One entry per decoder layer, its kind and window ({"kind": "sliding", "window": 512}); `layout_string`
        (this folder's face) writes it in one word."""
        return self.fm.layer_layout

    def layer_kinds(self) -> str:
        """The layer layout in one word (`layout_string`: "SSSSSF...")."""
        return layout_string(self.fm.layer_layout)

    def sliding_window(self) -> int | None:
        """The smallest window of the model's sliding (or chunked) layers; None for a model without one."""
        return smallest_window(self.fm.layer_layout)

    def torch_model(self) -> torch.nn.Module:
        """The transformers model itself, for a measurement against bare transformers (`model.generate`, its
        parameter count); every verb above is the way to compute an artifact or a reference."""
        return self.fm.model

