"""Compare two logit tensors the way the exactness claim is stated: SHA-256 of the bytes, KL divergence,
max |difference| and argmax agreement."""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass

import torch


def logits_sha256(logits: torch.Tensor) -> str:
    """SHA-256 of a logits tensor's raw bytes (its own dtype, C order)."""
    t = logits.detach().contiguous().cpu()
    return hashlib.sha256(t.view(torch.uint8).numpy()).hexdigest()


@dataclass(frozen=True)
class Comparison:
    sha256_a: str
    sha256_b: str
    sha256_equal: bool
    max_abs_diff: float
    kl_max: float  # max over positions of KL(softmax(a) || softmax(b)), in nats
    argmax_agreement: float  # fraction of positions whose argmax agrees

    def to_dict(self) -> dict:
        return asdict(self)


def compare_logits(a: torch.Tensor, b: torch.Tensor) -> Comparison:
    """a, b: (..., vocab) logits of the same positions; `a` is the reference."""
    if a.shape != b.shape:
        raise ValueError(f"logits shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}")
    ha, hb = logits_sha256(a), logits_sha256(b)
    a64, b64 = a.detach().double().reshape(-1, a.shape[-1]), b.detach().double().reshape(-1, b.shape[-1])
    la, lb = torch.log_softmax(a64, -1), torch.log_softmax(b64, -1)
    kl = (la.exp() * (la - lb)).sum(-1).clamp_min(0)
    return Comparison(
        sha256_a=ha, sha256_b=hb, sha256_equal=ha == hb,
        max_abs_diff=float((a64 - b64).abs().max()),
        kl_max=0.0 if ha == hb else float(kl.max()),
        argmax_agreement=float((a64.argmax(-1) == b64.argmax(-1)).double().mean()),
    )
