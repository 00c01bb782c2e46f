"""Tiny random-weight models for tests and bulk benchmarks: small configs, seeded weights, a byte tokenizer.

    load_frozen_model("tiny-gemma3")   # 6 layers, (sliding, sliding, full) x 2, window 16, 1 KV head
    load_frozen_model("tiny-llama")    # 4 full-attention layers, 2 KV heads
    load_frozen_model("tiny-mistral")  # 4 layers, `sliding_window` 16 and no `layer_types`: all layers sliding

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
