"""The KV artifact format, version 1: a safetensors file with one metadata entry. No I/O happens here.

See kvstore/FORMAT.md for the normative description. `to_bytes(snapshot)` and `from_bytes(data)` are
inverse: from_bytes(to_bytes(s)) == s, and to_bytes is a pure function of the snapshot's content, so the
artifact id (SHA-256 of the bytes) is stable.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

import torch
from safetensors.torch import save as st_save

from kvstore.errors import FormatError, IntegrityError

FORMAT = "kvgraft-kv/1"
META_KEY = "kvgraft"


@dataclass
class LayerKV:
    """One layer's cache exactly as transformers held it.

    keys/values: (batch, kv_heads, cached_tokens, head_dim); for a sliding-window layer the last
    min(n, window-1) positions, as `DynamicSlidingWindowLayer` keeps them.
    """

    kind: str  # "full" | "sliding"
    window: int | None
    cumulative_length: int  # tokens the layer has seen (== token_count for a snapshot from position 0)
    keys: torch.Tensor
    values: torch.Tensor


@dataclass
class Snapshot:
    """The KV state of one token sequence, with everything needed to check a graft is legitimate."""

    token_ids: list[int]
    start_position: int
    layers: list[LayerKV]
    model_fingerprint: str
    tokenizer_fingerprint: str
    dtype: str
    determinism: dict
    environment: dict
    model_name: str = ""
    extra: dict = field(default_factory=dict)  # free-form, caller-owned (e.g. {"text_sha256": ...})

    @property
    def token_count(self) -> int:
        return len(self.token_ids)

    @property
    def layout(self) -> list[dict]:
        return [{"kind": lyr.kind, "window": lyr.window} for lyr in self.layers]

    def nbytes(self) -> int:
        return sum(lyr.keys.nbytes + lyr.values.nbytes for lyr in self.layers)


def tokens_sha256(token_ids: list[int]) -> str:
    """SHA-256 of token ids as little-endian int64: the key for token-prefix lookups."""
    return hashlib.sha256(torch.tensor(token_ids, dtype=torch.int64).numpy().astype("<i8").tobytes()).hexdigest()


def _sha(t: torch.Tensor) -> str:
    t = t.contiguous()
    return hashlib.sha256(t.view(torch.uint8).numpy() if t.numel() else b"").hexdigest()


def to_bytes(s: Snapshot) -> bytes:
    """Serialize a snapshot. Tensors are stored in their own dtype and shape, bytes untouched."""
    tensors: dict[str, torch.Tensor] = {"token_ids": torch.tensor(s.token_ids, dtype=torch.int64)}
    layers_meta = []
    for i, lyr in enumerate(s.layers):
        k, v = lyr.keys.detach().contiguous().cpu(), lyr.values.detach().contiguous().cpu()
        tensors[f"layers.{i}.keys"] = k
        tensors[f"layers.{i}.values"] = v
        layers_meta.append({
            "kind": lyr.kind, "window": lyr.window, "cumulative_length": lyr.cumulative_length,
            "shape": list(k.shape), "dtype": str(k.dtype).removeprefix("torch."),
        })
    meta = {
        "format": FORMAT,
        "token_count": s.token_count,
        "start_position": s.start_position,
        "tokens_sha256": tokens_sha256(s.token_ids),
        "model_fingerprint": s.model_fingerprint,
        "tokenizer_fingerprint": s.tokenizer_fingerprint,
        "model_name": s.model_name,
        "dtype": s.dtype,
        "determinism": s.determinism,
        "environment": s.environment,
        "layers": layers_meta,
        "tensor_sha256": {name: _sha(t) for name, t in sorted(tensors.items())},
        "extra": s.extra,
    }
    # One metadata key holding canonical JSON: safetensors' header order is then fully determined.
    return st_save(tensors, metadata={META_KEY: json.dumps(meta, sort_keys=True, separators=(",", ":"))})


# Every field to_bytes writes; a header declaring FORMAT without one of them is malformed.
_FIELDS = frozenset({
    "format", "token_count", "start_position", "tokens_sha256", "model_fingerprint", "tokenizer_fingerprint",
    "model_name", "dtype", "determinism", "environment", "layers", "tensor_sha256", "extra",
})

# safetensors dtype tags -> torch dtypes (those a KV artifact can hold).
_ST_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}


def _header(data: bytes | bytearray | memoryview) -> tuple[dict, dict, int]:
    """(safetensors header, kvgraft metadata, offset of the data buffer); FormatError on anything malformed."""
    if len(data) < 8:
        raise FormatError(f"artifact is {len(data)} bytes: too short to be a safetensors file (truncated?)")
    n = int.from_bytes(bytes(data[:8]), "little")
    if n <= 0 or 8 + n > len(data):
        raise FormatError(
            f"artifact header length {n} does not fit in {len(data)} bytes (truncated or not an artifact)"
        )
    try:
        header = json.loads(bytes(data[8 : 8 + n]))
        meta = json.loads(header["__metadata__"][META_KEY])
    except (ValueError, KeyError, TypeError) as e:
        raise FormatError(f"not a kvgraft KV artifact: header has no readable '{META_KEY}' metadata ({e})") from e
    version = meta.get("format") if isinstance(meta, dict) else None
    if version != FORMAT:
        raise FormatError(
            f"artifact format {version!r} is not readable by this kvgraft (reads {FORMAT!r}); "
            "upgrade kvgraft or deposit the artifact again"
        )
    missing = sorted(_FIELDS - meta.keys())
    if missing:
        raise FormatError(f"artifact metadata lacks the {FORMAT} fields {missing}; deposit the artifact again")
    return header, meta, 8 + n


def read_metadata(data: bytes | bytearray | memoryview) -> dict:
    """Parse only the header's kvgraft metadata (cheap: no tensor is touched)."""
    return _header(data)[1]


def _tensor_views(buf: memoryview, header: dict, start: int) -> dict[str, torch.Tensor]:
    """Tensors viewing `buf` (no copy), after checking the header describes exactly the bytes that follow it:
    known dtypes, sizes that match shapes, entries back to back from 0 to the end of the file."""
    entries = []
    try:
        for name, e in header.items():
            if name == "__metadata__":
                continue
            dtype, shape, (b, end) = _ST_DTYPES[e["dtype"]], [int(d) for d in e["shape"]], e["data_offsets"]
            numel = 1
            for d in shape:
                numel *= d
            if min(shape, default=0) < 0 or end - b != numel * dtype.itemsize:
                raise ValueError(f"tensor {name!r}: {end - b} bytes for shape {shape} of {e['dtype']}")
            entries.append((int(b), int(end), name, dtype, shape, numel))
    except (KeyError, TypeError, ValueError) as e:
        raise FormatError(f"artifact tensors could not be read: malformed safetensors header ({e})") from e
    entries.sort()
    pos = 0
    for b, end, name, *_ in entries:
        if b != pos:
            raise FormatError(f"artifact tensors could not be read: tensor {name!r} starts at {b}, expected {pos}")
        pos = end
    if start + pos != len(buf):
        raise FormatError(
            f"artifact tensors could not be read: header describes {start + pos} bytes, the artifact has {len(buf)} "
            "(truncated or padded)"
        )
    tensors = {}
    for b, _end, name, dtype, shape, numel in entries:
        if numel == 0:
            tensors[name] = torch.empty(shape, dtype=dtype)
        elif (start + b) % dtype.itemsize:  # misaligned for its dtype (not written by to_bytes): copy out
            tensors[name] = torch.frombuffer(bytearray(buf[start + b : start + _end]), dtype=dtype).reshape(shape)
        else:
            tensors[name] = torch.frombuffer(buf, dtype=dtype, count=numel, offset=start + b).reshape(shape)
    return tensors


def from_bytes(data: bytes | bytearray | memoryview, verify_tensors: bool = True) -> Snapshot:
    """Parse an artifact. With verify_tensors, every tensor's SHA-256 is checked before it is returned.

    The snapshot's tensors are views of one writable buffer: `data` itself when it is writable (a bytearray or
    a writable memoryview, which the snapshot then owns), otherwise one copy of it, so that tensors never alias
    immutable bytes the caller (or a store) still holds.
    """
    header, meta, start = _header(data)
    buf = memoryview(data)
    if buf.readonly:
        buf = memoryview(bytearray(buf))
    tensors = _tensor_views(buf.cast("B"), header, start)
    if verify_tensors:
        expected = meta["tensor_sha256"]
        if sorted(expected) != sorted(tensors):
            raise IntegrityError(f"artifact tensors {sorted(tensors)} differ from the recorded {sorted(expected)}")
        for name, t in tensors.items():
            if _sha(t) != expected[name]:
                raise IntegrityError(f"tensor {name!r} does not match its recorded SHA-256 (corrupted artifact)")
    layers = []
    for i, lm in enumerate(meta["layers"]):
        layers.append(LayerKV(lm["kind"], lm["window"], lm["cumulative_length"],
                              tensors[f"layers.{i}.keys"], tensors[f"layers.{i}.values"]))
    return Snapshot(
        token_ids=tensors["token_ids"].tolist(), start_position=meta["start_position"], layers=layers,
        model_fingerprint=meta["model_fingerprint"], tokenizer_fingerprint=meta["tokenizer_fingerprint"],
        dtype=meta["dtype"], determinism=meta["determinism"], environment=meta["environment"],
        model_name=meta.get("model_name", ""), extra=meta.get("extra", {}),
    )
