"""The vLLM backend's settings, one hierarchy (a light module: it imports neither vLLM nor torch):

    VllmBackendSettings   what a caller of `kvstore.load_backend("vllm", ...)` chooses (the harness derives its
                          `model.vllm` config schema from this dataclass)
    VllmSettings          those, plus the connector's choices: the engine as launch.start_engine starts it (its store,
                          role, deposit and graft modes, the logits it returns). The Backend (backend.py) makes one
                          from the caller's settings and sets the connector's choices itself; scripts that start an
                          engine of their own choose them.

Every field that changes bits is recorded in every artifact by the connector (kvstore.backends.vllm.identity), and an
artifact grafts only into an engine with the same values.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from kvstore.backends.settings import BackendSettings
from kvstore.errors import SettingsError

ROLES = ("kv_both", "kv_producer", "kv_consumer")
POLICIES = ("fail", "recompute")


@dataclass(frozen=True)
class VllmBackendSettings(BackendSettings):
    """An in-process vllm.LLM on CPU, threads pinned and its KV cache sized explicitly.

    max_num_batched_tokens: the prefill budget per engine step; a prompt up to it is prefilled in one chunk (the
        pinned schedule of a deposit and of a fresh reference).
    max_model_len: the engine's context (the backend's `context_size`).
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

    def __post_init__(self) -> None:
        if self.block_size % 32:
            raise SettingsError(f"the vLLM setting block_size={self.block_size}: vLLM's CPU attention needs a "
                                "multiple of 32")


@dataclass(frozen=True)
class VllmSettings(VllmBackendSettings):
    """An engine and its connector: the caller's settings above plus the connector's. store="" runs vLLM without
    the connector (no deposits, no grafts).

    role: kv_both (deposit and graft), kv_producer (deposit only), kv_consumer (graft only).
    on_refused: vLLM's kv_load_failure_policy. An artifact refused at admission is never claimed (the prompt is
        computed, the output's kv_transfer_params name the refusal); the policy governs only a load the worker
        refuses after admission: "fail" fails the request (finish_reason "error"), "recompute" computes the prefix
        (vllm #49250: prefer "fail"). Refusals are logged and journaled; refused bytes are never used.
    deposit: "all" prompts, the "marked" ones (extra_args={"kv_transfer_params": {"kvgraft_deposit": True}}), "none".
    graft: "all" (any prompt whose whole-block prefix an artifact of the store holds) or "marked" (only requests
        naming their artifact: {"kvgraft_graft": id, "kvgraft_tokens": n}; the Backend, backend.py, uses this).
    """

    enable_prefix_caching: bool = True
    store: str = ""
    role: str = "kv_both"
    deposit: str = "all"
    graft: str = "all"
    on_refused: str = "fail"
    journal: str = ""
    max_logprobs: int = 20
    logprobs_mode: str = "raw_logprobs"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.role not in ROLES:
            raise SettingsError(f"the vLLM setting role={self.role!r}: use one of {list(ROLES)}")
        if self.on_refused not in POLICIES:
            raise SettingsError(f"the vLLM setting on_refused={self.on_refused!r}: use one of {list(POLICIES)}")

    @classmethod
    def of(cls, caller: VllmBackendSettings, **connector: Any) -> VllmSettings:
        """The caller's settings, every field as given, with the connector's `connector` choices."""
        return cls(**{f.name: getattr(caller, f.name) for f in dataclasses.fields(VllmBackendSettings)}, **connector)
