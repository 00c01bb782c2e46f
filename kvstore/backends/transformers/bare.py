"""transformers alone, on a loaded TransformersBackend's own model: what a benchmark that compares kvgraft with bare
transformers, or reads the model itself, calls (scripts/bench/overhead.py, scripts/bench/context.py,
scripts/gpu_bench.py), so every reach into the model stays in this folder. Asked through the registry:
`kvstore.backend_tools("transformers").bare`."""

from __future__ import annotations

import warnings
from typing import Any

import torch


def greedy(be: Any, ids: list[int], new_tokens: int) -> list[int]:
    """`model.generate` (greedy, one row) of `new_tokens` tokens after `ids`: the new token ids."""
    x = torch.tensor([ids], device=be.device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # one row is never padded: the pad id only silences generate's warning
        out = be.torch_model().generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens,
                                        do_sample=False, pad_token_id=min(be.eos_ids()))
    return out[0, len(ids):].tolist()


def model(be: Any) -> torch.nn.Module:
    """The transformers model itself (its config, its modules), for a measurement that reads the model."""
    return be.torch_model()


def parameter_count(be: Any) -> int:
    """How many parameters the model has."""
    return sum(p.numel() for p in be.torch_model().parameters())


def device(be: Any) -> torch.device:
    """The torch device the model runs on."""
    return be.device
