"""llama.cpp's per-sequence state (llama_state_seq_get_data) <-> the format's layers (kvstore/FORMAT.md
section 10). Pure functions on bytes and tensors: no llama.cpp calls, no I/O.

    caches = parse_state(blob, t, hint)                      # refused unless cells are positions in order
    layers = state_layers(caches, t, n_swa, kv_heads, dtype)  # (1, kv_heads, cells, head_dim) per layer
    serialize_state(layers, t, dtype, v_trans) == blob        # the capture's byte round trip
    serialize_state(layers, t, dtype, v_trans, restore=True)  # what a graft hands llama.cpp (below)

The state as llama.cpp 0.3.36 writes it (llama-kv-cache.cpp state_write): magic, seq id, then per cache
(full attention, then the sliding window) 1 stream, the cell count, per cell (pos, n_seq, seq ids), v_trans,
the layer count, per layer K type + row size + K rows of the cells, then per layer V (type + row size + rows,
or with v_trans type + element size + n_embd_v + n_embd_v rows of the cells' elements). A sliding-window
cache writes only its unmasked cells: the last n_swa positions.

The restore layout (`restore=True`): a fresh prefill leaves position p in cell p of every cache (with
swa_full the sliding cache keeps its masked cells), and llama.cpp's attention runs over cells [0, n_kv) in
cell order, so the same unmasked cells at other cell indices sum in another order (measured: a 674-token
prefix's logits off by up to 0.5). The graft therefore writes every cache as t cells, positions 0..t-1:
the positions the artifact does not hold (masked by the window: never attended again) are placeholder cells
with zero K and V. llama.cpp's state_read_meta places a sequence's cells with find_slot from cell 0 of a
cleared cache, so cell p gets position p, the layout of the fresh prefill.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass

import numpy as np
import torch

from kvstore.errors import IncompatibleError
from kvstore.format.artifact import LayerKV

SEQ_MAGIC = 0xAF143CD8  # llama-context.cpp io_magic: the first 4 bytes of a sequence state
GGML_TYPES = {0: "float32", 1: "float16", 30: "bfloat16"}  # ggml_type -> the format's dtype (others refused)
GGML_TYPE_OF = {v: k for k, v in GGML_TYPES.items()}
TORCH = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_INT = {2: (np.int16, torch.int16), 4: (np.int32, torch.int32)}  # same-size integer views (numpy has no bf16)
_CELL = np.dtype([("pos", "<i4"), ("n_seq", "<u4"), ("seq", "<i4")])  # one cell of one sequence


@dataclass
class CacheState:
    """One llama_kv_cache's part of a sequence state (the full-attention or the sliding-window cache)."""

    cells: int
    v_trans: bool
    k_type: int
    v_type: int
    row_bytes: int  # bytes of one cell's K (and V) row: n_embd_gqa * element size
    k_rows: list[np.ndarray]  # per layer, cells * row_bytes (uint8, a view of the state)
    v_rows: list[np.ndarray]  # per layer, the same bytes of V (v_trans: n_embd_v rows of `cells` elements)


class _Reader:
    def __init__(self, blob: bytes) -> None:
        self.blob, self.off = blob, 0

    def take(self, fmt: str):
        vals = struct.unpack_from("<" + fmt, self.blob, self.off)
        self.off += struct.calcsize("<" + fmt)
        return vals if len(vals) > 1 else vals[0]

    def raw(self, n: int) -> np.ndarray:
        if self.off + n > len(self.blob):
            raise IncompatibleError(f"llamacpp: sequence state ends at byte {len(self.blob)}, {self.off + n} "
                                    "needed; the state is truncated or of another layout")
        out = np.frombuffer(self.blob, np.uint8, n, self.off)
        self.off += n
        return out


def parse_state(blob: bytes, t: int, hint: str = "") -> list[CacheState]:
    """The caches of a sequence-0 state of `t` tokens; refused unless every cache holds positions
    t - cells .. t - 1 of sequence 0 in cell order. `hint` ends the refusal (the setting that helps)."""
    r = _Reader(blob)
    magic, seq = r.take("Ii")
    if magic != SEQ_MAGIC or seq != 0:
        raise IncompatibleError(f"llamacpp: sequence state magic {magic:#x} / seq {seq}: not a state of seq 0")
    caches = []
    while r.off < len(blob):
        n_stream = r.take("I")
        if n_stream != 1:
            raise IncompatibleError(f"llamacpp: a cache with {n_stream} streams; use one sequence per context")
        cells = r.take("I")
        if cells == 0:
            raise IncompatibleError("llamacpp: an empty cache in the sequence state (nothing to graft)")
        meta = np.frombuffer(r.raw(cells * _CELL.itemsize), _CELL)
        want = np.arange(t - cells, t, dtype=np.int32)
        bad = np.flatnonzero((meta["pos"] != want) | (meta["n_seq"] != 1) | (meta["seq"] != 0))
        if bad.size:
            j = int(bad[0])
            raise IncompatibleError(f"llamacpp: cache cell {j} holds position {int(meta['pos'][j])} of "
                                    f"{int(meta['n_seq'][j])} sequence(s) (first id {int(meta['seq'][j])}); a "
                                    f"deposit holds positions {t - cells}..{t - 1} of sequence 0 in order{hint}")
        v_trans, n_layer = r.take("II")
        k_rows, k_type, row = [], None, None
        for _ in range(n_layer):
            kt, k_row = r.take("iQ")
            k_type, row = (kt, k_row) if k_type is None else (k_type, row)
            if kt != k_type or k_row != row:
                raise IncompatibleError("llamacpp: layers of one cache with different K types or row sizes")
            k_rows.append(r.raw(cells * k_row))
        v_rows, v_type = [], None
        for _ in range(n_layer):
            if v_trans:
                vt, el, n_embd = r.take("iII")
                v_bytes = el * n_embd
            else:
                vt, v_bytes = r.take("iQ")
            v_type = vt if v_type is None else v_type
            if vt != v_type or v_bytes != row:
                raise IncompatibleError("llamacpp: V rows differ in type or size from the K rows of a layer")
            v_rows.append(r.raw(cells * v_bytes))
        caches.append(CacheState(cells, bool(v_trans), k_type, v_type, row, k_rows, v_rows))
    return caches


_BLOCK = 256  # cells per copy: a transposing copy in cache-sized blocks (measured 4.7x faster at 8,192 cells)


def _copy_cells(dst: np.ndarray, src: np.ndarray, axis: int) -> None:
    """dst[...] = src (same shape, strided views), _BLOCK cells of `axis` at a time."""
    for a in range(0, src.shape[axis], _BLOCK):
        part = (slice(None),) * axis + (slice(a, a + _BLOCK),)
        dst[part] = src[part]


def _to_torch(src: np.ndarray, dtype: str) -> torch.Tensor:
    """(kv_heads, cells, head_dim) integer view (strided) -> a tensor of `dtype` that owns its bytes."""
    out = np.empty(src.shape, src.dtype)
    _copy_cells(out, src, 1)
    return torch.from_numpy(out).view(TORCH[dtype])


def _to_numpy(x: torch.Tensor) -> np.ndarray:
    return x.view(_INT[x.element_size()][1]).numpy()


def state_layers(caches: list[CacheState], t: int, n_swa: int, kv_heads: int, dtype: str, type_v: str,
                 hint: str = "") -> list[LayerKV]:
    """The format's layers of parsed caches: one (full) or two (full + sliding window) caches of `dtype`."""
    if len(caches) not in (1, 2):
        raise IncompatibleError(f"llamacpp: a sequence state of {len(caches)} caches; one (full attention) or "
                                "two (full + sliding window) are supported")
    if type_v != dtype:
        raise IncompatibleError("llamacpp: type_k and type_v must be the same to store an artifact")
    el = TORCH[dtype].itemsize
    layers = []
    for ci, c in enumerate(caches):
        sliding = len(caches) == 2 and ci == 1
        if GGML_TYPES.get(c.k_type) != dtype or GGML_TYPES.get(c.v_type) != type_v:
            raise IncompatibleError(f"llamacpp: cache types K {c.k_type} / V {c.v_type} are not the configured "
                                    f"{dtype} / {type_v}")
        want = min(t, n_swa) if sliding else t
        if c.cells != want:
            raise IncompatibleError(f"llamacpp: the {'sliding-window' if sliding else 'full-attention'} cache "
                                    f"holds {c.cells} positions of {t}, a graft needs {want}{hint}")
        head_dim, ints = c.row_bytes // el // kv_heads, _INT[el][0]
        for k, v in zip(c.k_rows, c.v_rows):
            kt = k.view(ints).reshape(c.cells, kv_heads, head_dim).transpose(1, 0, 2)
            if c.v_trans:  # (n_embd_v, cells) -> (kv_heads, cells, head_dim)
                vt = v.view(ints).reshape(kv_heads, head_dim, c.cells).transpose(0, 2, 1)
            else:
                vt = v.view(ints).reshape(c.cells, kv_heads, head_dim).transpose(1, 0, 2)
            layers.append(LayerKV("sliding" if sliding else "full", n_swa + 1 if sliding else None, t,
                                  _to_torch(kt, dtype)[None], _to_torch(vt, dtype)[None]))
    return layers


def serialize_state(layers: list[LayerKV], t: int, dtype: str, v_trans: bool, restore: bool = False) -> np.ndarray:
    """The sequence state of `layers` (t tokens from position 0): llama.cpp's own bytes, or with `restore`
    the restore layout (every cache t cells at positions 0..t-1, zero placeholders where the artifact holds
    no position; see the module docstring). One uint8 buffer, written in place, on an anonymous mmap: its
    pages are zero without a memset (bytearray(n) spent ~0.5 s on 151 MB on the loaded machine) and get no
    huge-page advice (numpy's np.zeros madvises huge pages, and their faults cost up to 1.4 s of kernel time
    in compaction here)."""
    groups = [g for g in ([lyr for lyr in layers if lyr.kind == kind] for kind in ("full", "sliding")) if g]
    gtype = GGML_TYPE_OF[dtype]
    plan = []  # (layers, cells held, cells written, row bytes)
    size = 8
    for group in groups:
        held = group[0].keys.shape[2]
        row = group[0].keys.shape[1] * group[0].keys.shape[3] * group[0].keys.element_size()
        cells = t if restore else held
        plan.append((group, held, cells, row))
        size += 8 + cells * _CELL.itemsize + 8 + len(group) * 2 * (12 + cells * row)
    buf = out = np.frombuffer(mmap.mmap(-1, max(size, 1)), np.uint8, size)  # zero pages: placeholders' K, V
    off = 8
    struct.pack_into("<Ii", buf, 0, SEQ_MAGIC, 0)
    for group, held, cells, row in plan:
        struct.pack_into("<II", buf, off, 1, cells)
        meta = out[off + 8 : off + 8 + cells * _CELL.itemsize].view(_CELL)
        meta["pos"], meta["n_seq"], meta["seq"] = np.arange(t - cells, t, dtype=np.int32), 1, 0
        off += 8 + cells * _CELL.itemsize
        struct.pack_into("<II", buf, off, int(v_trans), len(group))
        off += 8
        for lyr in group:  # K: one row per cell; the held cells are the last ones
            struct.pack_into("<iQ", buf, off, gtype, row)
            off += 12
            k = _to_numpy(lyr.keys[0])  # (kv_heads, held, head_dim)
            dst = out[off : off + cells * row].view(k.dtype).reshape(cells, k.shape[0], k.shape[2])[cells - held :]
            _copy_cells(dst, k.transpose(1, 0, 2), 0)
            off += cells * row
        for lyr in group:
            v = _to_numpy(lyr.values[0])  # (kv_heads, held, head_dim)
            heads, head_dim, el = v.shape[0], v.shape[2], v.itemsize
            if v_trans:  # n_embd_v rows of `cells` elements
                struct.pack_into("<iII", buf, off, gtype, el, heads * head_dim)
                off += 12
                dst = out[off : off + cells * row].view(v.dtype).reshape(heads, head_dim, cells)[:, :, cells - held :]
                _copy_cells(dst, v.transpose(0, 2, 1), 2)
            else:
                struct.pack_into("<iQ", buf, off, gtype, row)
                off += 12
                dst = out[off : off + cells * row].view(v.dtype).reshape(cells, heads, head_dim)[cells - held :]
                _copy_cells(dst, v.transpose(1, 0, 2), 0)
            off += cells * row
    if off != size:
        raise IncompatibleError(f"llamacpp: serialized {off} of {size} planned state bytes (a layer of another "
                                "shape in the artifact); the artifact does not match its own layout")
    return buf
