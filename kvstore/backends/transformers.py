"""The transformers backend: a kvstore.FrozenModel and a transformers DynamicCache as the state.

Every verb calls the engine's own functions (kvstore.capture.prefill/forward/capture_snapshot,
kvstore.graft.graft_snapshot), so the bits are those of the code before the seam existed (`make replay`
reproduces the registered hashes). Its artifacts record no `determinism["backend"]` (absent = transformers,
kvstore/FORMAT.md section 10), so every library deposited before the seam still grafts.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from kvstore.backend import TRANSFORMERS, refuse_other_backend
from kvstore.capture import capture_snapshot, forward, new_cache, prefill
from kvstore.format import Snapshot
from kvstore.graft import graft_snapshot, settings_differences
from kvstore.model import FrozenModel, environment_fingerprint


class TransformersBackend:
    """kvstore.backend.Backend over a FrozenModel (`as_backend(fm)` makes one)."""

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

    # text
    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        return self.fm.encode(text, add_bos=add_bos)

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
        out = self.fm.model(input_ids=ids, position_ids=pos, cache=state, use_cache=True)
        return out.logits[:, -1, :]

    # artifacts
    def capture(self, state: DynamicCache, token_ids: list[int], extra: dict | None = None) -> Snapshot:
        return capture_snapshot(self.fm, state, token_ids, 0, extra)

    def graft(self, snapshot: Snapshot, token_ids: list[int] | None = None) -> DynamicCache:
        refuse_other_backend(snapshot, self.name)
        return graft_snapshot(snapshot, self.fm, token_ids=token_ids)

    def settings_differences(self, snapshot: Snapshot) -> list[str]:
        return settings_differences(snapshot, self.fm)
