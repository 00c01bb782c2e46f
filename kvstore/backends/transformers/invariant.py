"""The batch-invariant mode (determinism.batch_invariant=true): every forward gives each row the same bits whatever
else shares its call, so a one-pass prefill, a chunked one, a token-by-token decode and n rows decoded together all
agree bit for bit (float32 on CPU), by construction rather than by a property of the vendor BLAS.

  - matrix products: every product the mode runs (the linear layers, the LM head, the attention's scores and its
    weighted values) is kvgraft's own fixed-order kernel (fixed.py, `KERNEL`): an output is the same sequence of
    roundings whatever the row count, the row's place in the call, the thread count, MKL's switches or the CPU's
    instruction set (AVX-512, AVX2 or the scalar reference). No product goes through MKL, oneDNN or ATen's matmul.
    (Before, the mode padded rows to whole 4-row tiles of MKL's sgemm, which kept a row's bits on AMD EPYC but not on
    Intel's MKL: issue 58.)
  - attention: `invariant_attention` walks the keys in blocks of `KEY_BLOCK` aligned to absolute positions from 0;
    each score is its own dot product (fixed.dot16); each block takes its own softmax statistics and its weighted
    values and sum of weights as one fma chain over the block's keys in position order (fixed.chain_blocks); the
    blocks are combined in position order (online softmax). A block that a row cannot see adds exactly nothing to it
    (its weight is exp(-inf) = 0, a skipped term), so a row's bits depend only on its own position and keys. The
    visibility mask is transformers' own (causal, sliding windows and chunks by absolute position).
  - RMSNorm, RoPE, activations, exp, tanh, embeddings and residual additions are torch's, per element or per row
    (the property tests cover them end to end: tests/kvstore/test_invariant.py).

`install(model)` switches a loaded model to the mode, after `check_kernel` measured the compiled kernel against its
scalar reference at the model's own shapes: every `torch.nn.Linear` (the LM head included) computes through
`fixed_linear` and the model's attention is `ATTENTION` (registered through transformers' AttentionInterface, with
a boolean mask function). The weights, the config's recorded fields and so the model fingerprint do not change; the
mode is recorded in the artifact's determinism (`batch_invariant: true`) and its numerics fingerprint names
`KERNEL`, so admission never mixes it with the default or with another kernel version.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F

from kvstore.backends.transformers import fixed

KERNEL = "fixed-dot16/1"  # the mode's kernel version (fixed.py): a change that moves a bit is a new version
KEY_BLOCK = 64  # keys per attention block, aligned to absolute positions 0, 64, 128, ...
QUERY_CHUNK = 64  # queries attended together (a chunk skips the key blocks none of its queries sees)
ATTENTION = "kvgraft_batch_invariant"  # the attention implementation's registered name
CHECK_ROWS = (1, 4, 64, 256, 1024, 4096)  # row counts `check_kernel` and the battery measure


def unavailable() -> str | None:
    """Why the mode cannot run on this machine, in one line (no C compiler, a build error, the compiled kernel
    differing from its scalar reference); None when it can. Measured once per process."""
    from kvstore.errors import KVStoreError

    try:
        check_kernel_core()
    except KVStoreError as exc:
        return str(exc)
    return None


def fixed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` computed by the fixed-order kernel (fixed.dot16): each row's bits depend on the
    row and the weight only."""
    return fixed.dot16(x, weight, bias)


def _fixed_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return fixed.dot16(x, self.weight, self.bias)


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

def _attend(qg: torch.Tensor, vis: torch.Tensor, key: torch.Tensor, value: torch.Tensor, lead: int, scaling: float,
            softcap: float | None) -> torch.Tensor:
    """Rows `qg` (B, KVH, rows, D) against the keys `key` (B, KVH, kv, D) and values `value` (B, KVH, kv, Dv), key 0
    at padded position `lead` of the block-aligned layout; `vis` (B, KVH, rows, total) says which padded position
    each row sees. The scores are dot products of a row and a key (fixed.dot16, the keys read in place); each block's
    weighted values and sum of weights one fma chain over its keys (fixed.chain_blocks, the values read in place).
    Blocks no row here sees are skipped (they add exactly nothing), so a row's bits do not depend on the others."""
    b, kvh, rows, d = qg.shape
    kv, dv = key.shape[2], value.shape[-1]
    blocks = vis.shape[-1] // KEY_BLOCK
    seen = vis.any(dim=2).reshape(-1, blocks, KEY_BLOCK).any(dim=-1).any(dim=0).tolist()
    b0 = seen.index(True) if True in seen else 0
    b1 = blocks - seen[::-1].index(True) if True in seen else 1
    nb = b1 - b0
    t0 = b0 * KEY_BLOCK - lead  # the key index of block b0's first position
    k0, k1 = max(t0, 0), min(b1 * KEY_BLOCK - lead, kv)  # the keys blocks b0..b1 hold
    bk = b * kvh
    s = fixed.dot16(qg.reshape(bk, rows, d), key[:, :, k0:k1].reshape(bk, k1 - k0, d))  # (B*KVH, rows, k1 - k0)
    s = F.pad(s, (k0 - t0, nb * KEY_BLOCK - (k1 - t0)))  # positions without a key: masked below
    s = s.mul_(scaling)
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    mb = vis[..., b0 * KEY_BLOCK : b1 * KEY_BLOCK].reshape(bk, rows, nb * KEY_BLOCK)
    s = s.masked_fill_(~mb, float("-inf")).view(bk, rows, nb, KEY_BLOCK)
    m = s.amax(dim=-1, keepdim=True)  # (B*KVH, rows, nb, 1)
    m_safe = m.nan_to_num(nan=float("nan"), posinf=0.0, neginf=0.0)  # an infinite maximum as 0, the rest as it is
    p = torch.exp_(s.sub_(m_safe)).view(bk, rows, nb * KEY_BLOCK)
    o = fixed.chain_blocks(p, value.reshape(bk, kv, dv), KEY_BLOCK, t0)  # (B*KVH, rows, nb, Dv + 1)

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
    return (acc[..., :dv] / acc[..., dv:]).view(b, kvh, rows, dv)


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
    """Switch `model` to the batch-invariant mode: every linear layer (LM head included) through the fixed-order
    kernel and `ATTENTION`, after `check_kernel` measured the compiled kernel against its reference here."""
    refuse_unsupported(model)
    register()
    check_kernel(model)
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            module.forward = types.MethodType(_fixed_forward, module)
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(ATTENTION)
    else:  # pragma: no cover - transformers without set_attn_implementation
        model.config._attn_implementation = ATTENTION
    _confirm_every_forward(model)  # confirmed at run time, every forward, not assumed (issue 51, item 6)


def _refuse(what: str) -> None:
    from kvstore.errors import SettingsError

    raise SettingsError(f"determinism.batch_invariant=true: on this machine {what}, so the mode's fixed-order kernel "
                        f"({KERNEL}, kvstore/backends/transformers/fixed.py) would not give a row its bits; report it, "
                        "or leave determinism.batch_invariant off here")


def _equal_to_reference(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, got: torch.Tensor,
                        rows: list[int], cols: torch.Tensor | None) -> bool:
    """`got` (the compiled kernel's x @ w^T (+ bias)) equals the scalar reference at `rows` and `cols` (all if None):
    the reference computes one output at a time, so only a sample of a large product is recomputed."""
    wc = w if cols is None else w.index_select(0, cols)
    bc = bias if bias is None or cols is None else bias.index_select(0, cols)
    ref = fixed.dot16(x[rows], wc, bc, isa_name="scalar", threads=1)
    have = got[rows] if cols is None else got[rows][:, cols]
    return torch.equal(ref, have)


def _sample(n: int, threads: int) -> torch.Tensor | None:
    """Columns of an n-wide product to recompute: all up to 512; else 64 on each side of both ends and of every
    thread's share boundary (the kernel's tile edges and thread splits), and every 97th (column blocks)."""
    if n <= 512:
        return None
    cuts = [0, n] + [n * t // threads for t in range(1, threads)]
    cols = sorted({c for cut in cuts for c in range(max(cut - 64, 0), min(cut + 64, n))} | set(range(0, n, 97)))
    return torch.tensor(cols, dtype=torch.long)


def _check_product(name: str, w: torch.Tensor, bias: torch.Tensor | None, head: bool, gen: torch.Generator) -> None:
    """The compiled kernel on `w` (and `bias`) against the scalar reference (`_equal_to_reference`: first, middle and
    last rows; every column, or a sample of a wide product's) and on 1 thread against the process's threads. At the
    full width: 1, 4, 64 and 256 rows (the LM head: 1 and 4, the rows it is called with; 1 thread at 1 row). At 1,024
    and 4,096 rows on the weight's first 96 rows: the row count reaches an output only through the row tile that
    computes it (4 rows, or the last 1 to 3), which the narrow product has at every row count, while the column
    blocks and thread shares are the full-width products' (measured cost at load, 270M: see docs/performance.md)."""
    threads = torch.get_num_threads()
    k = w.shape[1]
    x = torch.randn(CHECK_ROWS[-1], k, generator=gen, dtype=torch.float32)
    narrow_w, narrow_b = w[:96], None if bias is None else bias[:96]
    plan = [(m, w, bias, _sample(w.shape[0], max(threads, 2)), m == 1 or not head)
            for m in (CHECK_ROWS[:2] if head else CHECK_ROWS[:4])]
    if not head:
        plan += [(m, narrow_w, narrow_b, None, True) for m in CHECK_ROWS[4:]]
    for m, wm, bm, cols, one_thread in plan:
        got = fixed.dot16(x[:m], wm, bm)
        rows = sorted({0, m // 2, max(m - 3, 0), m - 1})
        if not _equal_to_reference(x[:m], wm, bm, got, rows, cols):
            _refuse(f"the {w.shape[0]} x {k} product ({name}) at {m} rows differs from the kernel's scalar "
                    "reference")
        if one_thread and threads > 1 and not torch.equal(fixed.dot16(x[:m], wm, bm, threads=1), got):
            _refuse(f"the {w.shape[0]} x {k} product ({name}) at {m} rows differs between 1 and {threads} threads")


_CORE: dict[int, str | None] = {}


def check_kernel_core() -> None:
    """The kernel built and loaded, and equal to its scalar reference on a fixed battery (`kernel_digest`'s inputs at
    every path's instruction set); measured once per process."""
    from kvstore.errors import KVStoreError

    if 0 not in _CORE:
        try:
            want = kernel_digest(isa_name="scalar", threads=1)
            if kernel_digest() != want:
                _refuse("the compiled kernel's golden battery differs from its scalar reference")
            _CORE[0] = None
        except KVStoreError as exc:
            _CORE[0] = str(exc)
    if _CORE[0] is not None:
        from kvstore.errors import SettingsError

        raise SettingsError(_CORE[0])


def check_kernel(model: torch.nn.Module) -> None:
    """What the mode computes, measured at load on this machine (issue 58): the compiled kernel equals its scalar
    reference bit for bit (`check_kernel_core`), and on every linear layer's own weight and bias (the LM head's full
    width included) at `CHECK_ROWS` rows up to the longest the model is called with here, on one thread and the
    process's; the attention gives a query alone its bits among 12. A SettingsError in one line where one differs."""
    check_kernel_core()
    gen = torch.Generator().manual_seed(20261204)
    seen: set[tuple] = set()
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    with torch.inference_mode():
        for name, module in model.named_modules():
            if not isinstance(module, torch.nn.Linear) or module.weight.device.type != "cpu":
                continue
            w, bias = module.weight, module.bias
            key = (tuple(w.shape), bias is not None)
            if key in seen:
                continue
            seen.add(key)
            _check_product(name, w, bias, module is head, gen)
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
            _refuse(f"the block attention ({heads} heads of {hd}) gives a query alone other bits than among 12")


def _exact_inputs(*shape: int, salt: int = 0) -> torch.Tensor:
    """Fixed float32 values from integer arithmetic only (no generator whose bits could move between versions):
    24-bit integers scaled by 2^-23, so products and sums round."""
    n = 1
    for s in shape:
        n *= s
    i = torch.arange(n, dtype=torch.int64) + salt * 7919
    v = (i * 2654435761 + 12345) % 16777213 - 8388606
    return (v.to(torch.float32) * 2.0**-23).view(*shape)


def kernel_digest(isa_name: str | None = None, threads: int | None = None) -> str:
    """SHA-256 of the kernel's outputs on fixed inputs (`_exact_inputs`): products of 1, 5 and 67 rows (K 653, not a
    multiple of 16, with and without bias, 45 columns) and the blocks' weighted values (2 blocks of 64, key 0 at
    position 3, some weights zero). Pinned per `KERNEL` (tests/kvstore/test_fixed.py)."""
    import hashlib

    h = hashlib.sha256(KERNEL.encode())
    x, w, bias = _exact_inputs(67, 653), _exact_inputs(45, 653, salt=1), _exact_inputs(45, salt=2)
    for m in (1, 5, 67):
        for b in (None, bias):
            h.update(fixed.dot16(x[:m], w, b, isa_name=isa_name, threads=threads).numpy().tobytes())
    p = _exact_inputs(1, 9, 128, salt=3).abs()
    p[p < 0.2] = 0
    v = _exact_inputs(1, 120, 37, salt=4)
    h.update(fixed.chain_blocks(p, v, KEY_BLOCK, -3, isa_name=isa_name, threads=threads).numpy().tobytes())
    return h.hexdigest()


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
            "is built and measured for the CPU (its own fixed-order kernel, kvstore/backends/transformers/fixed.py); "
            "use device=cpu or leave determinism.batch_invariant off")

NUMERICS_FORMAT = "kvgraft-numerics-invariant/3"  # the mode's battery below; a change to it is a new format
#: Earlier formats of the battery still measured so that a record made under one is recognised: none. /1 and /2
#: measured the MKL sgemm tiles the mode ran before `KERNEL` (issue 58); the mode no longer runs those kernels, so a
#: record of them says nothing of what this code computes, and an artifact or registration recorded under them is
#: refused (its fingerprint is neither this machine's /3 nor a former one): deposit or register it again.
FORMER_NUMERICS_FORMATS: tuple[str, ...] = ()


def numerics_fingerprint(dims: dict[str, int], fmt: str = NUMERICS_FORMAT) -> str:
    """The mode's numerics fingerprint: SHA-256 of `KERNEL`'s name and a fixed battery of the kernels the mode runs,
    in this process's settings, on fixed pseudo-random inputs (the default mode's is
    kvstore.environment.numerics_fingerprint, on the default kernels, and stays as it was). Its products at the
    model's shapes (`fixed_linear`: 1, 4 and 64 rows; one shape at every row count of `CHECK_ROWS`, up to 4,096; a
    biased product), its LM head at the full vocabulary width (1 and 4 rows), its block attention
    (`invariant_attention`: a one-query decode step past two key blocks, a causal prefill of 70 queries, and a
    soft-capped one), an RMS norm, the MLP activations transformers' decoders use (tanh GELU, SiLU) and rotary
    cos/sin. Only kernels the mode runs: two machines whose bits agree here computed the mode's layers alike
    (`make replay` checks the whole model)."""
    import hashlib
    import json

    if fmt != NUMERICS_FORMAT:
        raise ValueError(f"numerics battery format {fmt!r} is not one of {(NUMERICS_FORMAT, *FORMER_NUMERICS_FORMATS)}")
    gen = torch.Generator(device="cpu").manual_seed(20261203)
    h = hashlib.sha256(fmt.encode() + KERNEL.encode() + json.dumps(dims, sort_keys=True).encode())

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float32) * 0.05

    def eat(t: torch.Tensor) -> None:
        h.update(t.detach().contiguous().view(torch.uint8).numpy().tobytes())

    hid, inter, hd = dims["hidden"], dims["intermediate"], dims["head_dim"]
    heads, kv = dims["heads"], dims["kv_heads"]
    weights = [rand(heads * hd, hid), rand(kv * hd, hid), rand(hid, heads * hd), rand(inter, hid), rand(hid, inter)]
    bias = rand(heads * hd)
    vocab = dims["vocab"]
    block = rand(min(vocab, 4096), hid)  # the head at its full width: a block of rows repeated (column j's bits
    head = block.repeat(-(-vocab // block.shape[0]), 1)[:vocab]  # depend on its own operands wherever it sits)
    with torch.inference_mode():
        for rows in (1, 4, 64):
            x = rand(rows, hid)
            eat(fixed_linear(x, weights[0]))
            eat(fixed_linear(x, weights[0], bias))
            eat(fixed_linear(x, weights[1]))
            eat(fixed_linear(rand(rows, heads * hd), weights[2]))
            up = fixed_linear(x, weights[3])
            eat(up)
            eat(fixed_linear(up, weights[4]))
            if rows < 64:
                eat(fixed_linear(x, head))
            var = x.pow(2).mean(-1, keepdim=True)
            eat(x * torch.rsqrt(var + 1e-6))  # RMS norm
            eat(F.gelu(up * 40.0, approximate="tanh"))
            eat(F.silu(up * 40.0))
        for rows in CHECK_ROWS:
            eat(fixed_linear(rand(rows, hid), weights[0]))
        # rotary: positions x inverse frequencies, then cos and sin (far positions included)
        inv_freq = 1.0 / (10000.0 ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        freqs = torch.arange(0, 40000, 97, dtype=torch.float32)[:, None] * inv_freq[None]
        eat(freqs.cos())
        eat(freqs.sin())
        for q, keys, softcap in ((1, 2 * KEY_BLOCK + 3, None), (70, 70, None), (70, 70, 50.0)):
            query, key, value = rand(1, heads, q, hd), rand(1, kv, keys, hd), rand(1, kv, keys, hd)
            pos = torch.arange(keys - q, keys).unsqueeze(0)
            eat(invariant_attention(torch.nn.Module(), query, key, value, None, scaling=hd ** -0.5, softcap=softcap,
                                    position_ids=pos)[0])
    return h.hexdigest()


def former_numerics_fingerprints(dims: dict[str, int]) -> tuple[str, ...]:
    """This process's fingerprints under the battery's earlier formats (FORMER_NUMERICS_FORMATS): none since issue
    58 (their kernels are no longer the mode's; see FORMER_NUMERICS_FORMATS)."""
    return tuple(numerics_fingerprint(dims, fmt) for fmt in FORMER_NUMERICS_FORMATS)

