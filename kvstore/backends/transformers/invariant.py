"""The batch-invariant mode (determinism.batch_invariant=true): every forward gives each row the same bits whatever
else shares its call, so a one-pass prefill, a chunked one, a token-by-token decode and n rows decoded together all
agree bit for bit (float32 on CPU).

What depends on the call's shape, measured on PyTorch 2.13 CPU (MKL sgemm, AMD EPYC, 2 threads, float32):
  - matrix products: a row of `F.linear` takes another kernel path at 1-3, 5-7, 9-11 rows than at 4, 8 and every
    count from 12 up, where every row's bits are the same (checked to 4,096 rows on the 270M's and the 1.5B's
    shapes, and for batched products of any batch count). So every product here has a row count that is a whole
    number of tiles of `TILE` rows: the rows are padded with zero rows to the next multiple (one GEMM call, no
    per-tile loop: the kernel already computes each tile as it would alone, which the tests check end to end).
  - attention: a fused kernel's reductions over keys depend on how many queries and keys share the call.
    `invariant_attention` walks the keys in blocks of `KEY_BLOCK` aligned to absolute positions from 0 (a block
    missing from a sliding-window cache or past the last key is padded and masked), scores each block with a product
    of a fixed shape, takes each block's own softmax statistics, and combines the blocks in position order (online
    softmax). A block that no query of the call can see is skipped; one that some row cannot see adds exactly
    nothing to that row (its weight is exp(-inf) = 0), so a row's bits depend only on its own position and keys.
    The visibility mask is transformers' own (causal, sliding windows and chunks by absolute position).
  - RMSNorm, RoPE, activations, embeddings and residual additions are per row already (the property tests cover
    them end to end: tests/kvstore/test_invariant.py).

`install(model)` switches a loaded model to the mode: every `torch.nn.Linear` (the LM head included) computes in
row tiles and the model's attention is `ATTENTION` (registered through transformers' AttentionInterface, with a
boolean mask function). The weights, the config's recorded fields and so the model fingerprint do not change; the
mode is recorded in the artifact's determinism (`batch_invariant: true`), so admission never mixes it with the
default.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator

import torch
import torch.nn.functional as F

TILE = 4  # rows per tile: MKL's sgemm gives a row the same bits for every multiple of 4 rows (module doc)
KEY_BLOCK = 64  # keys per attention block, aligned to absolute positions 0, 64, 128, ...
QUERY_CHUNK = 64  # queries attended together (a chunk skips the key blocks none of its queries sees; 64 measured
# faster than 256 and 128 in a one-pass prefill of 512 and 2,048 tokens: less masked work on the diagonal)
IN_PLACE_KEYS = 1024  # from this many keys the whole key blocks are read in place, below it all are copied (`_attend`)
ONE_THREAD_ROWS = 16  # tiled products of at most this many rows run on one thread (`one_thread`)
HEAD_TILE = 4  # the LM head's columns per tile (`tiled_head`)
HEAD_CHUNK = 8  # the LM head's rows per call: 4 and 8 columns share a row's bits, 12 and more do not
ATTENTION = "kvgraft_batch_invariant"  # the attention implementation's registered name


def _pad_rows(x2: torch.Tensor, tile: int = TILE) -> tuple[torch.Tensor, int]:
    rows = x2.shape[0]
    pad = (-rows) % tile if rows else tile
    if pad:
        x2 = torch.cat([x2, x2.new_zeros(pad, x2.shape[1])])
    return x2, rows


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Run the block on one intra-op thread, then restore the count. For the products of a few rows: their bits are
    the same on 1 and 2 threads (MKL splits the output, never the sum; module doc), and a one-row step's 126 small
    GEMMs otherwise wait at an OpenMP barrier each, which a busy machine turns into a scheduler time slice."""
    n = torch.get_num_threads()
    if n == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def tiled_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` with the rows padded to a whole number of `TILE`-row tiles (one GEMM call): each
    row's bits are the same whatever other rows share the call. A call of at most `ONE_THREAD_ROWS` padded rows (a
    decode step) is one product per intra-op thread, each over its own share of the output columns (`split_linear`:
    the same bits, measured per weight shape, `splits`), else one product on one thread (`one_thread`)."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    rows = x2.shape[0]
    pad = (-rows) % TILE if rows else TILE
    if rows + pad <= ONE_THREAD_ROWS and x2.device.type == "cpu":
        xp = F.pad(x2, (0, 0, 0, pad)) if pad else x2  # zero rows: the tile (module doc)
        parts = splits(weight, bias)
        if parts > 1:
            out = split_linear(xp, weight, bias, parts, rows)
        else:
            with one_thread():
                out = F.linear(xp, weight, bias)[:rows]
    else:
        xp = F.pad(x2, (0, 0, 0, pad)) if pad else x2
        out = F.linear(xp, weight, bias)[:rows]
    return out.reshape(*lead, weight.shape[0])


def split_linear(x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, parts: int,
                 rows: int | None = None) -> torch.Tensor:
    """`F.linear(x2, weight, bias)[:rows]` for a few rows as `parts` products over consecutive shares of the output
    columns, batched in one call (torch runs a batch's products on its intra-op threads, one each; MKL does not
    thread a product of 4 rows). Measured on MKL sgemm (AMD EPYC, fp32): a column's bits do not depend on how many
    other columns share the product, for the shapes of the 270M and the 1.5B (2, 4 and 8 shares, 4 to 16 rows, with
    and without bias), so this gives `F.linear`'s bits at about half its time on 2 threads. Not assumed: `splits`
    checks it for each weight shape before it is used."""
    out_features, inp = weight.shape
    share = out_features // parts
    w3 = weight.view(parts, share, inp).transpose(1, 2)
    xe = x2.expand(parts, *x2.shape)
    y = torch.bmm(xe, w3) if bias is None else torch.baddbmm(bias.view(parts, 1, share), xe, w3)
    rows = x2.shape[0] if rows is None else rows
    return y[:, :rows].transpose(0, 1).reshape(rows, out_features)


_SPLITS: dict[tuple[int, int, bool, int], bool] = {}  # (out, in, bias?, parts) -> split_linear gives F.linear's bits


def splits(weight: torch.Tensor, bias: torch.Tensor | None) -> int:
    """How many column shares a small tiled product of `weight` runs in (`split_linear`): one per intra-op thread
    where, for this weight shape and thread count, the split product was measured to give `F.linear`'s bits on every
    row count up to `ONE_THREAD_ROWS` (once per shape, on this weight and fixed pseudo-random rows); 1 otherwise (a
    shape whose share falls to another kernel path, as MKL's for a few columns: seen at 8 columns of a 32 x 64
    weight)."""
    parts = torch.get_num_threads()
    out_features, inp = weight.shape
    if parts < 2 or out_features % parts or weight.device.type != "cpu" or not weight.is_contiguous():
        return 1
    key = (out_features, inp, bias is not None, parts)
    if key not in _SPLITS:
        gen = torch.Generator().manual_seed(20261204)
        x = torch.randn(ONE_THREAD_ROWS, inp, generator=gen, dtype=weight.dtype)
        with torch.inference_mode():
            whole = F.linear(x, weight, bias)
            _SPLITS[key] = all(torch.equal(split_linear(x[:r], weight, bias, parts), whole[:r])
                               for r in range(TILE, ONE_THREAD_ROWS + 1, TILE))
    return parts if _SPLITS[key] else 1


def tiled_head(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The output projection (LM head) in the mode: `weight @ rows^T`, the rows in chunks of `HEAD_CHUNK` each
    padded to a multiple of `HEAD_TILE` columns. In that orientation MKL streams the (vocab, hidden) weight once per
    call at about a matrix-vector product's speed, where `F.linear` on a 4-row tile packs the whole 262,144-word
    weight every call (3x the time); a row's bits are the same at every multiple of 4 columns up to 8 (measured:
    1-3, 5-7, 9-11 columns and 12 and more take other kernel paths, so no call has more than `HEAD_CHUNK` rows).
    Only logits come from here: the keys and values a cache holds are the tiled linears' (`tiled_linear`)."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    parts = []
    for r0 in range(0, max(x2.shape[0], 1), HEAD_CHUNK):
        chunk, rows = _pad_rows(x2[r0 : r0 + HEAD_CHUNK], HEAD_TILE)
        out = torch.mm(weight, chunk.t())[:, :rows].t()
        parts.append(out if bias is None else out + bias)
    out = parts[0] if len(parts) == 1 else torch.cat(parts)
    return out.reshape(*lead, weight.shape[0])


def _tiled_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return tiled_linear(x, self.weight, self.bias)


def _head_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return tiled_head(x, self.weight, self.bias)


def invariant_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                        softcap: float | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """Attention over key blocks aligned to absolute positions (module doc). query (B, H, q, D), key/value
    (B, KVH, kv, D/Dv): the cache's keys, contiguous and ending at the last query's position. Returns
    ((B, q, H, Dv), None) like transformers' sdpa_attention_forward."""
    if dropout:
        raise ValueError("the batch-invariant attention does not do dropout (kvgraft only infers)")
    b, h, q, d = query.shape
    kvh, kv, dv = key.shape[1], key.shape[2], value.shape[-1]
    groups = h // kvh
    scaling = d ** -0.5 if scaling is None else scaling
    lasts = _checked_lasts(module, kwargs.get("position_ids"), attention_mask, b, q, kv)
    _CALLS[0] += 1  # the run-time confirmation (confirm_forward): this call went through the invariant path
    if len(set(lasts)) > 1:  # rows of different contexts, end-aligned (ragged.py): each row's own block alignment
        return _ragged_rows(module, query, key, value, attention_mask, scaling, softcap, lasts, kwargs)
    last = lasts[0]
    first_key = last + 1 - kv  # absolute position of key 0
    lead = first_key % KEY_BLOCK  # missing keys before key 0 inside its block
    blocks = -(-(lead + kv) // KEY_BLOCK)
    total = blocks * KEY_BLOCK

    # visibility (B, KVH, q, groups, kv): transformers' boolean mask when given, else causal by position
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        vis = attention_mask[..., -kv:]
    else:
        qpos = torch.arange(last + 1 - q, last + 1, device=query.device)
        kpos = torch.arange(first_key, last + 1, device=query.device)
        vis = (kpos[None, :] <= qpos[:, None])
        if attention_mask is not None:  # an additive float mask: -inf / dtype min where not visible
            vis = vis & (attention_mask[..., -kv:] > torch.finfo(attention_mask.dtype).min / 2)
    vis = vis.expand(b, h, q, kv).reshape(b, kvh, groups, q, kv).transpose(2, 3)
    # rows in (query, group) order: a chunk of queries is a contiguous run of rows
    qg = query.reshape(b, kvh, groups, q, d).transpose(2, 3)
    pad_back = total - lead - kv
    outs = []
    for q0 in range(0, q, QUERY_CHUNK):
        rows_q = qg[:, :, q0 : q0 + QUERY_CHUNK].reshape(b, kvh, -1, d)
        rows_vis = F.pad(vis[:, :, q0 : q0 + QUERY_CHUNK].reshape(b, kvh, -1, kv), (lead, pad_back), value=False)
        outs.append(_attend(rows_q, rows_vis, key, value, lead, scaling, softcap))
    out = torch.cat(outs, dim=2).reshape(b, kvh, q, groups, dv).transpose(2, 3).reshape(b, h, q, dv)
    return out.transpose(1, 2).contiguous(), None


def _checked_lasts(module: torch.nn.Module, pos, attention_mask: torch.Tensor | None, b: int, q: int,
                   kv: int) -> list[int]:
    """The absolute position of each row's last query, from `position_ids`, refusing (KVStoreError, one line) what
    the block alignment cannot be derived from instead of assuming it (issue 51, item 6): no position_ids (key 0
    is not position 0 once a sliding window dropped keys, or a graft put the cache elsewhere), position_ids of
    another shape than the queries', more keys than positions up to the last query with no mask marking the extra
    keys as padding (rows joined in flight are left-padded, their mask hides the padding), or no mask on a
    sliding-window layer (the window would not be applied)."""
    from kvstore.errors import KVStoreError

    where = f"batch-invariant attention ({type(module).__name__}, layer {getattr(module, 'layer_idx', '?')})"
    if not torch.is_tensor(pos) or pos.dim() != 2 or pos.shape[-1] != q or pos.shape[0] not in (1, b):
        got = "none" if not torch.is_tensor(pos) else f"shape {tuple(pos.shape)}"
        raise KVStoreError(f"{where}: position_ids {got}, for {b} row(s) of {q} queries: the key blocks are aligned "
                           "to absolute positions, which are not assumed; call the model with position_ids "
                           "(kvstore's prefill, decode and graft do)")
    lasts = [int(x) for x in pos[:, -1]] if pos.shape[0] == b else [int(pos[0, -1])] * b
    if min(lasts) + 1 < kv and len(set(lasts)) == 1 and attention_mask is None:  # a mask marks left-padded keys
        raise KVStoreError(f"{where}: {kv} keys but the last query is at position {min(lasts)}: keys before position "
                           "0 do not exist; the cache and position_ids disagree (a graft at the wrong position?)")
    if attention_mask is None and getattr(module, "sliding_window", None):
        raise KVStoreError(f"{where}: no attention mask on a sliding-window layer (window "
                           f"{module.sliding_window}), so the window would not be applied; the mode registers its own "
                           "mask function: load the model with determinism.batch_invariant=true (kvstore installs it)")
    return lasts


def attention_calls() -> int:
    """How many calls went through `invariant_attention` in this process so far (confirm_forward compares it)."""
    return _CALLS[0]


def confirm_forward(model: torch.nn.Module, before: int, what: str = "forward") -> None:
    """KVStoreError unless every attention layer of `model` went through `invariant_attention` since `before`
    (`attention_calls()` taken before the forward): a model whose attention implementation was switched back, or
    that never dispatched to the registered one, is refused at run time instead of trusted (issue 51, item 6)."""
    from kvstore.errors import KVStoreError

    layers = int(getattr(getattr(model, "config", None), "num_hidden_layers", 0) or 0)
    text = getattr(model.config, "get_text_config", None)
    if text is not None:
        layers = int(getattr(text(decoder=True), "num_hidden_layers", layers) or layers)
    done = _CALLS[0] - before
    if done < max(layers, 1):
        raise KVStoreError(f"batch-invariant mode: the {what} ran {done} attention call(s) through the invariant "
                           f"attention where the model has {layers} layers: attention went through another "
                           f"implementation ({getattr(model.config, '_attn_implementation', '?')}), so the rows are "
                           "not batch-invariant; load the model again with determinism.batch_invariant=true")


_CALLS = [0]


def _confirm_every_forward(model: torch.nn.Module) -> None:
    """Wrap `model.forward` so that every call is confirmed (`confirm_forward`) to have gone through the invariant
    attention in every layer; idempotent."""
    inner = model.forward
    if getattr(inner, "_kvgraft_confirmed", False):
        return

    def forward(*args, **kwargs):
        before = _CALLS[0]
        out = inner(*args, **kwargs)
        confirm_forward(model, before)
        return out

    forward._kvgraft_confirmed = True  # type: ignore[attr-defined]
    model.forward = forward


def _ragged_rows(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: torch.Tensor | None, scaling: float, softcap: float | None, lasts: list[int],
                 kwargs: dict) -> tuple[torch.Tensor, None]:
    """Rows whose last queries sit at different absolute positions (contexts of different lengths, end-aligned and
    left-padded: kvstore/backends/transformers/ragged.py): each row attended on its own, with its own block
    alignment, so its bits are those of the row alone (its padded slots are masked: they add exactly nothing)."""
    if attention_mask is None or attention_mask.dtype != torch.bool:
        raise ValueError("the batch-invariant attention needs transformers' boolean mask for rows of different "
                         "lengths (a padding mask)")
    outs = []
    for r, last in enumerate(lasts):
        row_kwargs = {**kwargs, "position_ids": torch.tensor([[last]], dtype=torch.long)}
        mask = attention_mask[r : r + 1] if attention_mask.shape[0] > 1 else attention_mask
        outs.append(invariant_attention(module, query[r : r + 1], key[r : r + 1], value[r : r + 1], mask,
                                        scaling=scaling, softcap=softcap, **row_kwargs)[0])
    return torch.cat(outs), None


def _blocks(t: torch.Tensor, lead: int, i0: int, i1: int, ones: bool = False, copy: bool = False) -> torch.Tensor:
    """Key blocks i0..i1 of `t` (B, KVH, kv, X) as (B, KVH, i1 - i0, KEY_BLOCK, X), block i holding the keys at
    padded positions [i * KEY_BLOCK, (i + 1) * KEY_BLOCK) where key 0 sits at padded position `lead`. Blocks wholly
    inside the keys are a view (no copy); a partial block (the first when lead > 0, the last when the keys end inside
    it) is a zero-padded copy, as is every block with `copy`. `ones`: a ones column appended (zero where padded), the
    block's sum of weights."""
    b, kvh, kv, x = t.shape
    start, end = i0 * KEY_BLOCK - lead, i1 * KEY_BLOCK - lead  # key indices the blocks span
    if start >= 0 and end <= kv and not ones and not copy:
        return t[:, :, start:end].reshape(b, kvh, i1 - i0, KEY_BLOCK, x)
    lo, hi = max(start, 0), min(end, kv)
    out = t.new_empty(b, kvh, end - start, x + ones)  # written once: zeros where padded, the keys, the ones column
    out[:, :, : lo - start] = 0
    out[:, :, hi - start :] = 0
    out[:, :, lo - start : hi - start, :x] = t[:, :, lo:hi]
    if ones:
        out[:, :, lo - start : hi - start, x] = 1
    return out.view(b, kvh, i1 - i0, KEY_BLOCK, x + ones)


def _attend(qg: torch.Tensor, vis: torch.Tensor, key: torch.Tensor, value: torch.Tensor, lead: int, scaling: float,
            softcap: float | None) -> torch.Tensor:
    """Rows `qg` (B, KVH, rows, D) against the keys `key` (B, KVH, kv, D) and values `value` (B, KVH, kv, Dv), key 0
    at padded position `lead` of the block-aligned layout; `vis` (B, KVH, rows, total) says which padded position
    each row sees. Each block's products have one fixed shape, (M, D) x (D, KEY_BLOCK) and (M, KEY_BLOCK) x
    (KEY_BLOCK, Dv) plus the block's sum of weights (a product with ones); the blocks wholly inside the
    keys are read in place (views: no copy of the cache per call), the partial first and last blocks are padded
    copies (`_blocks`). A column's bits do not depend on which other columns or blocks share the product (measured;
    tests/kvstore/test_invariant_attention.py checks these against the padded-copy layout bit for bit)."""
    b, kvh, rows, d = qg.shape
    kv, dv = key.shape[2], value.shape[-1]
    pad = (-rows) % TILE
    if pad:  # whole tiles of rows (module doc); the padded rows see nothing and are dropped
        qg = torch.cat([qg, qg.new_zeros(b, kvh, pad, d)], dim=2)
        vis = torch.cat([vis, vis.new_zeros(b, kvh, pad, vis.shape[-1])], dim=2)
    m_rows = rows + pad
    blocks = vis.shape[-1] // KEY_BLOCK
    # skip the blocks no row here can see (they would add exactly nothing)
    seen = vis.any(dim=2).reshape(-1, blocks, KEY_BLOCK).any(dim=-1).any(dim=0).tolist()
    b0 = seen.index(True) if True in seen else 0
    b1 = blocks - seen[::-1].index(True) if True in seen else 1
    nb = b1 - b0
    mb = vis[..., b0 * KEY_BLOCK : b1 * KEY_BLOCK].reshape(b, kvh, m_rows, nb, KEY_BLOCK).transpose(2, 3)
    # the blocks in up to three runs: a partial first block, the whole blocks (views), a partial last block; below
    # IN_PLACE_KEYS keys, one padded copy of them all (fewer operations where a copy costs less than they do)
    whole0, whole1 = (1 if lead else 0), (lead + kv) // KEY_BLOCK
    if kv < IN_PLACE_KEYS:
        whole0, whole1 = b1, b0  # no run is read in place
        runs = [(b0, b1)]
    else:
        runs = [(b0, min(b1, whole0)), (max(b0, whole0), min(b1, whole1)), (max(b0, whole0, whole1), b1)]
        runs = [(i0, i1) for i0, i1 in runs if i0 < i1]
    qb = qg.unsqueeze(2)

    # per block, products of a fixed shape (scores, then weighted values and the sum of weights)
    s = torch.cat([torch.matmul(qb, _blocks(key, lead, i0, i1, copy=whole1 < whole0).transpose(-1, -2))
                   for i0, i1 in runs], dim=2)
    s = s.mul_(scaling)  # (B, KVH, nb, M, KEY_BLOCK)
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    s = s.masked_fill_(~mb, float("-inf"))
    m = s.amax(dim=-1, keepdim=True)
    m_safe = m.nan_to_num(nan=float("nan"), posinf=0.0, neginf=0.0)  # an infinite maximum as 0, the rest as it is
    p = torch.exp_(s.sub_(m_safe))
    parts, at = [], 0
    for i0, i1 in runs:
        pr = p[:, :, at : at + i1 - i0]
        at += i1 - i0
        whole = whole0 <= i0 and i1 <= whole1
        if whole:  # values in place; the sum of weights as a product of its own, two columns wide: a one-column
            # product of a single block goes to a matrix-vector kernel with other bits (measured), two do not
            ones = p.new_ones(b, kvh, i1 - i0, KEY_BLOCK, 2)
            parts.append(torch.cat([torch.matmul(pr, _blocks(value, lead, i0, i1)), torch.matmul(pr, ones)[..., :1]],
                                   -1))
        else:
            parts.append(torch.matmul(pr, _blocks(value, lead, i0, i1, ones=True)))
    o = parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)  # (B, KVH, nb, M, Dv + 1)

    # combine the blocks in position order (online softmax): acc <- acc * exp(run_m - new) + o_i * exp(m_i - new).
    # The running maxima and every factor are computed for all blocks at once (the same elementwise ops on the same
    # values, so the same bits); only the recurrence itself, two operations a block, stays a loop.
    new = torch.cummax(m, dim=2).values
    run = torch.cat([torch.full_like(m[:, :, :1], float("-inf")), new[:, :, :-1]], dim=2)
    new_safe = new.nan_to_num(nan=float("nan"), posinf=0.0, neginf=0.0)
    keep = torch.exp(run - new_safe)
    add = o * torch.exp(m - new_safe)
    acc = torch.zeros_like(o[:, :, 0])
    for k, a in zip(keep.unbind(2), add.unbind(2), strict=True):  # in place: the same two roundings a block
        acc.mul_(k).add_(a)
    return (acc[..., :dv] / acc[..., dv:])[:, :, :rows]


def _mask(*args, **kwargs):
    """transformers' boolean (sdpa) mask, always materialised: the attention needs every row's visibility."""
    from transformers.masking_utils import sdpa_mask

    kwargs["allow_is_causal_skip"] = False
    return sdpa_mask(*args, **kwargs)


def register() -> None:
    """Register `ATTENTION` and its mask with transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTENTION, invariant_attention)
    AttentionMaskInterface.register(ATTENTION, _mask)


def install(model: torch.nn.Module) -> None:
    """Switch `model` to the batch-invariant mode: tiled linear layers (LM head included) and `ATTENTION`, after
    `check_tiles` measured that this machine's kernels keep a row's bits at the tiles the mode uses."""
    refuse_unsupported(model)
    register()
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    check_tiles(model, head)
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            forward = _head_forward if module is head else _tiled_forward
            module.forward = types.MethodType(forward, module)
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(ATTENTION)
    else:  # pragma: no cover - transformers without set_attn_implementation
        model.config._attn_implementation = ATTENTION
    _confirm_every_forward(model)  # confirmed at run time, every forward, not assumed (issue 51, item 6)


def check_tiles(model: torch.nn.Module, head: torch.nn.Module | None = None) -> None:
    """The mode's premise, measured on this machine at load instead of assumed (issue 52): for every linear layer's
    weight shape, on its own weight and fixed pseudo-random rows, a row's bits are the same at 4, 8 and 12 rows as
    among 64, on one thread as on the process's threads, and in the column-split product where `splits` uses it;
    the LM head's (`tiled_head`) at 1, 4, 5 and 8 rows; the block attention's for a query alone and among 12. A
    SettingsError in one line where one differs (another BLAS, another kernel path): the mode cannot be exact here."""
    from kvstore.errors import SettingsError

    def refuse(what: str) -> None:
        raise SettingsError(f"determinism.batch_invariant=true: on this machine {what}, so the mode's fixed tiles "
                            "would not keep a row's bits (kvstore/backends/transformers/invariant.py); leave "
                            "determinism.batch_invariant off here")

    gen = torch.Generator().manual_seed(20261204)
    seen: set[tuple] = set()
    with torch.inference_mode():
        for name, module in model.named_modules():
            if not isinstance(module, torch.nn.Linear) or module is head or module.weight.device.type != "cpu":
                continue
            w, bias = module.weight, module.bias
            key = (tuple(w.shape), bias is not None, w.dtype)
            if key in seen:
                continue
            seen.add(key)
            x = torch.randn(64, w.shape[1], generator=gen, dtype=w.dtype)
            whole = F.linear(x, w, bias)
            for rows in (TILE, 2 * TILE, 3 * TILE):
                if not torch.equal(F.linear(x[:rows], w, bias), whole[:rows]):
                    refuse(f"a row of the {w.shape[0]} x {w.shape[1]} product ({name}) has other bits at {rows} rows "
                           "than among 64")
            with one_thread():
                if not torch.equal(F.linear(x[:TILE], w, bias), whole[:TILE]):
                    refuse(f"the {w.shape[0]} x {w.shape[1]} product ({name}) gives a row other bits on one thread")
            if not torch.equal(tiled_linear(x[:1], w, bias), whole[:1]):  # the decode path (`splits` measured it)
                refuse(f"the one-row product {w.shape[0]} x {w.shape[1]} ({name}) differs from the row among 64")
        if isinstance(head, torch.nn.Linear) and head.weight.device.type == "cpu":
            w = head.weight
            x = torch.randn(HEAD_CHUNK, w.shape[1], generator=gen, dtype=w.dtype)
            whole = tiled_head(x, w, head.bias)
            for rows in (1, TILE + 1):
                if not torch.equal(tiled_head(x[:rows], w, head.bias), whole[:rows]):
                    refuse(f"the LM head's rows ({w.shape[0]} x {w.shape[1]}) have other bits at {rows} rows than "
                           f"at {HEAD_CHUNK}")
        config = getattr(model, "config", None)
        text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        hd = getattr(text, "head_dim", None) or 64
        heads = getattr(text, "num_attention_heads", 4) or 4
        kvh = getattr(text, "num_key_value_heads", heads) or heads
        q, k, v = (torch.randn(1, n, KEY_BLOCK + 12, hd, generator=gen) for n in (heads, kvh, kvh))
        pos = torch.arange(KEY_BLOCK, KEY_BLOCK + 12).unsqueeze(0)
        many = invariant_attention(torch.nn.Module(), q[:, :, -12:], k, v, None, position_ids=pos)[0]
        one = invariant_attention(torch.nn.Module(), q[:, :, -1:], k, v, None, position_ids=pos[:, -1:])[0]
        if not torch.equal(one[:, 0], many[:, -1]):
            refuse(f"the block attention ({heads} heads of {hd}) gives a query alone other bits than among 12")


def refuse_unsupported(model: torch.nn.Module) -> None:
    """A SettingsError, in one line, for a model the mode cannot make batch-invariant: a module that multiplies by
    weights of its own outside torch.nn.Linear (mixture-of-experts banks, convolutions of state-space layers: their
    products are grouped by the tokens of the call and are not tiled here), or an attention with sink logits."""
    from kvstore.errors import SettingsError

    for name, module in model.named_modules():
        if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
            continue
        own = [(k, p) for k, p in module.named_parameters(recurse=False) if p.dim() >= 2]
        if own or getattr(module, "sinks", None) is not None:
            what = (f"weights {own[0][0]} {tuple(own[0][1].shape)} used outside torch.nn.Linear" if own else
                    "attention sink logits")
            raise SettingsError(
                f"determinism.batch_invariant=true: module {name} ({type(module).__name__}) has {what}, which the "
                "batch-invariant mode does not tile (it covers linear layers, embeddings, norms and attention); "
                "leave determinism.batch_invariant off for this model")


def check_invariant_device(source: str, device: str) -> None:
    """The mode is measured on the CPU only: another device is a SettingsError naming the setting."""
    from kvstore.errors import SettingsError

    if torch.device(device).type != "cpu":
        raise SettingsError(
            f"model {source!r} on device {device!r} with determinism.batch_invariant=true: the batch-invariant mode "
            "is built and measured for the CPU (MKL's row-tile property, kvstore/backends/transformers/invariant.py); "
            "use device=cpu or leave determinism.batch_invariant off")


NUMERICS_FORMAT = "kvgraft-numerics-invariant/2"  # the mode's battery below; a change to it is a new format
#: Earlier formats of the battery, still measured so that a record made under one of them is recognised
#: (`former_numerics_fingerprints`). /1 also hashed torch.softmax, a kernel the mode never runs (its attention
#: combines blocks itself) and whose bits differ between ATen's AVX2 and AVX-512 builds: two CPUs that computed
#: every bit of the mode alike (`make replay` 55/55, AMD Zen 3 AVX2 against Zen 5 AVX-512) got two /1 fingerprints.
FORMER_NUMERICS_FORMATS = ("kvgraft-numerics-invariant/1",)


def numerics_fingerprint(dims: dict[str, int], fmt: str = NUMERICS_FORMAT) -> str:
    """The mode's numerics fingerprint: SHA-256 of a fixed battery of the kernels the mode runs, in this process's
    settings, on fixed pseudo-random inputs (the default mode's is kvstore.environment.numerics_fingerprint, on the
    default kernels, and stays as it was). Its tiled products at the model's shapes (`tiled_linear`: 1 row on one
    thread, 7 and 64 rows on the process's threads), its LM head (`tiled_head`, 1 and 7 rows, a slice of the
    vocabulary), its block attention (`invariant_attention`: a one-query decode step past two key blocks and a
    causal prefill of 70 queries), an RMS norm, the MLP activations transformers' decoders use (tanh GELU, SiLU)
    and rotary cos/sin. Only kernels the mode runs: two machines whose bits agree here computed the mode's layers
    alike (`make replay` checks the whole model). `fmt` an earlier format (FORMER_NUMERICS_FORMATS): that battery,
    byte for byte as it was."""
    import hashlib
    import json

    if fmt != NUMERICS_FORMAT and fmt not in FORMER_NUMERICS_FORMATS:
        raise ValueError(f"numerics battery format {fmt!r} is not one of "
                         f"{(NUMERICS_FORMAT, *FORMER_NUMERICS_FORMATS)}")
    first = fmt == FORMER_NUMERICS_FORMATS[0]  # /1: the softmax, no activations or rotary
    gen = torch.Generator(device="cpu").manual_seed(20261203)
    h = hashlib.sha256(fmt.encode() + json.dumps(dims, sort_keys=True).encode())

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float32) * 0.05

    def eat(t: torch.Tensor) -> None:
        h.update(t.detach().contiguous().view(torch.uint8).numpy().tobytes())

    hid, inter, hd = dims["hidden"], dims["intermediate"], dims["head_dim"]
    heads, kv = dims["heads"], dims["kv_heads"]
    weights = [rand(heads * hd, hid), rand(kv * hd, hid), rand(hid, heads * hd), rand(inter, hid), rand(hid, inter)]
    head = rand(dims["vocab"], hid)
    with torch.inference_mode():
        for rows in (1, 7, 64):
            x = rand(rows, hid)
            eat(tiled_linear(x, weights[0]))
            eat(tiled_linear(x, weights[1]))
            eat(tiled_linear(rand(rows, heads * hd), weights[2]))
            up = tiled_linear(x, weights[3])
            eat(up)
            eat(tiled_linear(up, weights[4]))
            if rows < 64:
                eat(tiled_head(x, head))
            var = x.pow(2).mean(-1, keepdim=True)
            eat(x * torch.rsqrt(var + 1e-6))  # RMS norm
            if first:
                eat(torch.softmax(x * 3.0, dim=-1))
            else:
                eat(F.gelu(up * 40.0, approximate="tanh"))
                eat(F.silu(up * 40.0))
        if not first:  # rotary: positions x inverse frequencies, then cos and sin (far positions included)
            inv_freq = 1.0 / (10000.0 ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
            freqs = torch.arange(0, 40000, 97, dtype=torch.float32)[:, None] * inv_freq[None]
            eat(freqs.cos())
            eat(freqs.sin())
        for q, keys in ((1, 2 * KEY_BLOCK + 3), (70, 70)):
            query, key, value = rand(1, heads, q, hd), rand(1, kv, keys, hd), rand(1, kv, keys, hd)
            pos = torch.arange(keys - q, keys).unsqueeze(0)
            eat(invariant_attention(torch.nn.Module(), query, key, value, None, scaling=hd ** -0.5,
                                    position_ids=pos)[0])
    return h.hexdigest()


def former_numerics_fingerprints(dims: dict[str, int]) -> tuple[str, ...]:
    """This process's fingerprints under the battery's earlier formats (FORMER_NUMERICS_FORMATS): an artifact or a
    registration that recorded one of them was measured alike on this machine, so it is admitted as it was when
    recorded (records and registrations made before a format change keep their standing)."""
    return tuple(numerics_fingerprint(dims, fmt) for fmt in FORMER_NUMERICS_FORMATS)


# --- placeholders (branch r58, issue 58): k58's fixed-order kernel defines KERNEL and unavailable; on merge keep
# k58's and drop this block.
#: The mode's kernel version, recorded with its determinism (kvstore.determinism.KERNEL_RECORD) where it is not
#: UNVERSIONED_KERNEL, the MKL-tile kernel every record of the mode made before versions ran.
KERNEL = "fixed-dot16/1"


def unavailable() -> str | None:
    """Why the mode cannot hold on this machine (one line: no C compiler, the kernel's self-check failed), or None."""
    return None
