"""The packaged GGUF models (kvstore.backends.packaged: the bundled Gemma 3 270M, and the 1.5B after
`make setup-models`) and their conversion cache.

transformers dequantizes the GGUF into a dense model; that takes a minute or two, so it is done once and saved
as an ordinary safetensors checkpoint under `$KVGRAFT_CACHE/models/<key>` (default `~/.cache/kvgraft`), keyed
by the GGUF's SHA-256, the dtype and the transformers version. Later loads read the checkpoint. The folder is
published by one atomic rename, so concurrent first loads never see a half-written checkpoint.
"""

from __future__ import annotations

from pathlib import Path

from kvstore.atomic import atomic_directory
from kvstore.backends.packaged import BUNDLED, expected_sha256, gguf_path, models_cache
from kvstore.determinism import Determinism

__all__ = ["converted_checkpoint"]  # BUNDLED is kvstore.backends.packaged's


def converted_checkpoint(det: Determinism, name: str = BUNDLED) -> Path:
    """The dense safetensors checkpoint of packaged GGUF `name` in det's dtype, converting it on first use."""
    import transformers

    key = f"{expected_sha256(name)[:16]}-{det.dtype}-tf{transformers.__version__}"
    cached = models_cache() / key
    if not (cached / "config.json").exists():
        _convert(gguf_path(name), det, cached)  # gguf_path verifies the GGUF's SHA-256
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
