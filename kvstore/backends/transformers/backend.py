"""The transformers backend: a kvstore.FrozenModel and a transformers DynamicCache as the state.

Every verb calls the engine's own functions (kvstore.backends.transformers.capture.prefill/forward/capture_snapshot,
kvstore.backends.transformers.graft.graft_snapshot), so the bits are those of the code before the seam existed (`make
replay`
reproduces the registered hashes). Its artifacts record no `determinism["backend"]` (absent = transformers,
kvstore/FORMAT.md section 10), so every library deposited before the seam still grafts.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from kvstore.backends.transformers.capture import capture_snapshot, forward, new_cache, prefill
from kvstore.backends.transformers.graft import graft_repositioned, graft_snapshot
from kvstore.backends.transformers.model import FrozenModel, cache_kwargs, environment_fingerprint, load_frozen_model
from kvstore.backends.transformers.settings import TransformersSettings
from kvstore.engine.protocol import TRANSFORMERS
from kvstore.format.artifact import Snapshot


class TransformersBackend:
    """kvstore.engine.protocol.Backend over a FrozenModel (`as_backend(fm)` makes one)."""

    name = TRANSFORMERS

    def __init__(self, fm: FrozenModel) -> None:
        self.fm = fm

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
        return self.fm.determinism.to_dict()

    def environment(self) -> dict:
        return environment_fingerprint(self.fm.device)

    def numerics(self) -> str:
        """The numerics fingerprint of this model's kernels in this process (kvstore.environment.
        numerics_fingerprint; measured once per model, on first use)."""
        return self.fm.numerics_sha256

    # text
    def encode(self, text: str, add_bos: bool = True, special: bool = False) -> list[int]:
        return self.fm.encode(text, add_bos=add_bos, special=special)

    def chat_template(self) -> str | None:
        """The tokenizer's chat template (from the GGUF for a packaged model; None when it has none)."""
        template = getattr(self.fm.tokenizer, "chat_template", None)
        return template if isinstance(template, str) and template else None

    def decode(self, ids: list[int]) -> str:
        return self.fm.decode(ids)

    def eos_ids(self) -> set[int]:
        """The config's eos_token_id (int or list) and the tokenizer's."""
        ids: set[int] = set()
        for v in (getattr(self.fm.config, "eos_token_id", None), self.fm.tokenizer.eos_token_id):
            if isinstance(v, int):
                ids.add(v)
            elif isinstance(v, (list, tuple)):
                ids.update(int(x) for x in v)
        return ids

    def vocab_size(self) -> int:
        return int(self.fm.config.get_text_config(decoder=True).vocab_size)

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

    def keep_rows(self, state: DynamicCache, rows: list[int]) -> None:
        state.batch_select_indices(torch.tensor(rows, dtype=torch.long, device=self.fm.device))

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

    def graft(self, snapshot: Snapshot, token_ids: list[int] | None = None) -> DynamicCache:
        return graft_snapshot(snapshot, self.fm, token_ids=token_ids)

    def graft_repositioned(self, snapshot: Snapshot, offset: int) -> DynamicCache:
        """The position experiment (transformers only): the snapshot's keys re-rotated to start at `offset`."""
        return graft_repositioned(snapshot, self.fm, offset)


def load(settings: TransformersSettings) -> TransformersBackend:
    """The registry's loader (kvstore.backends): the model loaded frozen under the pinned settings."""
    return load_frozen_model(settings.source, settings.determinism, device=settings.device, seed=settings.seed).backend
