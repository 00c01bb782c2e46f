"""The pinned determinism settings: one object, applied in one place, recorded with every artifact and run.

Byte-exact grafts need the same computation on both sides: the same thread count (CPU GEMM blocking
depends on it), deterministic algorithms, the same attention implementation, dtype and prefill chunking.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

import torch

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class Determinism:
    """Settings that must be equal for two computations to be byte-identical.

    threads: intra-op CPU threads (torch.set_num_threads).
    deterministic_algorithms: torch.use_deterministic_algorithms.
    attn_implementation: transformers attention backend ("sdpa" or "eager").
    dtype: the dtype the model computes and caches in.
    prefill_chunk: tokens per prefill forward pass (0 = the whole sequence at once).
    """

    threads: int = 2
    deterministic_algorithms: bool = True
    attn_implementation: str = "sdpa"
    dtype: str = "float32"
    prefill_chunk: int = 512

    def __post_init__(self) -> None:
        if self.dtype not in _DTYPES:
            raise ValueError(f"determinism.dtype={self.dtype!r} is not one of {sorted(_DTYPES)}")
        if self.threads < 1:
            raise ValueError(f"determinism.threads={self.threads} must be >= 1")
        if self.prefill_chunk < 0:
            raise ValueError(f"determinism.prefill_chunk={self.prefill_chunk} must be >= 0 (0 = no chunking)")
        if self.attn_implementation not in ("sdpa", "eager"):
            raise ValueError(f"determinism.attn_implementation={self.attn_implementation!r}: use 'sdpa' or 'eager'")

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Determinism:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})

    def apply(self) -> None:
        """Apply the settings to this process (idempotent)."""
        # cuBLAS needs this set before the first GEMM to be deterministic on GPU.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)
        torch.use_deterministic_algorithms(self.deterministic_algorithms)
        torch.backends.cudnn.benchmark = False
        if torch.cuda.is_available():
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
