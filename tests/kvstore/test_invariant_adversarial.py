"""Issue 58, items 1 and 3: the batch-invariant mode is exact by construction, not by a property of the vendor BLAS.

(a) An adversarial BLAS: torch's products (F.linear, matmul, mm, bmm, baddbmm, addmm, Tensor.__matmul__) replaced by
versions whose last bits depend on the row count and the thread count, as Intel's MKL's do (a relative change of up
to two units in the last place, chosen by rows and threads). Products with one term (K == 1: no sum, so no order to
move; transformers' rotary embedding computes its angles that way) are left exact. Through it the mode loads and its
outputs do not change: one pass == 16-token chunks == token by token on the tiny Gemma 3, the same bits as without
the adversary, on 1 thread and on 2. On the code before issue 58 (MKL tiles) this fails.

(b) MKL's and ATen's own switches, set before torch loads (MKL_CBWR=COMPATIBLE, MKL_CBWR=AVX2,
MKL_ENABLE_INSTRUCTIONS=AVX2, ATEN_CPU_CAPABILITY=avx2, and the portable profile's combination): the mode loads, one
pass == 16-token chunks, and the kernel's golden digest and the logits are the bits of the run without them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from kvstore import Determinism
from kvstore.backends.transformers.capture import forward, new_cache
from kvstore.backends.transformers.model import load_frozen_model

REPO = Path(__file__).resolve().parents[2]
INVARIANT = Determinism(batch_invariant=True, prefill_chunk=0)
IDS = [2] + [4 + (53 * i + 17) % 256 for i in range(150)]  # three key blocks past the tiny model's windows


def _adversary(orig, inner: int):
    """`orig` with a last-bits change that depends on the row count and the thread count (where the product sums
    more than one term): out * (1 + c * 2^-22), c = (rows + threads) % 3."""
    def call(*args, **kwargs):
        out = orig(*args, **kwargs)
        a = args[inner] if len(args) > inner else None
        if not torch.is_tensor(a) or a.dim() == 0 or a.shape[-1] < 2 or not out.is_floating_point():
            return out
        rows = a.numel() // a.shape[-1]
        c = (rows + torch.get_num_threads()) % 3
        return out * (1 + c * 2.0**-22) if c else out
    return call


def _install_adversary(monkeypatch) -> None:
    monkeypatch.setattr(F, "linear", _adversary(F.linear, 0))
    monkeypatch.setattr(torch, "matmul", _adversary(torch.matmul, 0))
    monkeypatch.setattr(torch, "mm", _adversary(torch.mm, 0))
    monkeypatch.setattr(torch, "bmm", _adversary(torch.bmm, 0))
    monkeypatch.setattr(torch, "baddbmm", _adversary(torch.baddbmm, 1))
    monkeypatch.setattr(torch, "addmm", _adversary(torch.addmm, 1))
    monkeypatch.setattr(torch.Tensor, "__matmul__", _adversary(torch.Tensor.__matmul__, 0))
    monkeypatch.setattr(torch.Tensor, "matmul", _adversary(torch.Tensor.matmul, 0))


def _runs(fm) -> dict[str, torch.Tensor]:
    one = forward(fm, IDS, new_cache(fm))[0]
    cache = new_cache(fm)
    chunks = torch.cat([forward(fm, IDS[i : i + 16], cache)[0] for i in range(0, len(IDS), 16)])
    cache = new_cache(fm)
    steps = torch.cat([forward(fm, [t], cache)[0] for t in IDS])
    return {"one pass": one, "16-token chunks": chunks, "token by token": steps}


def test_the_adversary_moves_a_products_bits(monkeypatch):
    """The adversary is one: through it a row of a product has other bits at another row count (so the test below
    can fail), while a one-term product (K == 1) stays exact."""
    x, w = torch.randn(8, 64), torch.randn(32, 64)
    _install_adversary(monkeypatch)
    assert not torch.equal(F.linear(x[:1], w)[0], F.linear(x, w)[0])
    assert not torch.equal((x[:1] @ w.t())[0], (x @ w.t())[0])
    assert torch.equal(torch.matmul(x[:, :1], w[:1]), x[:, :1] * w[:1])


@pytest.mark.parametrize("threads", [1, 2])
def test_the_modes_outputs_do_not_move_through_an_adversarial_blas(monkeypatch, threads):
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        honest = _runs(load_frozen_model("tiny-gemma3", INVARIANT))["one pass"]
        _install_adversary(monkeypatch)
        torch.set_num_threads(threads)
        fm = load_frozen_model("tiny-gemma3", INVARIANT)  # the load's own checks run through the adversary too
        runs = _runs(fm)
    finally:
        torch.set_num_threads(before)
    for name, out in runs.items():
        assert torch.equal(out, honest), f"{name} through the adversarial BLAS on {threads} thread(s)"


_PROBE = """
import hashlib, json, sys, torch
import kvstore.determinism
from kvstore import Determinism
from kvstore.backends.transformers.capture import forward, new_cache
from kvstore.backends.transformers.invariant import kernel_digest
from kvstore.backends.transformers.model import load_frozen_model
ids, profile = json.loads(sys.argv[1]), sys.argv[2]
if profile == "unchecked":  # a variable no profile admits: the kernel's arithmetic under it, the policy set aside
    kvstore.determinism.check_profile = lambda profile: None
fm = load_frozen_model("tiny-gemma3", Determinism(batch_invariant=True, prefill_chunk=0,
                                                  profile="native" if profile == "unchecked" else profile))
one = forward(fm, ids, new_cache(fm))[0]
cache = new_cache(fm)
chunks = torch.cat([forward(fm, ids[i : i + 16], cache)[0] for i in range(0, len(ids), 16)])
print(json.dumps({"equal": torch.equal(one, chunks), "digest": kernel_digest(),
                  "logits": hashlib.sha256(one.numpy().tobytes()).hexdigest(),
                  "capability": torch.backends.cpu.get_cpu_capability()}))
"""
# name: (variables, the profile the probe loads in; "unchecked": the native profile with its check set aside, for a
# variable no profile admits: what is shown is the mode's arithmetic under it)
SWITCHES = {
    "none": ({}, "native"),
    "MKL_CBWR=COMPATIBLE": ({"MKL_CBWR": "COMPATIBLE"}, "unchecked"),
    "MKL_CBWR=AVX2": ({"MKL_CBWR": "AVX2"}, "unchecked"),
    "MKL_ENABLE_INSTRUCTIONS=AVX2": ({"MKL_ENABLE_INSTRUCTIONS": "AVX2"}, "native"),
    "ATEN_CPU_CAPABILITY=avx2": ({"ATEN_CPU_CAPABILITY": "avx2"}, "unchecked"),
    "portable + MKL_ENABLE_INSTRUCTIONS=AVX2": ({"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2",
                                                 "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
                                                "portable"),
}


def test_mkl_and_atens_switches_change_no_bit_of_the_mode():
    base = {k: v for k, v in os.environ.items()
            if k not in ("MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")}
    base |= {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "2"}
    procs = {name: subprocess.Popen([sys.executable, "-c", _PROBE, json.dumps(IDS), profile], env={**base, **env},
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
             for name, (env, profile) in SWITCHES.items()}
    got = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"{name}: {err.strip().splitlines()[-1:]}"
        got[name] = json.loads(out.strip().splitlines()[-1])
    assert got["ATEN_CPU_CAPABILITY=avx2"]["capability"] == "AVX2"  # the switch took
    for name, r in got.items():
        assert r["equal"], f"{name}: one pass != 16-token chunks"
        assert r["digest"] == got["none"]["digest"], f"{name}: the kernel's golden digest moved"
        assert r["logits"] == got["none"]["logits"], f"{name}: the mode's logits moved"
