"""The safetensors framing of an artifact: its header, checked against itself and the file's length, and the
tensors laid over the bytes (no copy). No I/O and no hashing of tensor data happens here.

Every check here is a pure function of the header bytes (the length prefix and the JSON) and of the file's
length: what the metadata says, the canonical header form, that the tensors tile the data buffer exactly
with the dtypes and shapes the metadata records. `read_layout` therefore remembers the outcome for headers it
has already checked, keyed by the exact header bytes and file length (a bounded LRU): a warm read of an
artifact skips ~1 ms of Python validation, and a header differing in any byte, or a file of another length,
is checked from scratch. Tensor bytes are never covered by this memo; they are the store's hash's job
(kvstore/store/local.py) or `from_bytes(verify_tensors=True)`'s.
"""

from __future__ import annotations

import functools
import json
import math
import threading
from collections import OrderedDict
from typing import NamedTuple

import torch
from safetensors.torch import save as st_save

from kvstore.errors import FormatError, ValidationError
from kvstore.format.canonical import canonical_json
from kvstore.format.invariants import DTYPE_TAGS, MAX_HEADER_BYTES, tensor_names
from kvstore.format.invariants import check_meta as _check_meta
from kvstore.format.invariants import is_int as _is_int
from kvstore.format.invariants import loads_strict as _loads

FORMAT_V1 = "kvgraft-kv/1"  # id = SHA-256 of the file; read, no longer written by default
FORMAT_V2 = "kvgraft-kv/2"  # id = BLAKE3-256 of the file
FORMAT = FORMAT_V2  # what to_bytes writes
FORMATS = (FORMAT_V1, FORMAT_V2)  # what from_bytes reads
META_KEY = "kvgraft"

# Every field to_bytes writes; a header declaring FORMAT with a field missing or added is malformed.
FIELDS = frozenset({
    "format", "token_count", "start_position", "tokens_sha256", "model_fingerprint", "tokenizer_fingerprint",
    "model_name", "dtype", "determinism", "environment", "layers", "tensor_sha256", "extra",
})

# safetensors dtype tags -> torch dtypes (those a KV artifact can hold).
ST_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}

MEMO_BYTES = 16 << 20  # header bytes the layout memo keeps in all (a 10 kB header: ~1,600 artifacts)
MEMO_MAX_HEADER = 256 << 10  # a larger header is checked on every read, never remembered


class Entry(NamedTuple):
    """One tensor of the data buffer: [begin, end) relative to the buffer, its name, dtype and shape."""

    begin: int
    end: int
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    numel: int


class Layout(NamedTuple):
    meta: dict  # the kvgraft metadata, a fresh dict on every call (the caller may keep or change it)
    start: int  # offset of the data buffer in the file
    entries: tuple[Entry, ...]  # in buffer order


def parse_header(data: bytes | bytearray | memoryview) -> tuple[dict, dict, int]:
    """(safetensors header, kvgraft metadata, offset of the data buffer); FormatError on anything malformed,
    ValidationError/IntegrityError when the metadata breaks an invariant."""
    n = _header_length(data)
    header = _loads(bytes(data[8 : 8 + n]), "safetensors header", max_string=MAX_HEADER_BYTES)
    md = header.get("__metadata__") if isinstance(header, dict) else None
    if not isinstance(md, dict) or not isinstance(md.get(META_KEY), str):
        raise FormatError(f"not a kvgraft KV artifact: header has no readable '{META_KEY}' metadata")
    meta = _loads(md[META_KEY], f"'{META_KEY}' metadata")
    version = meta.get("format") if isinstance(meta, dict) else None
    if version not in FORMATS:
        raise FormatError(
            f"artifact format {version!r:.80} is not readable by this kvgraft (reads {list(FORMATS)}); "
            "upgrade kvgraft or deposit the artifact again"
        )
    missing, unknown = sorted(FIELDS - meta.keys()), sorted(meta.keys() - FIELDS)
    if missing or unknown:
        raise FormatError(f"artifact metadata lacks the {version} fields {missing} or has unknown fields "
                          f"{unknown[:4]}; deposit the artifact again")
    if set(md) != {META_KEY} or md[META_KEY] != canonical_json(meta, ensure_ascii=True):
        raise FormatError(f"artifact metadata is not in the canonical form kvgraft writes ({version}: one "
                          f"'{META_KEY}' entry of sorted, compact JSON); deposit the artifact again")
    _check_meta(meta)
    return header, meta, 8 + n


def _header_length(data: bytes | bytearray | memoryview) -> int:
    if len(data) < 8:
        raise FormatError(f"artifact is {len(data)} bytes: too short to be a safetensors file (truncated?)")
    n = int.from_bytes(bytes(data[:8]), "little")
    if n < 2 or n > MAX_HEADER_BYTES or 8 + n > len(data):
        raise FormatError(
            f"artifact header length {n} does not fit in {len(data)} bytes or exceeds the {MAX_HEADER_BYTES}-byte "
            "limit (truncated or not an artifact)"
        )
    return n


# ---- the layout, remembered per exact header ----

_memo: OrderedDict[tuple[bytes, int], tuple[str, tuple[Entry, ...]]] = OrderedDict()
_memo_bytes = 0
_memo_lock = threading.Lock()


def read_layout(data: bytes | bytearray | memoryview) -> Layout:
    """The checked layout of an artifact's bytes: every check of FORMAT.md section 6 that concerns the header
    and the file's length (not tensor contents). Raises FormatError, ValidationError or IntegrityError."""
    global _memo_bytes
    n = _header_length(data)
    key = (bytes(data[: 8 + n]), len(data))
    with _memo_lock:
        hit = _memo.get(key)
        if hit is not None:
            _memo.move_to_end(key)
    if hit is not None:
        meta_text, entries = hit
        return Layout(json.loads(meta_text), 8 + n, entries)
    header, meta, start = parse_header(data)
    entries = _entries(header, meta, start, len(data))
    _check_canonical_header(data, header, meta, start)
    if len(key[0]) <= MEMO_MAX_HEADER:
        with _memo_lock:
            if key not in _memo:
                _memo[key] = (header["__metadata__"][META_KEY], entries)
                _memo_bytes += len(key[0])
            while _memo_bytes > MEMO_BYTES:
                old, _ = _memo.popitem(last=False)
                _memo_bytes -= len(old[0])
    return Layout(meta, start, entries)


def forget_layouts() -> None:
    """Empty the layout memo (tests; a long-lived process that wants the memory back)."""
    global _memo_bytes
    with _memo_lock:
        _memo.clear()
        _memo_bytes = 0


def _entries(header: dict, meta: dict, start: int, size: int) -> tuple[Entry, ...]:
    """Check the header describes exactly the tensors the metadata names, with the recorded dtypes and shapes,
    back to back from 0 to the end of the file; their entries in buffer order."""
    names = tensor_names(len(meta["layers"]))
    present = sorted(k for k in header if k != "__metadata__")
    if present != names:
        missing, extra = sorted(set(names) - set(present)), sorted(set(present) - set(names))
        raise FormatError(f"artifact tensors do not match its {len(meta['layers'])} layers (missing {missing[:4]}, "
                          f"unexpected {extra[:4]}); not an artifact kvgraft wrote")
    tag = DTYPE_TAGS[meta["dtype"]]
    entries = []
    for name in names:
        e = header[name]
        if not isinstance(e, dict) or set(e) != {"dtype", "shape", "data_offsets"}:
            raise FormatError(f"artifact tensor {name!r}: header entry {e!r:.80} is not a safetensors tensor entry")
        st_dtype, shape, offsets = e["dtype"], e["shape"], e["data_offsets"]
        if name == "token_ids":
            want_dtype, want_shape = "I64", [meta["token_count"]]
        else:
            i = int(name.split(".")[1])
            want_dtype, want_shape = tag, meta["layers"][i]["shape"]
        if st_dtype != want_dtype:
            raise ValidationError(f"artifact tensor {name!r} is stored as {st_dtype!r}, but the metadata says "
                                  f"{want_dtype} (dtype {meta['dtype']}); its bytes would be read as the wrong "
                                  "type. Deposit the artifact again")
        if shape != want_shape:
            raise ValidationError(f"artifact tensor {name!r} has shape {shape!r:.60}, the metadata says {want_shape} "
                                  "(batch, kv_heads, cached_tokens, head_dim); deposit the artifact again")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_int(x, 0, size) for x in offsets)):
            raise FormatError(f"artifact tensor {name!r}: data_offsets {offsets!r:.60} are not two offsets in the file")
        dtype = ST_DTYPES[st_dtype]
        numel = math.prod(shape)
        b, end = offsets
        if end - b != numel * dtype.itemsize:
            raise FormatError(f"artifact tensor {name!r}: {end - b} bytes for shape {shape} of {st_dtype}")
        entries.append(Entry(b, end, name, dtype, tuple(shape), numel))
    entries.sort()
    pos = 0
    for e in entries:
        if e.begin != pos:
            raise FormatError(f"artifact tensors could not be read: tensor {e.name!r} starts at {e.begin}, "
                              f"expected {pos}")
        pos = e.end
    if start + pos != size:
        raise FormatError(
            f"artifact tensors could not be read: header describes {start + pos} bytes, the artifact has {size} "
            "(truncated or padded)"
        )
    return tuple(entries)


@functools.lru_cache(maxsize=64)
def _canonical_order(n_layers: int, tag: str) -> tuple[str, ...]:
    """Tensor order safetensors writes for an artifact (it sorts by dtype, then name): asked of safetensors
    itself with empty tensors, so it cannot drift from the writer."""
    dtype = ST_DTYPES[tag]
    empty = {name: torch.empty(0, dtype=torch.int64 if name == "token_ids" else dtype)
             for name in tensor_names(n_layers)}
    raw = st_save(empty)
    return tuple(k for k in json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")]) if k != "__metadata__")


def _check_canonical_header(data: bytes | bytearray | memoryview, header: dict, meta: dict, start: int) -> None:
    """The header must be byte for byte what `to_bytes` writes for these tensors and metadata: every snapshot
    then has exactly one byte form and one id (no reordered keys, padding, duplicates or spelling variants)."""
    out: dict[str, object] = {"__metadata__": {META_KEY: header["__metadata__"][META_KEY]}}
    pos = 0
    for name in _canonical_order(len(meta["layers"]), DTYPE_TAGS[meta["dtype"]]):
        e = header[name]
        size = e["data_offsets"][1] - e["data_offsets"][0]
        out[name] = {"dtype": e["dtype"], "shape": e["shape"], "data_offsets": [pos, pos + size]}
        pos += size
    text = json.dumps(out, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)
    if bytes(data[8:start]) != text:
        raise FormatError("artifact header is not byte for byte the one kvgraft writes (reordered tensors, extra "
                          "spaces or keys, or a different spelling); deposit the artifact again")


def tensor_views(buf: memoryview, layout: Layout) -> dict[str, torch.Tensor]:
    """Tensors viewing `buf` (a writable byte view of the whole file) at the layout's offsets, no copy; a
    tensor misaligned for its dtype (not written by to_bytes) is copied out."""
    tensors = {}
    for e in layout.entries:
        at = layout.start + e.begin
        if at % e.dtype.itemsize:
            copy = bytearray(buf[at : layout.start + e.end])
            tensors[e.name] = torch.frombuffer(copy, dtype=e.dtype).reshape(e.shape)
        else:
            tensors[e.name] = torch.frombuffer(buf, dtype=e.dtype, count=e.numel, offset=at).reshape(e.shape)
    return tensors
