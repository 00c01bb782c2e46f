"""Tiny random-weight models for tests and bulk benchmarks: small configs, seeded weights, a byte tokenizer.

    load_frozen_model("tiny-gemma3")   # 6 layers, (sliding, sliding, full) x 2, window 16, 1 KV head
    load_frozen_model("tiny-llama")    # 4 full-attention layers, 2 KV heads
    load_frozen_model("tiny-mistral")  # 4 layers, `sliding_window` 16 and no `layer_types`: all layers sliding

`architecture_config(name)` / `save_architecture(name, folder)`: a tiny random checkpoint (config + weights +
tokenizer, a few hundred kB) of each architecture in `ARCHITECTURES`, built from transformers' own config classes
(no download), for the architecture test (tests/kvstore/test_architectures.py) and docs/exactness.md.

All three share a real byte-level BPE tokenizer with no merges (ids 0-3 special, 4-259 the 256 bytes), so any
text encodes, and prefixes longer than the window are cheap. The weights are a pure function of the seed.
"""

from __future__ import annotations

import torch

from kvstore.determinism import Determinism
from kvstore.errors import ModelLoadError

TINY = ("tiny-gemma3", "tiny-llama", "tiny-mistral")
_COMMON = dict(vocab_size=260, hidden_size=64, intermediate_size=128, num_attention_heads=4,
               max_position_embeddings=1 << 20, pad_token_id=0, eos_token_id=1, bos_token_id=2)


def byte_tokenizer():
    """A real byte-level BPE tokenizer with no merges: 256 byte tokens plus <pad>, <eos>, <bos>, <unk>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3}
    for ch in sorted(alphabet):
        vocab[ch] = len(vocab)
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tk.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )


def tiny_config(kind: str):
    """The config of a tiny model (see the module docstring for the layouts)."""
    if kind == "tiny-gemma3":
        from transformers import Gemma3TextConfig

        return Gemma3TextConfig(
            num_hidden_layers=6, num_key_value_heads=1, head_dim=16, sliding_window=16,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2, **_COMMON,
        )
    if kind == "tiny-llama":
        from transformers import LlamaConfig

        return LlamaConfig(num_hidden_layers=4, num_key_value_heads=2, **_COMMON)
    if kind == "tiny-mistral":
        from transformers import MistralConfig

        return MistralConfig(num_hidden_layers=4, num_key_value_heads=2, sliding_window=16, **_COMMON)
    raise ModelLoadError(f"unknown tiny model {kind!r}; use one of {', '.join(TINY)}")


def build_tiny(kind: str, det: Determinism, seed: int) -> tuple[torch.nn.Module, object]:
    """(model, tokenizer): the tiny model `kind` with weights drawn from `seed`, in det's dtype and attention."""
    from transformers import AutoModelForCausalLM

    cfg = tiny_config(kind)
    cfg._attn_implementation = det.attn_implementation
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=det.torch_dtype)
    return model, byte_tokenizer()


# ------------------------------------------------------------------------------ architectures beyond the tiny three
_ARCH = dict(vocab_size=260, hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1,
             pad_token_id=0, eos_token_id=1, bos_token_id=2, max_position_embeddings=4096)
_GEMMA3N = dict(num_hidden_layers=4, head_dim=16, sliding_window=8, vocab_size_per_layer_input=260,
                hidden_size_per_layer_input=8, laurel_rank=4, altup_num_inputs=2, intermediate_size=[64] * 4,
                activation_sparsity_pattern=[0.0] * 4, layer_types=["sliding_attention", "full_attention"] * 2)
_MAMBA = dict(mamba_d_state=4, mamba_d_conv=4, mamba_expand=2)

# name -> (transformers config class, its arguments, the attention implementation it needs or None for either).
# Windows and chunks are 8 tokens, so a 20-token prefix is past them.
_ARCHITECTURES: dict[str, tuple[str, dict, str | None]] = {
    "gpt-oss": ("GptOssConfig", dict(num_hidden_layers=2, head_dim=16, sliding_window=8, num_local_experts=4,
                                     num_experts_per_tok=2), "eager"),
    "llama4-text": ("Llama4TextConfig", dict(num_hidden_layers=4, head_dim=16, attention_chunk_size=8,
                                             intermediate_size_mlp=64, num_local_experts=2, num_experts_per_tok=1),
                    None),
    "qwen3-moe": ("Qwen3MoeConfig", dict(num_hidden_layers=2, head_dim=16, moe_intermediate_size=32, num_experts=4,
                                         num_experts_per_tok=2), None),
    "smollm3": ("SmolLM3Config", dict(num_hidden_layers=4), None),
    "exaone4": ("Exaone4Config", dict(num_hidden_layers=4, head_dim=16, sliding_window=8, sliding_window_pattern=4),
                None),
    "granite": ("GraniteConfig", dict(num_hidden_layers=2), None),
    "granitemoe": ("GraniteMoeConfig", dict(num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2), None),
    "gemma2": ("Gemma2Config", dict(num_hidden_layers=2, head_dim=16, sliding_window=8), "eager"),
    "gemma3n": ("Gemma3nTextConfig", dict(_GEMMA3N, num_kv_shared_layers=0), None),
    "gemma3n-kv-shared": ("Gemma3nTextConfig", dict(_GEMMA3N, num_kv_shared_layers=2), None),
    "qwen3-next": ("Qwen3NextConfig", dict(num_hidden_layers=4, head_dim=16, linear_num_value_heads=2,
                                           linear_num_key_heads=1, linear_key_head_dim=8, linear_value_head_dim=8,
                                           linear_conv_kernel_dim=4, moe_intermediate_size=32,
                                           shared_expert_intermediate_size=32, num_experts=4, num_experts_per_tok=2),
                   None),
    "jamba": ("JambaConfig", dict(_MAMBA, num_hidden_layers=2, attn_layer_period=2, attn_layer_offset=1,
                                  expert_layer_period=2, expert_layer_offset=1, num_experts=2, num_experts_per_tok=1,
                                  mamba_dt_rank=4), None),
    "zamba2": ("Zamba2Config", dict(_MAMBA, num_hidden_layers=2, layers_block_type=["mamba", "hybrid"],
                                    mamba_headdim=8, mamba_ngroups=1, n_mamba_heads=8, attention_head_dim=16,
                                    num_mem_blocks=1, use_mem_rope=True), None),
    # the same with its hybrid (mamba + attention) layer first: keys/values *and* recurrent state in one layer
    "zamba2-hybrid-first": ("Zamba2Config", dict(_MAMBA, num_hidden_layers=2, layers_block_type=["hybrid", "mamba"],
                                                 mamba_headdim=8, mamba_ngroups=1, n_mamba_heads=8,
                                                 attention_head_dim=16, num_mem_blocks=1, use_mem_rope=True), None),
    "mamba2": ("Mamba2Config", dict(vocab_size=260, hidden_size=32, num_hidden_layers=2, state_size=4, conv_kernel=4,
                                    expand=2, head_dim=8, num_heads=8, n_groups=1, pad_token_id=0, eos_token_id=1,
                                    bos_token_id=2), "eager"),
    "deepseek-v3": ("DeepseekV3Config", dict(num_hidden_layers=2, num_key_value_heads=2, kv_lora_rank=16,
                                             q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
                                             moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2,
                                             n_group=1, topk_group=1, first_k_dense_replace=1), None),
    "t5": ("T5Config", dict(vocab_size=260, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=2,
                            decoder_start_token_id=0, pad_token_id=0, eos_token_id=1), None),
}
ARCHITECTURES = tuple(_ARCHITECTURES)


def architecture_config(name: str):
    """(config, attention implementation it needs or None) of the tiny checkpoint `name` (one of ARCHITECTURES)."""
    import transformers

    if name not in _ARCHITECTURES:
        raise ModelLoadError(f"unknown tiny architecture {name!r}; use one of {', '.join(ARCHITECTURES)}")
    cls, kwargs, attn = _ARCHITECTURES[name]
    common = {} if "vocab_size" in kwargs else _ARCH
    return getattr(transformers, cls)(**{**common, **kwargs}), attn


def save_architecture(name: str, folder, seed: int = 0):
    """Write the tiny random checkpoint `name` (config, seeded weights, the byte tokenizer) into `folder`."""
    from pathlib import Path

    from transformers import AutoModelForCausalLM, T5ForConditionalGeneration

    cfg, attn = architecture_config(name)
    cfg._attn_implementation = attn or "sdpa"
    torch.manual_seed(seed)
    model = (T5ForConditionalGeneration(cfg) if cfg.model_type == "t5" else AutoModelForCausalLM.from_config(cfg))
    folder = Path(folder)
    model.save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)
    return folder
