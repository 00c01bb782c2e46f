"""vLLM's paged KV cache <-> the artifact's per-layer keys and values, through a layout LEARNED from the engine's own
cache writer. Pure torch: no vLLM import, no I/O; any device.

    layout = self_test(writer, layer_cache, block_size, isa="amx")   # at engine start, once per layer shape
    k, v = layout.read(cache, block_ids, start, end)                  # (1, kv_heads, end - start, head_dim) each
    layout.write(cache, block_ids, start, k, v)                       # the same bytes back, permuted

Every vLLM attention backend gives a layer one tensor of logical shape `(num_blocks, kv_heads, block_size,
2 * head_dim)`. Where each (token, head, dim, key/value) element of a block lives inside it is the kernel's choice:
vLLM's CPU attention lays a block out per ISA (`_get_attn_isa`: "vec"/"vec16" keys transposed, "amx" keys in
16-token groups of dim pairs and values in 16-dim groups of token pairs, "neon" with BF16 in BFMMLA tiles; docs/vllm.md
has the table, read from csrc/cpu/), and a GPU backend stores NHD or HND. `get_kv_cache_layout()` does not say which.

So the connector does not match a list: `self_test` lets the writer store keys and values in which every element is
distinguishable (a mixed-radix code of its (key/value, token, head, dim), one digit per round, each digit a bit pattern
the cache dtype holds exactly: +-[1, 2) with the digit in the mantissa and the sign), decodes from what it wrote the
offset of every element within a block (an index map, `LearnedLayout.index`), and checks a last round of random bit
patterns: read through the map they must be the input's bytes, and written through it they must rebuild the writer's
bytes exactly. Any layout that stores each element once, unchanged, is learned; a writer that drops, duplicates,
moves across blocks or re-encodes an element (a cast, FP8 quantisation, flushed subnormals) is refused in one line
naming the first element it could not place and the ISA. Where the map equals a view (`VIEWS`: vec/vec16's transposed
keys, plain region order, the GPU's interleaved NHD/HND view) reads and writes take that view's slicing, the fast path;
otherwise they gather and scatter through the index. Both are pure permutations: write(read(x)) restores x bit for bit.

An artifact stores keys and values in logical order, `(1, kv_heads, tokens, head_dim)` (kvstore/FORMAT.md section 6):
independent of the block layout. It records the layout it was read from as `determinism.kv_layout`: a view's name
(the names artifacts have recorded since the first deposit, each an exact description of its map given block size
and head_dim) or, for any other map, its human name and `sha256:` of the map (`LearnedLayout.recorded`).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from kvstore.errors import IncompatibleError

Writer = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]
MAP_FORMAT = "kvgraft-paged-map/1"  # what `LearnedLayout.digest` hashes (header JSON + the index as int64 LE)


@dataclass(frozen=True)
class PagedLayout:
    """A view of a block (the fast path): per (block, head) a key region then a value region (CPU_ATTN "vec"/"vec16"
    keys transposed (head_dim, block), or not), or `interleaved`: per (block, head, token) the key's head_dim elements
    then the value's, in the logical view (FlashAttention and Triton on GPU, any stride order)."""

    name: str
    keys_transposed: bool
    interleaved: bool = False

    def fits(self, cache: torch.Tensor) -> bool:
        """A region view reads raw memory: only a contiguous cache; the interleaved view any strides."""
        return self.interleaved or cache.is_contiguous()

    def index_map(self, heads: int, bs: int, d: int) -> torch.Tensor:
        """(2, heads, bs, d) int64: the within-block logical offset this view gives each (key/value, head, token,
        dim), in the logical order of a block (heads, bs, 2 * d): what `self_test` compares a learned map with."""
        h = torch.arange(heads).view(1, heads, 1, 1)
        t = torch.arange(bs).view(1, 1, bs, 1)
        j = torch.arange(d).view(1, 1, 1, d)
        kv = torch.arange(2).view(2, 1, 1, 1)
        if self.interleaved:
            return h * bs * 2 * d + t * 2 * d + kv * d + j
        key = (j * bs + t) if self.keys_transposed else (t * d + j)
        inner = torch.where(kv == 0, key, bs * d + t * d + j)
        return h * 2 * bs * d + inner

    def _regions(self, cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int, int]:
        nb, heads, bs, two_d = cache.shape
        d = two_d // 2
        if self.interleaved:  # the logical view: any stride order
            return cache[..., :d], cache[..., d:], bs, d
        regions = cache.view(nb, heads, 2, bs * d)  # per (block, head): key region, then value region
        keys = regions[:, :, 0].unflatten(-1, (d, bs) if self.keys_transposed else (bs, d))
        values = regions[:, :, 1].unflatten(-1, (bs, d))
        return keys, values, bs, d

    def read(self, cache: torch.Tensor, block_ids: list[int], start: int,
             end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of positions [start, end) of the request whose blocks are `block_ids` (block i holds
        positions i*block_size ...): two new contiguous (1, kv_heads, end - start, head_dim) tensors on the CPU."""
        _check_shape(cache)
        keys, values, bs, _ = self._regions(cache)
        blk, off = _slots(block_ids, start, end, bs, cache.device)
        k = keys[blk, :, :, off] if self.keys_transposed else keys[blk, :, off, :]  # (tokens, heads, head_dim)
        v = values[blk, :, off, :]  # (tokens, heads, head_dim)
        return (k.permute(1, 0, 2).unsqueeze(0).contiguous().cpu(),
                v.permute(1, 0, 2).unsqueeze(0).contiguous().cpu())

    def write(self, cache: torch.Tensor, block_ids: list[int], start: int, keys_in: torch.Tensor,
              values_in: torch.Tensor) -> None:
        """Scatter (1, kv_heads, n, head_dim) keys and values into positions [start, start + n) of the request
        whose blocks are `block_ids`, in place."""
        _check_shape(cache)
        keys, values, bs, _ = self._regions(cache)
        blk, off = _slots(block_ids, start, start + keys_in.shape[2], bs, cache.device)
        k = keys_in[0].permute(1, 0, 2).to(cache.device, cache.dtype)  # (tokens, heads, head_dim)
        v = values_in[0].permute(1, 0, 2).to(cache.device, cache.dtype)
        if self.keys_transposed:
            keys[blk, :, :, off] = k
        else:
            keys[blk, :, off, :] = k
        values[blk, :, off, :] = v

    def zero(self, cache: torch.Tensor, block_ids: list[int], start: int, end: int) -> None:
        """Zero keys and values of positions [start, end): the placeholders a sliding layer holds outside its
        window (FORMAT.md section 10: derived, never stored)."""
        if end <= start:
            return
        _check_shape(cache)
        keys, values, bs, _ = self._regions(cache)
        blk, off = _slots(block_ids, start, end, bs, cache.device)
        if self.keys_transposed:
            keys[blk, :, :, off] = 0
        else:
            keys[blk, :, off, :] = 0
        values[blk, :, off, :] = 0


#: The views a learned map is compared with for the fast path (never to decide what is learned). Their names are what
#: artifacts have recorded as `kv_layout` since the first deposit: keep them byte for byte.
VIEWS = (
    PagedLayout("cpu_attn/blocks,heads[keys(head_dim,block);values(block,head_dim)]", keys_transposed=True),
    PagedLayout("cpu_attn/blocks,heads[keys(block,head_dim);values(block,head_dim)]", keys_transposed=False),
    PagedLayout("interleaved/blocks,heads,block[key(head_dim)|value(head_dim)]", keys_transposed=False,
                interleaved=True),
)


def _region_map(bs: int, d: int, key: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                value: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Callable[[int], torch.Tensor]:
    """A per-(block, head)-region map (offsets within 2 * bs * d) from formulas of (token t, dim j)."""
    t = torch.arange(bs).view(bs, 1)
    j = torch.arange(d).view(1, d)

    def of(heads: int) -> torch.Tensor:
        inner = torch.stack([key(t, j).expand(bs, d), value(t, j).expand(bs, d)])  # (2, bs, d)
        return inner.unsqueeze(1) + (torch.arange(heads) * 2 * bs * d).view(1, heads, 1, 1)
    return of


def named_maps(bs: int, d: int) -> dict[str, Callable[[int], torch.Tensor]]:
    """Human names for maps that are no view, read from vLLM's csrc/cpu (docs/vllm.md): used to NAME a learned map in
    logs and in `kv_layout`, never to decide whether a writer is learned (every permutation is)."""
    out = {}
    if bs % 16 == 0 and d % 16 == 0:  # cpu_attn_amx.hpp: AMX_TILE_ROW_BYTES 64, bf16
        out["cpu_attn/amx[keys(block/16,head_dim/2,16,2);values(head_dim/16,block/2,16,2)]"] = _region_map(
            bs, d, lambda t, j: (t // 16) * 16 * d + (j // 2) * 32 + (t % 16) * 2 + j % 2,
            lambda t, j: bs * d + (j // 16) * bs * 16 + (t // 2) * 32 + (j % 16) * 2 + t % 2)
    if bs % 8 == 0 and d % 4 == 0:  # cpu_attn_neon_bfmmla.hpp (NEON with BF16): K 8-token groups, V token quads
        out["cpu_attn/neon-bfmmla[keys(block/8,head_dim/4,4,2,4);values(head_dim/2,block/4,2,4)]"] = _region_map(
            bs, d, lambda t, j: (t // 8) * (d // 4) * 32 + (j // 4) * 32 + ((t % 8) // 2) * 8 + (t % 2) * 4 + j % 4,
            lambda t, j: bs * d + (j // 2) * 2 * bs + (t // 4) * 8 + (j % 2) * 4 + t % 4)
    return out


@dataclass(frozen=True, eq=False)
class LearnedLayout:
    """The layout a cache writer was measured to use: `index[kv, h, t, j]` is the within-block logical offset (in the
    block's (kv_heads, block_size, 2 * head_dim) order; for a contiguous cache its memory order) of key (kv 0) or
    value (kv 1) element (head h, token t, dim j). `view` is the fast path where the map equals one."""

    name: str
    index: torch.Tensor  # (2, kv_heads, block_size, head_dim) int64, on the cache's device
    dtype: torch.dtype
    view: PagedLayout | None = None
    digest: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "digest", map_digest(self.index, self.dtype))

    @property
    def shape(self) -> tuple[int, int, int]:
        """(kv_heads, block_size, head_dim) of the blocks this map describes."""
        _, heads, bs, d = self.index.shape
        return int(heads), int(bs), int(d)

    @property
    def recorded(self) -> str:
        """What an artifact records as `determinism.kv_layout`: a view's name (unchanged since the first artifacts),
        else the human name and the map's SHA-256 (`map_digest`), which also covers shape and dtype."""
        return self.view.name if self.view is not None else f"{self.name} sha256:{self.digest}"

    def describe(self) -> dict[str, object]:
        """A stable description for logs and reports."""
        heads, bs, d = self.shape
        return {"name": self.name, "recorded": self.recorded, "sha256": self.digest, "format": MAP_FORMAT,
                "dtype": str(self.dtype).removeprefix("torch."), "kv_heads": heads, "block_size": bs, "head_dim": d,
                "fast_path": self.view is not None}

    def _fits(self, cache: torch.Tensor) -> None:
        _check_shape(cache)
        if tuple(cache.shape[1:]) != (self.shape[0], self.shape[1], 2 * self.shape[2]) or cache.dtype != self.dtype:
            raise IncompatibleError(f"vLLM paged KV tensor {tuple(cache.shape)} {cache.dtype}: the layout was learned "
                                    f"for (blocks, {self.shape[0]}, {self.shape[1]}, {2 * self.shape[2]}) "
                                    f"{self.dtype}; learn it for this layer (paged.self_test)")

    def _gather_index(self, cache: torch.Tensor, blk: torch.Tensor, off: torch.Tensor):  # noqa: ANN202
        """Where every (kv, head, token, dim) of positions (blk, off) lives: for a contiguous cache one flat index
        into cache.view(-1) (a 1-D gather, the fast one), else 4-D coordinates; each (2, heads, n, d)."""
        idx = self.index.to(cache.device)[:, :, off, :]  # (2, heads, n, d) within-block offsets
        b = blk.view(1, 1, -1, 1)
        if cache.is_contiguous():
            return (b * cache[0].numel() + idx,)
        _, bs, two_d = cache.shape[1:]
        return (b, idx // (bs * two_d), (idx // two_d) % bs, idx % two_d)

    def read(self, cache: torch.Tensor, block_ids: list[int], start: int,
             end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of positions [start, end): (1, kv_heads, end - start, head_dim) each, new, on the CPU."""
        self._fits(cache)
        if self.view is not None and self.view.fits(cache):
            return self.view.read(cache, block_ids, start, end)
        blk, off = _slots(block_ids, start, end, self.shape[1], cache.device)
        coords = self._gather_index(cache, blk, off)
        both = (cache.view(-1).index_select(0, coords[0].flatten()).view(coords[0].shape) if len(coords) == 1
                else cache[coords])  # (2, heads, n, d)
        return both[0].unsqueeze(0).contiguous().cpu(), both[1].unsqueeze(0).contiguous().cpu()

    def write(self, cache: torch.Tensor, block_ids: list[int], start: int, keys_in: torch.Tensor,
              values_in: torch.Tensor) -> None:
        """Scatter (1, kv_heads, n, head_dim) keys and values into positions [start, start + n), in place: the
        bytes given, never converted (a dtype other than the cache's is refused)."""
        self._fits(cache)
        if keys_in.dtype != cache.dtype or values_in.dtype != cache.dtype:
            raise IncompatibleError(f"keys {keys_in.dtype} / values {values_in.dtype} into a {cache.dtype} paged "
                                    "cache: a graft writes the artifact's bytes, never re-encoded; deposit it again "
                                    "in this dtype")
        if self.view is not None and self.view.fits(cache):
            self.view.write(cache, block_ids, start, keys_in, values_in)
            return
        blk, off = _slots(block_ids, start, start + keys_in.shape[2], self.shape[1], cache.device)
        coords = self._gather_index(cache, blk, off)
        both = torch.stack([keys_in[0], values_in[0]]).to(cache.device)  # (2, heads, n, d)
        if len(coords) == 1:
            cache.view(-1).index_copy_(0, coords[0].flatten(), both.flatten())
        else:
            cache[coords] = both

    def zero(self, cache: torch.Tensor, block_ids: list[int], start: int, end: int) -> None:
        """Zero keys and values of positions [start, end) (a sliding layer's positions outside its window)."""
        if end <= start:
            return
        self._fits(cache)
        if self.view is not None and self.view.fits(cache):
            self.view.zero(cache, block_ids, start, end)
            return
        blk, off = _slots(block_ids, start, end, self.shape[1], cache.device)
        coords = self._gather_index(cache, blk, off)
        if len(coords) == 1:
            cache.view(-1)[coords[0]] = 0
        else:
            cache[coords] = 0


def map_digest(index: torch.Tensor, dtype: torch.dtype) -> str:
    """SHA-256 of a map: a canonical JSON header (format, dtype, kv_heads, block_size, head_dim), a newline, then
    the (2, kv_heads, block_size, head_dim) offsets as little-endian int64."""
    _, heads, bs, d = index.shape
    head = json.dumps({"format": MAP_FORMAT, "dtype": str(dtype).removeprefix("torch."), "kv_heads": int(heads),
                       "block_size": int(bs), "head_dim": int(d)}, sort_keys=True, separators=(",", ":"))
    body = index.detach().to("cpu", torch.int64).contiguous().numpy().astype("<i8").tobytes()
    return hashlib.sha256(head.encode() + b"\n" + body).hexdigest()


def _check_shape(cache: torch.Tensor) -> None:
    if cache.dim() != 4 or cache.shape[-1] % 2:
        raise IncompatibleError(f"vLLM paged KV tensor of shape {tuple(cache.shape)}: expected (num_blocks, "
                                "kv_heads, block_size, 2 * head_dim); this vLLM build lays the cache out "
                                "otherwise, so the connector cannot read it")


def _slots(block_ids: list[int], start: int, end: int, bs: int,
           device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Block index and offset of every position in [start, end), on `device` (the cache's)."""
    if not 0 <= start <= end or end > len(block_ids) * bs:
        raise IncompatibleError(f"positions [{start}, {end}) do not fit the request's {len(block_ids)} blocks of "
                                f"{bs} tokens")
    pos = torch.arange(start, end)
    table = torch.tensor(block_ids, dtype=torch.int64)
    return (table[pos // bs]).to(device), (pos % bs).to(device)


def scratch_like(cache: torch.Tensor, blocks: int) -> torch.Tensor:
    """A zeroed cache of `blocks` blocks with `cache`'s dtype, device and stride order (NHD, HND, ...)."""
    shape = (blocks, *cache.shape[1:])
    order = sorted(range(cache.dim()), key=lambda i: cache.stride(i), reverse=True)  # outermost first
    base = torch.zeros([shape[i] for i in order], dtype=cache.dtype, device=cache.device)
    return base.permute([order.index(i) for i in range(cache.dim())])


# ------------------------------------------------------------------ the probe
_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclass(frozen=True)
class _Code:
    """Digits as bit patterns a floating dtype holds exactly: +-(1 + digit / 2**nmant), never 0 (a scratch cache's
    untouched bytes) and never NaN or infinite. radix = 2 ** (nmant + 1)."""

    dtype: torch.dtype
    one: int  # the bit pattern of 1.0
    nmant: int
    sign: int  # the sign bit
    mask: int  # all bits of one element

    @classmethod
    def of(cls, dtype: torch.dtype) -> _Code:
        if not dtype.is_floating_point or dtype.itemsize not in (1, 2, 4):
            raise IncompatibleError(f"vLLM paged KV cache of dtype {dtype}: the connector probes floating-point "
                                    "caches only (kv_cache_dtype='auto' stores the model's dtype)")
        nmant = round(-math.log2(torch.finfo(dtype).eps))
        bits = dtype.itemsize * 8
        one = int(_bits(torch.ones(1, dtype=dtype))[0])
        return cls(dtype, one, nmant, 1 << (bits - 1), (1 << bits) - 1)

    @property
    def radix(self) -> int:
        return 1 << (self.nmant + 1)

    def encode(self, digits: torch.Tensor) -> torch.Tensor:
        low = digits & ((1 << self.nmant) - 1)
        signed = torch.where(digits >> self.nmant > 0, self.sign, 0)
        return _from_bits(self.one | low | signed, self.dtype)

    def decode(self, bits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(digit, valid) per element; valid where the bits are one of the codes."""
        low = bits & ((1 << self.nmant) - 1)
        neg = (bits & self.sign) != 0
        valid = (bits & ~(self.sign | ((1 << self.nmant) - 1)) & self.mask) == self.one
        return low + neg.to(torch.int64) * (1 << self.nmant), valid


def _bits(x: torch.Tensor) -> torch.Tensor:
    """Each element's bit pattern as a non-negative int64 (CPU)."""
    size = x.dtype.itemsize
    raw = x.detach().contiguous().view(_INT_OF_SIZE[size]).to("cpu", torch.int64)
    return raw & ((1 << (8 * size)) - 1) if size < 8 else raw


def _from_bits(bits: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    size = dtype.itemsize
    if size in (2, 4):  # two's complement of the unsigned pattern for the signed int view
        bits = torch.where(bits >= 1 << (8 * size - 1), bits - (1 << (8 * size)), bits)
    return bits.to(_INT_OF_SIZE[size]).view(dtype)


def _random_elements(shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """Random bit patterns over every exponent (subnormals and -0.0 included, NaN and infinities replaced by 1.0): a
    writer that casts, rounds, quantises or flushes subnormals changes some of them."""
    bits = torch.randint(0, 1 << (8 * dtype.itemsize), shape, generator=gen, dtype=torch.int64)
    finite = _from_bits(bits, dtype).float().isfinite()
    return _from_bits(torch.where(finite, bits, int(_bits(torch.ones(1, dtype=dtype))[0])), dtype)


def _element(i: int, ntok: int, heads: int, d: int) -> str:
    kv, rest = divmod(i, ntok * heads * d)
    tok, rest = divmod(rest, heads * d)
    h, j = divmod(rest, d)
    return f"{'value' if kv else 'key'} element (token {tok}, head {h}, dim {j})"


def self_test(writer: Writer, like: torch.Tensor, block_size: int, isa: str = "unknown") -> LearnedLayout:
    """Learn the layout the engine's own cache writer uses for layer caches like `like` (num_blocks, kv_heads,
    block_size, 2 * head_dim; its dtype, device and stride order): `writer(key, value, cache, slot_mapping)` with
    key/value (tokens, heads, head_dim) in the cache's dtype, as the attention backend's `do_kv_cache_update` takes
    them, is called on scratch caches of 3 blocks (2 written whole, out of order, 1 left alone) once per digit round
    and once with random bytes. IncompatibleError, one line naming the first element it could not place and `isa`,
    when the writer does not store every element once, in its own block, with its bytes unchanged."""
    _check_shape(like)
    dtype, heads, bs, d = like.dtype, int(like.shape[1]), int(like.shape[2]), int(like.shape[3]) // 2
    where = (f"vLLM's cache writer (attention ISA {isa}; {str(dtype).removeprefix('torch.')} blocks of {bs} tokens, "
             f"{heads} KV heads, head_dim {d}, strides {tuple(like.stride())}, {like.device})")
    fix = ("the connector cannot read this kernel's blocks, so nothing would be deposited or grafted; run vLLM on an "
           "attention path that stores KV elements unchanged (kv_cache_dtype='auto'; for AMX, --dtype float32 takes "
           "the 'vec' path) or the transformers backend")
    if bs != block_size:
        raise IncompatibleError(f"{where}: the layer cache holds {bs}-token blocks, the engine's block size is "
                                f"{block_size}; {fix}")
    code = _Code.of(dtype)
    nb, ntok, block_ids = 3, 2 * bs, [2, 0]  # block 1 is never written: a write into it is a misplaced element
    slots = torch.tensor([block_ids[p // bs] * bs + p % bs for p in range(ntok)], dtype=torch.int64)
    per_block = heads * bs * 2 * d
    n_ids = 2 * ntok * heads * d  # element id: ((kv * ntok + token) * heads + head) * d + dim
    ids = torch.arange(n_ids, dtype=torch.int64)
    rounds = max(1, math.ceil(math.log(n_ids) / math.log(code.radix)))

    def run(kv: torch.Tensor) -> torch.Tensor:  # kv: (2, ntok, heads, d) in the cache dtype -> the scratch it wrote
        scratch = scratch_like(like, nb)
        writer(kv[0].to(like.device), kv[1].to(like.device), scratch, slots.to(like.device))
        return scratch

    decoded = torch.zeros(nb * per_block, dtype=torch.int64)
    valid = torch.ones(nb * per_block, dtype=torch.bool)
    written = torch.zeros(nb * per_block, dtype=torch.bool)
    for r in range(rounds):
        digits = (ids // code.radix ** r) % code.radix
        bits = _bits(run(code.encode(digits).view(2, ntok, heads, d)).reshape(-1))  # logical order
        digit, ok = code.decode(bits)
        decoded += digit * code.radix ** r
        valid &= ok
        written |= bits != 0
    pos = valid.nonzero().flatten()
    found = decoded[pos]
    pos, found = pos[found < n_ids], found[found < n_ids]
    counts = torch.bincount(found, minlength=n_ids)
    missing, dup = counts == 0, counts > 1
    if missing.any():
        i = int(missing.nonzero()[0])
        stray = int((written & ~valid).sum())
        why = (f"re-encodes it ({stray} positions hold bytes that are no input element's)" if stray else
               f"re-encodes it ({int(dup.sum())} elements are stored as bytes equal to another's)" if dup.any() else
               "drops it (its bytes are stored nowhere)")
        raise IncompatibleError(f"{where} could not be learned: {_element(i, ntok, heads, d)} is not stored "
                                f"unchanged: the writer {why}; {fix}")
    if dup.any():
        i = int(dup.nonzero()[0])
        raise IncompatibleError(f"{where} duplicates {_element(i, ntok, heads, d)}: it is stored at {int(counts[i])} "
                                f"places; {fix}")
    at = torch.empty(n_ids, dtype=torch.int64)
    at[found] = pos
    at = at.view(2, ntok, heads, d)
    want_block = torch.tensor(block_ids).repeat_interleave(bs).view(1, ntok, 1, 1)
    off = at - want_block * per_block
    bad = (off < 0) | (off >= per_block)
    if bad.any():
        i = int(bad.flatten().nonzero()[0])
        own = block_ids[(i // (heads * d)) % ntok // bs]
        raise IncompatibleError(f"{where} stores {_element(i, ntok, heads, d)} outside its own block (in block "
                                f"{int(at.flatten()[i]) // per_block}, its slot's block is {own}); {fix}")
    first, second = off[:, :bs], off[:, bs:]  # (2, bs, heads, d) each: the same map in both blocks?
    if not torch.equal(first, second):
        i = int((first != second).flatten().nonzero()[0])
        kv, rest = divmod(i, bs * heads * d)
        raise IncompatibleError(f"{where} lays block {block_ids[1]} out otherwise than block {block_ids[0]} (first at "
                                f"{_element(kv * ntok * heads * d + bs * heads * d + rest, ntok, heads, d)}): no "
                                f"per-block layout; {fix}")
    index = first.permute(0, 2, 1, 3).contiguous()  # (2, heads, bs, d)
    view = next((v for v in VIEWS if v.fits(like) and torch.equal(v.index_map(heads, bs, d), index)), None)
    name = view.name if view is not None else next(
        (n for n, m in named_maps(bs, d).items() if torch.equal(m(heads), index)), "learned/permutation")
    layout = LearnedLayout(name, index.to(like.device), dtype, view)
    # the last round: random bytes read back through the map, and written through it, are the writer's exactly
    gen = torch.Generator().manual_seed(0)
    kv = _random_elements((2, ntok, heads, d), dtype, gen)
    wrote = run(kv)
    want = kv.permute(0, 2, 1, 3).unsqueeze(1)  # (2, 1, heads, ntok, d)
    k, v = layout.read(wrote, block_ids, 0, ntok)
    got = torch.stack([k, v])
    if not torch.equal(_bits(got), _bits(want)):
        i = int((_bits(got) != _bits(want)).flatten().nonzero()[0])
        kv_i, rest = divmod(i, heads * ntok * d)
        h, rest = divmod(rest, ntok * d)
        t, j = divmod(rest, d)
        raise IncompatibleError(f"{where} re-encodes {'value' if kv_i else 'key'} element (token {t}, head {h}, dim "
                                f"{j}): input bits {int(_bits(want).flatten()[i]):#x}, stored "
                                f"{int(_bits(got).flatten()[i]):#x}; {fix}")
    again = scratch_like(like, nb)
    layout.write(again, block_ids, 0, k, v)
    if not torch.equal(_bits(again.reshape(-1)), _bits(wrote.reshape(-1))):
        raise IncompatibleError(f"{where} writes bytes beyond its elements (padding or metadata) that the learned "
                                f"map does not rebuild; {fix}")
    return layout
