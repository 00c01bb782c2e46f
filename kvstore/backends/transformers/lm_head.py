"""The output projection (LM head) computed in vocabulary blocks on CPU: the same bits, less time at batch > 1.

A decode step's largest matrix product is the LM head: (rows, hidden) x (hidden, vocab), and Gemma 3's vocab
is 262,144. At batch size 1 that is a matrix-vector product bound by reading the weight once. At 2-16 rows
MKL's sgemm on the whole (vocab, hidden) weight runs at a fraction of that speed (it packs panels far larger
than the caches): measured on a 2-core AMD EPYC, fp32, 262,144 x 640, 8 rows: 120 ms whole vs 72 ms in blocks
of 2,048 vocabulary rows (1 row: 46.5 vs 48.8 ms). Each output element is one dot product over `hidden`, in
the same kernel whichever block it falls in, so blocking changes no bit (tests/kvstore/test_lm_head.py checks
torch.equal against the whole product; `make replay` reproduces hashes registered before blocking).

One row (greedy decode, a graft's first token) always takes the whole product: there blocking gains nothing
(46.5 vs 48.8 ms above), and on an Intel Xeon with AVX-512 MKL's matrix-vector kernel rounds a 1-row product of
a vocabulary block differently from the whole one (max |d| 1.2e-7, seen in tests/kvstore/test_lm_head.py); from
2 rows up blocked and whole products were bit-identical on both CPUs.

Only the forward of the existing module changes: its weight stays the same (tied) parameter, so the model
fingerprint, the state dict and every cache are untouched. Large row counts (prefill logits over many
positions) and non-CPU devices take the whole product, where the library kernels do well.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F

BLOCK_ROWS = 2048  # vocabulary rows per block (1,024-2,048 measured best; 8,192 already loses half the gain)
MAX_ROWS = 64  # products with more input rows than this take the whole weight at once
MIN_VOCAB = 4 * BLOCK_ROWS  # smaller heads fit the caches anyway


def _blocked_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    rows = x.numel() // x.shape[-1] if x.numel() else 0
    if x.device.type != "cpu" or rows <= 1 or rows > MAX_ROWS:  # one row: the matrix-vector kernel, see below
        return F.linear(x, self.weight, self.bias)
    w, b = self.weight, self.bias
    parts = [
        F.linear(x, w[i : i + BLOCK_ROWS], None if b is None else b[i : i + BLOCK_ROWS])
        for i in range(0, w.shape[0], BLOCK_ROWS)
    ]
    return torch.cat(parts, dim=-1)


def block_lm_head(model: torch.nn.Module) -> bool:
    """Compute `model`'s output projection in vocabulary blocks (see the module doc). True when installed."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if not isinstance(head, torch.nn.Linear) or head.weight.shape[0] < MIN_VOCAB:
        return False
    head.forward = types.MethodType(_blocked_forward, head)
    return True
