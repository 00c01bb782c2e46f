"""vLLM alone, on a loaded VllmBackend's own engine: what a benchmark that compares kvgraft with bare vLLM calls
(scripts/bench/vllm_backend.py, scripts/bench/in_flight.py), so every reach into the engine's handles stays in this
folder. Asked through the registry: `kvstore.backend_tools("vllm").bare`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def generate(be: Any, prompts: Sequence[list[int]], params: Any) -> list:
    """`vllm.LLM.generate` of the token-id `prompts` under `params` (one SamplingParams, or one per prompt) on the
    backend's engine, no progress bar: vLLM's RequestOutputs."""
    return be.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)


def block_size(be: Any) -> int:
    """The engine's KV block size (the whole-block prefix a graft serves)."""
    return int(be.cfg.block_size)


def request(be: Any, prompt: list[int], state: Any = None, **params: Any) -> list:
    """One request of `prompt` on the backend's engine under `vllm.SamplingParams(**params)`, naming `state`'s graft
    (the connector loads it; None: nothing grafted): vLLM's RequestOutputs."""
    return be.llm.generate([{"prompt_token_ids": prompt}], be.sampling_params(state, **params), use_tqdm=False)
