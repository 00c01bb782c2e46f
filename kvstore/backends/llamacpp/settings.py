"""The llama.cpp backend's settings: what a caller chooses, recorded in every artifact (a light module: the harness
derives its `model.llamacpp` config schema from this dataclass)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from kvstore.backends.settings import BackendSettings, ModelChoice


@dataclass(frozen=True)
class LlamaCppSettings(BackendSettings):
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

    @classmethod
    def from_config(cls, choice: ModelChoice) -> LlamaCppSettings:
        """The default's keywords, and for a `gguf` left empty the choice's source when that is not the bundled
        model's name (a packaged model's name or a GGUF file); a choice that names no model name records a packaged
        model as `<name>-gguf` and a file by its stem."""
        from kvstore.backends.packaged import BUNDLED, known_names

        out = cls.chosen(choice)
        if not out.get("gguf") and choice.source and choice.source != BUNDLED:
            out["gguf"] = choice.source
        gguf = out.get("gguf")
        if gguf and "model_name" not in out:
            out["model_name"] = f"{gguf}-gguf" if gguf in known_names() else Path(gguf).stem
        return cls(**out)

    def resolved(self) -> LlamaCppSettings:
        """A packaged model's name resolved to its GGUF file (assembled here, once)."""
        from kvstore.backends.packaged import gguf_path, known_names

        if self.gguf in known_names():
            return dataclasses.replace(self, gguf=str(gguf_path(self.gguf)))
        return self
