"""What binds a vLLM artifact to the engine that may graft it: the model and tokenizer fingerprints, the engine
settings that change bits, the layer layout: the Facts the one admission (kvstore.engine.admission) compares.

    fp = model_fingerprint(folder)              # SHA-256 over config.json + every *.safetensors file
    settings = engine_settings(vllm_config, threads=2, isa="vec", kv_layout=layout.name)
    why = admission_differences(snapshot, identity.facts())   # kvstore.engine.admission: [] = admitted

vLLM loads an HF safetensors folder (no GGUF on its CPU backend), so the model fingerprint is the folder's:
SHA-256 over canonical JSON of `[name, size, sha256]` for config.json and each weight file, in name order. The
dtype the engine computes in is a setting (`dtype`), not part of the folder. Every setting in `engine_settings`
is binding (compared key by key, each difference named): the vLLM version, block size, dtype, KV-cache dtype,
the paged layout read from the kernel (kvstore.backends.vllm.paged), the attention backend and its ISA, the
batch-invariant flag, the prefill schedule (chunked prefill and its token budget), eager mode, the hybrid KV
manager, the CPU attention's split-KV switch and the thread count (not which cores they are bound to). An
artifact records them in `determinism`, with `backend = "vllm"`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvstore.backends.packaged import file_sha256
from kvstore.engine.admission import Facts

NAME = "vllm"
MODEL_FILES = ("config.json", "*.safetensors")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "chat_template.jinja")


def folder_fingerprint(folder: str | Path, patterns: tuple[str, ...]) -> str:
    """SHA-256 over canonical JSON of [name, size, sha256] of the folder's files matching `patterns`."""
    root = Path(folder)
    files = sorted({p for pat in patterns for p in root.glob(pat) if p.is_file()})
    rows = [[p.name, p.stat().st_size, file_sha256(p)] for p in files]
    return hashlib.sha256(json.dumps(rows, separators=(",", ":")).encode()).hexdigest()


def model_fingerprint(folder: str | Path) -> str:
    return folder_fingerprint(folder, MODEL_FILES)


def tokenizer_fingerprint(folder: str | Path) -> str:
    return folder_fingerprint(folder, TOKENIZER_FILES)


def dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def engine_settings(vllm_config: Any, threads: int, isa: str, kv_layout: str,
                    attn_implementation: str = "CPU_ATTN") -> dict[str, Any]:
    """The recorded, binding settings of a vLLM engine (the format's five first; kvstore/FORMAT.md section 6)."""
    import torch
    import vllm
    import vllm.envs as envs

    mc, cc, sc = vllm_config.model_config, vllm_config.cache_config, vllm_config.scheduler_config
    chunked = bool(getattr(sc, "enable_chunked_prefill", False))
    return {
        "backend": NAME,
        "threads": int(threads),
        "deterministic_algorithms": bool(torch.are_deterministic_algorithms_enabled()),
        "attn_implementation": attn_implementation,
        "dtype": dtype_name(mc.dtype),
        "prefill_chunk": int(sc.max_num_batched_tokens) if chunked else 0,
        "vllm": vllm.__version__,
        "block_size": int(cc.block_size),
        "kv_cache_dtype": str(cc.cache_dtype),
        "kv_layout": kv_layout,
        "attn_isa": isa,
        "batch_invariant": bool(envs.VLLM_BATCH_INVARIANT),
        "enable_chunked_prefill": chunked,
        "max_num_batched_tokens": int(sc.max_num_batched_tokens),
        "enforce_eager": bool(mc.enforce_eager),
        "hybrid_kv_cache_manager": not bool(sc.disable_hybrid_kv_cache_manager),
        "cpu_attn_split_kv": bool(envs.VLLM_CPU_ATTN_SPLIT_KV),
    }


@dataclass(frozen=True)
class EngineIdentity:
    """Everything an artifact must match to graft into this engine."""

    model_fingerprint: str
    tokenizer_fingerprint: str
    settings: dict[str, Any]
    environment: dict[str, Any]
    layout: list[dict[str, Any]]  # per layer {"kind", "window"}, in layer order
    model_name: str

    def facts(self) -> Facts:
        """What kvstore.engine.admission compares an artifact with: these, the layout included (the connector has no
        Backend; its dtype is the one its settings record, its vocabulary is not compared here)."""
        return Facts(NAME, self.model_name, self.model_fingerprint, self.tokenizer_fingerprint,
                     str(self.settings.get("dtype")), dict(self.settings), dict(self.environment), layout=self.layout)
