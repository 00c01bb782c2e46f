"""Random-weight models of real architectures' configs (no download): the shapes of production models, for
benchmarks that measure sizes and speed (scripts/gpu_bench.py) rather than answers.

    CONFIGS   name -> (model_type, config fields), from the public config.json of each family: Gemma 3 1B-, 4B- and
              12B-class text configs (sliding window + full attention, 1, 4 and 8 KV heads), Qwen2.5 1.5B- and
              7B-class configs (full attention, 2 and 4 KV heads of 128) and a Llama 3.1 8B-class config (full
              attention, GQA 8 KV heads; plain RoPE, no rope scaling)
    SMALL     the same architectures and layer patterns with tiny dimensions (a CPU check of a whole pipeline)
    build_random_model(name, small, determinism, device, seed)   the frozen model, weights drawn from the seed
    kv_bytes(config, tokens)   bytes of the KV state after `tokens` tokens
"""

from __future__ import annotations

import torch

from kvstore.backends.transformers.backend import TransformersBackend
from kvstore.backends.transformers.model import FrozenModel, layer_layout, model_fingerprint, tokenizer_fingerprint
from kvstore.backends.transformers.tiny import byte_tokenizer
from kvstore.determinism import Determinism
from kvstore.errors import ModelLoadError

__all__ = ["CONFIGS", "SMALL", "build_random_model", "kv_bytes", "model_config"]


def _gemma_layers(n: int) -> list[str]:
    return [("full_attention" if (i + 1) % 6 == 0 else "sliding_attention") for i in range(n)]


# model_type, config fields (google/gemma-3-1b-pt, google/gemma-3-4b-pt and google/gemma-3-12b-pt text_config,
# Qwen/Qwen2.5-1.5B and Qwen/Qwen2.5-7B, meta-llama/Llama-3.1-8B; no rope scaling)
def _gemma3(vocab: int, hidden: int, inter: int, layers: int, heads: int, kv_heads: int, window: int,
            max_pos: int) -> tuple[str, dict]:
    """A Gemma 3 text config: every 6th layer full attention, the others a sliding window; head_dim 256."""
    return "gemma3_text", dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                               num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=256,
                               sliding_window=window, layer_types=_gemma_layers(layers), query_pre_attn_scalar=256,
                               max_position_embeddings=max_pos, rms_norm_eps=1e-6)


def _qwen25(vocab: int, hidden: int, inter: int, heads: int, kv_heads: int, tied: bool) -> tuple[str, dict]:
    """A Qwen2.5 config: 28 layers, full attention everywhere (no sliding window), rope theta 1e6."""
    return "qwen2", dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=28,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=131072,
                         rms_norm_eps=1e-6, rope_theta=1000000.0, use_sliding_window=False, tie_word_embeddings=tied)


CONFIGS: dict[str, tuple[str, dict]] = {
    "gemma3-1b-class": _gemma3(262144, 1152, 6912, 26, 4, 1, 512, 32768),
    "gemma3-4b-class": _gemma3(262208, 2560, 10240, 34, 8, 4, 1024, 131072),
    "gemma3-12b-class": _gemma3(262208, 3840, 15360, 48, 16, 8, 1024, 131072),
    "qwen2.5-1.5b-class": _qwen25(151936, 1536, 8960, 12, 2, tied=True),
    "qwen2.5-7b-class": _qwen25(152064, 3584, 18944, 28, 4, tied=False),
    "llama3-8b-class": ("llama", dict(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, max_position_embeddings=131072, rms_norm_eps=1e-5,
        rope_theta=500000.0)),
}
# --small: the same architectures and layer patterns, tiny dimensions
SMALL: dict[str, dict] = {
    "gemma3-1b-class": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                            num_attention_heads=4, num_key_value_heads=1, head_dim=16, sliding_window=16,
                            layer_types=_gemma_layers(6), query_pre_attn_scalar=16),
    "gemma3-4b-class": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=32,
                            layer_types=_gemma_layers(6), query_pre_attn_scalar=16),
    "gemma3-12b-class": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=12,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=32,
                             layer_types=_gemma_layers(12), query_pre_attn_scalar=16),
    "qwen2.5-1.5b-class": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                               num_attention_heads=4, num_key_value_heads=2),
    "qwen2.5-7b-class": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                             num_attention_heads=4, num_key_value_heads=2),
    "llama3-8b-class": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=16),
}


def model_config(name: str, small: bool):
    """The transformers config of model `name` (CONFIGS), shrunk to SMALL dimensions when asked."""
    from transformers import AutoConfig

    if name not in CONFIGS:
        raise ModelLoadError(f"unknown random-weight model {name!r}; use one of {', '.join(CONFIGS)}")
    model_type, fields = CONFIGS[name]
    return AutoConfig.for_model(model_type, **{**fields, **(SMALL[name] if small else {})})


def kv_bytes(cfg, tokens: int, itemsize: int = 2) -> int:
    """Bytes of the KV state after `tokens` tokens (sliding layers keep window - 1 positions)."""
    total = 0
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads  # Qwen2: derived
    for lyr in layer_layout(cfg):
        cached = tokens if lyr["kind"] == "full" else min(tokens, lyr["window"] - 1)
        total += 2 * cfg.num_key_value_heads * cached * head_dim * itemsize
    return total


def build_random_model(name: str, small: bool = False, determinism: Determinism | None = None, device: str = "cpu",
                       seed: int = 0) -> TransformersBackend:
    """The transformers backend of a frozen random-weight model of config `name`,
    initialised on `device` from `seed`, fingerprinted (the loader a kvstore.engine.restore_worker.ModelSpec names
    to build the same model in a second process)."""
    from transformers import AutoModelForCausalLM

    det = determinism or Determinism()
    det.apply()
    cfg = model_config(name, small)
    cfg._attn_implementation = det.attn_implementation
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=det.torch_dtype)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    if det.batch_invariant:
        from kvstore.backends.transformers.invariant import install

        install(model)
    tok = byte_tokenizer()
    fm = FrozenModel(name=f"random:{name}{':small' if small else ''}:seed{seed}", model=model, tokenizer=tok,
                     determinism=det)
    fm.fingerprint = model_fingerprint(model)
    fm.tokenizer_fingerprint = tokenizer_fingerprint(tok)
    fm.layer_layout = layer_layout(model.config)
    return TransformersBackend.of(fm)
