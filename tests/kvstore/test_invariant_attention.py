"""The batch-invariant attention reads the cache's keys and values in place and skips what no row sees (issue 52,
then issue 58's fixed-order kernel): the scores only for the keys of the blocks some row sees, the values read where
they are, blocks no row of a query chunk sees not computed. These must be the bits of the plain layout: every key
and value padded into whole blocks (zeros where no key is), every block of every row computed, all queries in one
call. That layout is kept here as the reference, through the same kernel (fixed.py), and compared bit for bit over
the shapes that matter (one decode query and prefills of several query chunks; key 0 at every kind of block offset;
sliding-window masks; logit soft-capping; grouped and plain heads; several rows).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kvstore.backends.transformers import fixed
from kvstore.backends.transformers.invariant import KEY_BLOCK, invariant_attention


def _reference(query, key, value, mask, scaling, softcap, last):
    """The padded layout: every key and value in whole blocks, every block, one call for all queries."""
    b, h, q, d = query.shape
    kvh, kv, dv = key.shape[1], key.shape[2], value.shape[-1]
    groups = h // kvh
    first_key = last + 1 - kv
    lead = first_key % KEY_BLOCK
    blocks = -(-(lead + kv) // KEY_BLOCK)
    total = blocks * KEY_BLOCK
    pad_back = total - lead - kv
    vis = mask[..., -kv:].expand(b, h, q, kv).reshape(b, kvh, groups, q, kv).transpose(2, 3).reshape(b * kvh, -1, kv)
    vis = F.pad(vis, (lead, pad_back), value=False)
    qg = query.reshape(b, kvh, groups, q, d).transpose(2, 3).reshape(b * kvh, -1, d)
    kp = F.pad(key, (0, 0, lead, pad_back)).reshape(b * kvh, total, d)
    vp = F.pad(value, (0, 0, lead, pad_back)).reshape(b * kvh, total, dv)
    s = fixed.dot16(qg, kp) * scaling
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    s = s.masked_fill(~vis, float("-inf")).view(b * kvh, -1, blocks, KEY_BLOCK)
    m = s.amax(dim=-1, keepdim=True)
    m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    p = torch.exp(s - m_safe).view(b * kvh, -1, total)
    o = fixed.chain_blocks(p, vp, KEY_BLOCK, 0)  # (B*KVH, rows, blocks, dv + 1)
    new = torch.cummax(m, dim=2).values
    run = torch.cat([torch.full_like(m[:, :, :1], float("-inf")), new[:, :, :-1]], dim=2)
    new_safe = torch.where(torch.isinf(new), torch.zeros_like(new), new)
    keep = torch.exp(run - new_safe)
    add = o * torch.exp(m - new_safe)
    acc = torch.zeros_like(o[:, :, 0])
    for i in range(blocks):
        acc = acc * keep[:, :, i] + add[:, :, i]
    out = (acc[..., :dv] / acc[..., dv:]).reshape(b, kvh, q, groups, dv).transpose(2, 3).reshape(b, h, q, dv)
    return out.transpose(1, 2).contiguous()


def _mask(b, q, kv, last, window):
    qpos = torch.arange(last + 1 - q, last + 1)
    kpos = torch.arange(last + 1 - kv, last + 1)
    vis = kpos[None, :] <= qpos[:, None]
    if window:
        vis &= kpos[None, :] > qpos[:, None] - window
    return vis.expand(b, 1, q, kv).clone()


class _Layer(torch.nn.Module):
    def __init__(self, window):
        super().__init__()
        self.sliding_window, self.layer_idx = window, 0


CASES = [  # (rows b, heads, kv heads, head dim, queries, keys, last position, window, softcap)
    (1, 4, 1, 256, 1, 2049, 2048, None, None),  # the 270M's global layer, one decode step
    (1, 4, 1, 256, 1, 512, 2048, 512, None),  # its sliding layer: key 0 at position 1537 (lead 1)
    (1, 4, 1, 256, 1, 511, 700, 512, None),  # lead 62, the last block partial
    (1, 4, 1, 64, 1, 64, 63, None, None),  # exactly one whole block
    (1, 4, 1, 64, 1, 10, 9, None, None),  # one partial block
    (1, 4, 1, 64, 1, 50, 130, 50, None),  # one block holding both ends (lead 17, ends inside it)
    (2, 6, 2, 32, 1, 300, 299, None, 50.0),  # 2 rows, 3 query heads per KV head, soft-capped
    (1, 4, 1, 64, 70, 70, 69, None, None),  # a prefill of 70 queries
    (1, 4, 1, 64, 3, 64, 63, None, None),  # 12 rows against a single whole block (no matrix-vector kernel)
    (1, 2, 1, 64, 2, 64, 127, None, None),  # 4 rows, a single whole block after the first
    (1, 2, 2, 32, 300, 300, 299, None, None),  # 2 of the reference's query chunks, 5 of the module's
    (1, 4, 1, 32, 300, 600, 599, 128, None),  # 2 query chunks past a 128-token window
    (1, 4, 2, 32, 40, 200, 400, 200, 30.0),  # a later prefill chunk in a sliding cache, lead 9
]


@pytest.mark.parametrize("case", CASES, ids=[f"b{c[0]}-q{c[4]}-kv{c[5]}-last{c[6]}" for c in CASES])
def test_in_place_keys_and_skipped_blocks_give_the_padded_layouts_bits(case):
    b, h, kvh, d, q, kv, last, window, softcap = case
    gen = torch.Generator().manual_seed(sum(case[:7]))
    query = torch.randn(b, h, q, d, generator=gen)
    key = torch.randn(b, kvh, kv + 7, d, generator=gen)[:, :, 3 : kv + 3]  # a view into a larger cache, as in use
    value = torch.randn(b, kvh, kv, d, generator=gen)
    mask = _mask(b, q, kv, last, window)
    pos = torch.arange(last + 1 - q, last + 1).unsqueeze(0)
    got = invariant_attention(_Layer(window), query, key, value, mask, scaling=d**-0.5, softcap=softcap,
                              position_ids=pos)[0]
    want = _reference(query, key.contiguous(), value, mask, d**-0.5, softcap, last)
    assert got.shape == want.shape == (b, q, h, d)
    assert torch.equal(got, want)
