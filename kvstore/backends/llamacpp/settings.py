"""The llama.cpp backend's settings: what a caller chooses, recorded in every artifact (a light module: the harness
derives its `model.llamacpp` config schema from this dataclass)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LlamaCppSettings:
    """Everything the bits of a llama.cpp computation depend on that the caller chooses; all are recorded in
    every artifact (`determinism`) and an artifact grafts only under the same values.

    swa_full: keep every position in the sliding-window cache (llama.cpp's default keeps n_swa + n_ubatch
    cells); required to deposit or graft a sequence longer than the window (see `capture`)."""

    gguf: str = ""  # "" = the bundled GGUF; a packaged model name (kvstore.backends.packaged) or a GGUF file path
    n_ctx: int = 4096
    n_batch: int = 512  # the prefill schedule: chunks of n_batch tokens
    n_ubatch: int = 512
    threads: int = 2
    type_k: str = "float16"
    type_v: str = "float16"
    flash_attn: bool = False
    swa_full: bool = True
    extra_bufts: bool = True  # llama.cpp's extra weight buffer types (repacked weights, AMX where built in)
    model_name: str = "gemma3-270m-gguf"
