"""The vLLM backend's settings: what a caller chooses for `kvstore.load_backend("vllm", ...)` (a light module: the
harness derives its `model.vllm` config schema from this dataclass; it imports neither vLLM nor torch).

Every field that changes bits is recorded in every artifact by the connector (kvstore.backends.vllm.identity), and an
artifact grafts only into an engine with the same values. The connector's own choices (its store, deposit and graft
modes, the logits it returns) are the backend's, not the caller's: kvstore.backends.vllm.engine sets them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class VllmBackendSettings:
    """An in-process vllm.LLM on CPU, threads pinned and its KV cache sized explicitly.

    max_num_batched_tokens: the prefill budget per engine step; a prompt up to it is prefilled in one chunk (the
        pinned schedule of a deposit and of a fresh reference).
    scratch: the folder where the engine's connector keeps the artifacts it deposits and grafts ("" = a new
        temporary folder per engine; a library keeps its own copies in its own store)."""

    model: str = ""  # an HF safetensors folder; "" = the bundled Gemma 3 270M dequantized once into one
    dtype: str = "bfloat16"
    threads: int = 2
    block_size: int = 128
    max_model_len: int = 8192
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 16
    kv_cache_gib: int = 2
    enforce_eager: bool = True
    seed: int = 0
    scratch: str = ""
    model_name: str = "gemma3-270m"
