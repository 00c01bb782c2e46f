"""The frozen model: loading (one entry point for every source), its fingerprints and its layer layout.

Sources `load_frozen_model` accepts:
  - "gemma3-270m" (the default): Gemma 3 270M from the bundled GGUF, converted once into a safetensors cache
    (kvstore/backends/transformers/gguf.py).
  - "tiny-gemma3" / "tiny-llama" / "tiny-mistral": small random-weight models built from configs (seeded), with
    a byte-level tokenizer, for tests and bulk benchmarks (kvstore/backends/transformers/tiny.py).
  - a GGUF file by path (`model.source=<file.gguf>`): dequantized once into the same verified cache (gguf.py).
  - a local Hugging Face checkpoint folder, or a hub id (read from the local cache; set HF_HUB_OFFLINE=1).

The model fingerprint is a SHA-256 over the canonical config plus every parameter's name, dtype, shape and
bytes in sorted name order; the tokenizer fingerprint likewise over its vocabulary, special tokens and
backend serialization. Both are part of every artifact and every run manifest. The layer layout (which layers
are sliding-window and their window) is read the way transformers' DynamicCache reads it, so a captured cache
and the layout always agree.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError

from kvstore.backends.packaged import known_names
from kvstore.backends.transformers.gguf import BUNDLED, converted_checkpoint, converted_gguf, is_gguf_file
from kvstore.backends.transformers.invariant import check_invariant_device
from kvstore.backends.transformers.invariant import install as install_invariant
from kvstore.backends.transformers.lm_head import block_lm_head
from kvstore.backends.transformers.tiny import TINY, build_tiny
from kvstore.determinism import ATTN_IMPLEMENTATIONS, Determinism
from kvstore.engine.weights import PinnedWeights, weight_files
from kvstore.environment import current_environment, with_kernel
from kvstore.errors import KVStoreError, ModelLoadError, SettingsError, UnsupportedModelError


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
    weights: PinnedWeights | None = None  # the checkpoint files it was loaded from (none for a tiny model)

    @property
    def config(self):
        return self.model.config

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def recorded_settings(self) -> dict:
        """The settings this model computes under, as its artifacts, runs and registrations record them: the
        Determinism's dict, and in the batch-invariant mode the version of the mode's kernel where it is not the one
        records made before versions name (kvstore.environment.with_kernel; invariant.KERNEL)."""
        d = self.determinism.to_dict()
        if self.determinism.batch_invariant:
            from kvstore.backends.transformers.invariant import KERNEL

            d = with_kernel(d, KERNEL)
        return d

    @property
    def numerics_sha256(self) -> str:
        """kvstore.environment.numerics_fingerprint of this model's shapes, dtype and device in this process's
        settings; in the batch-invariant mode the mode's own battery (invariant.numerics_fingerprint: its tiled
        GEMMs, LM head, block attention and norms). Measured on first use, then kept: the settings are fixed once
        the model is loaded."""
        sha = self.__dict__.get("numerics")
        if sha is None:
            from kvstore.environment import numerics_battery_dims, numerics_fingerprint

            dims = numerics_battery_dims(self.config)
            if self.determinism.batch_invariant:  # the mode's own kernels (invariant.numerics_fingerprint)
                from kvstore.backends.transformers.invariant import numerics_fingerprint as invariant_numerics

                sha = invariant_numerics(dims)
            else:
                sha = numerics_fingerprint(dims, self.determinism.dtype, self.device)
            self.__dict__["numerics"] = sha
        return sha

    @property
    def former_numerics(self) -> tuple[str, ...]:
        """This process's fingerprints under earlier formats of the mode's battery
        (invariant.former_numerics_fingerprints); none for the default mode, whose battery has one format."""
        former = self.__dict__.get("former_numerics")
        if former is None:
            former = ()
            if self.determinism.batch_invariant:
                from kvstore.backends.transformers.invariant import former_numerics_fingerprints
                from kvstore.environment import numerics_battery_dims

                former = former_numerics_fingerprints(numerics_battery_dims(self.config))
            self.__dict__["former_numerics"] = former
        return former

    def encode(self, text: str, add_bos: bool = True, special: bool = False) -> list[int]:
        """Token ids of `text`. `special` is accepted for the Backend seam; the tokenizer parses control tokens
        written in the text either way (as it always has here: the bundled model's ids stay the same)."""
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        bos = self.tokenizer.bos_token_id
        return ([bos] if add_bos and bos is not None else []) + list(ids)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


# transformers' cache layer types (cache_utils.get_layer_types_and_kwargs) -> the kind a layer layout names.
# A type not listed keeps its own name: no unknown kind is ever called "full".
_KINDS = {
    "full_attention": "full",  # keys/values of every position
    "sliding_attention": "sliding",  # keys/values of the last window - 1 positions
    "chunked_attention": "chunked",  # the same cache as sliding; the mask restarts every chunk
    "linear_attention": "linear",  # recurrent + convolution state (state-space / linear-attention layers)
    "conv": "conv",  # convolution state only
    "hybrid": "hybrid",  # recurrent state and full-attention keys/values
    "hybrid_sliding": "hybrid-sliding",
    "indexed_attention": "indexed",  # keys/values plus indexer keys
}
# One letter per kind for `layout_string`; "?" for a kind this table does not know.
_LETTERS = {"full": "F", "sliding": "S", "chunked": "C", "linear": "L", "conv": "V", "hybrid": "H",
            "hybrid-sliding": "H", "indexed": "I", "shared": "X", "none": "N", "latent": "A"}
WINDOWED = ("sliding", "chunked", "hybrid-sliding")  # kinds whose layers keep only the last window - 1 positions
# How an artifact records a layer kind it can hold (FORMAT.md sections 6 V4 and 9): a chunked layer's cache is a
# sliding-window cache (transformers builds both as DynamicSlidingWindowLayer; only the attention mask differs),
# so its bytes are those of a sliding layer and the artifact says "sliding".
_STORED = {"full": "full", "sliding": "sliding", "chunked": "sliding"}


def stored_layout(layout: list[dict]) -> list[dict]:
    """The layer layout as an artifact records it ({"kind": "full"|"sliding", "window"}); None for a layout
    with a kind no artifact can hold."""
    if any(x["kind"] not in _STORED for x in layout):
        return None
    return [{"kind": _STORED[x["kind"]], "window": x["window"]} for x in layout]


def layer_layout(config) -> list[dict]:
    """Per layer: {"kind": ..., "window": int|None} from a (text) config.

    Kinds: "full", "sliding" and "chunked" (with their window; kvgraft can capture these), "linear", "conv",
    "hybrid", "hybrid-sliding", "indexed", "shared" (a layer that reads another layer's keys/values), "none"
    (a layer without attention, e.g. MoE/MLP-only), "latent" (full attention caching a compressed latent, MLA:
    the config has `kv_lora_rank`), or transformers' own layer-type name for anything else.

    The same rule as transformers' DynamicCache (cache_utils.get_layer_types_and_kwargs): `layer_types` when
    the config has them, otherwise every layer is sliding when `sliding_window` is set (Mistral-style configs)
    and full otherwise; KV-sharing consumers and attention-free layers become its "dummy" type.
    """
    from transformers.cache_utils import get_layer_types_and_kwargs

    cfg = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    types, kwargs = get_layer_types_and_kwargs(cfg)
    if isinstance(kwargs, dict):  # transformers < 5.20 (the GPU machine's 5.17): one kwargs dict for every layer
        kwargs = [kwargs] * len(types)
    sharing = getattr(cfg, "kv_sharing_modes", None) or [None] * len(types)
    latent = bool(getattr(cfg, "kv_lora_rank", None))
    out = []
    for t, kw, mode in zip(types[: cfg.num_hidden_layers], kwargs, sharing):
        if t == "dummy":
            kind = "shared" if mode == "reuse" else "none"
        else:
            kind = _KINDS.get(t, str(t))
        if kind == "full" and latent:
            kind = "latent"
        window = kw.get("sliding_window") if kind in WINDOWED else None
        out.append({"kind": kind, "window": int(window) if window else None})
    return out


@functools.cache
def _cache_keyword(model_class: type) -> str:
    import inspect

    params = inspect.signature(model_class.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def cache_kwargs(model: torch.nn.Module, cache: object) -> dict[str, object]:
    """The keyword that hands `cache` to `model.forward`: `cache` in transformers >= 5.20 (where `past_key_values`
    is a deprecated alias), `past_key_values` before (the GPU machine's transformers 5.17 ignores `cache=`)."""
    return {_cache_keyword(type(model)): cache}


def smallest_window(layout: list[dict]) -> int | None:
    """The smallest window of a layer layout's sliding/chunked layers (None when there are none)."""
    windows = [x["window"] for x in layout if x["kind"] in WINDOWED and x["window"]]
    return min(windows) if windows else None


def layout_string(layout: list[dict]) -> str:
    """A layer layout in one word, a letter per layer: F full, S sliding, C chunked, L linear (recurrent),
    V conv, H hybrid, I indexed, X shared, N none, A latent, ? any other kind (e.g. "SSFSSF")."""
    return "".join(_LETTERS.get(x["kind"], "?") for x in layout)


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
    """The compute environment exactness depends on, as the stable dict recorded in artifacts and manifests
    (kvstore.environment.ComputeEnvironment: device, CPU, kernel paths in force, versions, threads)."""
    return current_environment(device).to_dict()


def load_frozen_model(
    source: str = BUNDLED,
    determinism: Determinism | None = None,
    device: str = "cpu",
    seed: int = 0,
) -> FrozenModel:
    """Load a model frozen (eval, no grad) with the pinned settings applied, and fingerprint it.

    seed: the weights of the tiny models (ignored for checkpoints).
    """
    det = determinism or Determinism()
    det.apply()
    pinned = None  # the checkpoint's weight files as they were before they were read (kvstore/engine/weights.py)
    try:
        if source in known_names():  # the bundled model, or a packaged one (make setup-models)
            folder = converted_checkpoint(det, source)
            pinned = PinnedWeights.of(weight_files(folder))
            model, tok = _load_checkpoint(folder, det)
        elif source in TINY:
            model, tok = build_tiny(source, det, seed)
        elif is_gguf_file(source):  # a GGUF by path: dequantized once and cached like the packaged models
            folder = converted_gguf(det, source)
            pinned = PinnedWeights.of(weight_files(folder))
            model, tok = _load_checkpoint(folder, det)
        else:
            pinned = PinnedWeights.of(weight_files(source))
            model, tok = _load_hf(source, det)
    except KVStoreError:
        raise
    except ValueError as e:  # transformers refuses an attention implementation or a model class with ValueError
        text = str(e)
        if "Unrecognized configuration class" in text:
            raise UnsupportedModelError(
                f"model {source!r} is a {_model_type(source)} model, not a causal LM: kvgraft supports causal LMs "
                "(decoder-only, attention KV caches; AutoModelForCausalLM), not encoder-decoder or encoder-only "
                "models"
            ) from e
        if "attention implementation" not in text:
            raise ModelLoadError(f"model source {source!r} could not be loaded: {_first_line(text)}") from e
        others = [a for a in ATTN_IMPLEMENTATIONS if a != det.attn_implementation]
        raise SettingsError(
            f"model {source!r} does not support determinism.attn_implementation={det.attn_implementation!r}; "
            f"set determinism.attn_implementation={others[0]} (kvstore deposit / scripts/verify_graft.py: "
            f"--attn-implementation {others[0]}; transformers: {text.split('. ')[0]})"
        ) from e
    except (OSError, RuntimeError, KeyError, TypeError, AttributeError, ImportError, SafetensorError) as e:
        where = f" ({', '.join(str(f.path) for f in pinned.files)})" if pinned is not None and pinned.files else ""
        fix = (f"; the converted copy is damaged: remove {Path(pinned.files[0].path).parent} and it is converted again"
               if (source in known_names() or is_gguf_file(source)) and where else
               "; give a complete, unmodified checkpoint" if where else "")
        raise ModelLoadError(f"model source {source!r}{where} could not be loaded: {type(e).__name__}: "
                             f"{_first_line(str(e))}{fix}") from None
    if pinned is not None and pinned.files and device == "cpu":
        _own_memory(model)
    model = model.to(device).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    if det.batch_invariant:  # every forward batch-invariant (kvstore/backends/transformers/invariant.py)
        check_invariant_device(source, device)
        install_invariant(model)
    else:
        block_lm_head(model)  # same bits, faster batched decode on CPU (kvstore/backends/transformers/lm_head.py)
    fm = FrozenModel(name=source, model=model, tokenizer=tok, determinism=det)
    fm.fingerprint = model_fingerprint(model)
    fm.tokenizer_fingerprint = tokenizer_fingerprint(tok)
    fm.layer_layout = layer_layout(model.config)
    if pinned is not None and pinned.files:
        pinned.check("while it was loaded and fingerprinted")
        fm.weights = pinned
    return fm


def _own_memory(model: torch.nn.Module) -> None:
    """Give every parameter and buffer memory of this process: a checkpoint's tensors are mapped from its safetensors
    file, so a file rewritten under the running model would change its weights, and one cut short would kill it with
    SIGBUS (kvstore/engine/weights.py). Tied tensors stay tied (one copy per storage); the bits are the same."""
    copies: dict[int, torch.Tensor] = {}
    with torch.no_grad():
        for module in model.modules():
            for group in (module._parameters, module._buffers):
                for t in group.values():
                    if t is None or t.device.type != "cpu":
                        continue
                    key = t.data_ptr()
                    if key not in copies:
                        copies[key] = t.data.clone()
                    t.data = copies[key]


def _first_line(text: str, limit: int = 300) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _model_type(source: str) -> str:
    """The checkpoint's `model_type` and architectures as one phrase (for a refusal), or "non-causal"."""
    try:
        cfg = json.loads((Path(source) / "config.json").read_text(encoding="utf-8"))
        arch = ", ".join(cfg.get("architectures") or [])
        return f"{cfg.get('model_type', '?')}" + (f" ({arch})" if arch else "")
    except (OSError, ValueError, AttributeError):
        return "non-causal"


def _load_hf(source: str, det: Determinism):
    path = Path(source)
    if not path.exists() and ("/" not in source or source.startswith((".", "/"))):
        raise ModelLoadError(
            f"model source {source!r}: no such folder, and it is not a known name ({BUNDLED}, {', '.join(TINY)}) "
            "or a hub id (owner/name). Give a local checkpoint folder or a hub id already in the HF cache."
        )
    try:
        return _load_checkpoint(source, det)
    except OSError as e:
        raise ModelLoadError(
            f"model source {source!r} could not be loaded: {e}. Offline runs need the checkpoint in the local "
            "HF cache (download it once with `hf download`) or a local folder."
        ) from e


def _load_checkpoint(source: str | Path, det: Determinism):
    """(model, tokenizer) from a checkpoint folder or cached hub id, in det's dtype and attention implementation."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(source))
    model = AutoModelForCausalLM.from_pretrained(
        str(source), dtype=det.torch_dtype, attn_implementation=det.attn_implementation
    )
    return model, tok
