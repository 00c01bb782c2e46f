"""The batch-invariant mode's own products (kvstore/backends/transformers/fixed.py): the scalar reference, the AVX2
path and the AVX-512 path give the same bits on every shape (K not a multiple of 16 included), every row count and
thread count; a row's bits are those of the row alone; the outputs on fixed inputs are pinned (golden: a change that
moves them is a new KERNEL version); the build is cached, atomic and refused in one line without a compiler."""

from __future__ import annotations

import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest
import torch

from kvstore.backends.transformers import fixed
from kvstore.backends.transformers.invariant import KERNEL, kernel_digest

ROOT = Path(__file__).resolve().parents[2]
PATHS = [name for name in ("scalar", "avx2", "avx512") if fixed.library().kvg_supported(fixed.ISAS[name])]


def _all_paths_agree(run) -> torch.Tensor:
    """`run(isa_name, threads)` on every path this CPU has and thread counts 1, 2, 3: one result, returned."""
    outs = [(name, t, run(name, t)) for name in PATHS for t in (1, 2, 3)]
    for name, t, out in outs[1:]:
        assert torch.equal(out, outs[0][2]), f"{name} on {t} threads differs from {outs[0][0]} on 1"
    return outs[0][2]


@pytest.mark.skipif(len(PATHS) < 3, reason="this CPU lacks AVX-512 or AVX2: only the paths it has are compared")
def test_this_cpu_has_every_path():
    assert PATHS == ["scalar", "avx2", "avx512"]


@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (1, 7, 5), (2, 33, 17), (3, 50, 16), (4, 24, 31), (5, 96, 48),
                                   (9, 70, 130), (64, 40, 640), (257, 30, 641), (1024, 25, 64), (4096, 26, 33)])
@pytest.mark.parametrize("bias", [False, True])
def test_scalar_avx2_and_avx512_paths_give_the_same_bits(m, n, k, bias):
    gen = torch.Generator().manual_seed(m * 1000 + n + k)
    x, w = torch.randn(m, k, generator=gen), torch.randn(n, k, generator=gen)
    b = torch.randn(n, generator=gen) if bias else None
    small = m * n * k < 3e6  # the scalar reference is slow: every path on the small ones, the vector paths on all
    ref = _all_paths_agree(lambda isa, t: fixed.dot16(x, w, b, isa_name=isa if small or isa != "scalar" else "avx2",
                                                      threads=t))
    for r in sorted({0, m // 2, m - 1}):  # the row alone == the row among m
        assert torch.equal(fixed.dot16(x[r : r + 1], w, b), ref[r : r + 1]), r
    close = torch.nn.functional.linear(x.double(), w.double(), None if b is None else b.double())
    assert torch.allclose(ref.double(), close, rtol=1e-4, atol=1e-4 * k ** 0.5)  # it is the product


def _fma32(a: float, b: float, c: float) -> float:
    """float32's fma, exactly: a * b + c in rationals, rounded once to float32 (via float64 only where that is exact,
    which the test's inputs of at most 12 significant bits make sure)."""
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    wide = float(exact)
    assert Fraction(wide) == exact, "the inputs must keep a * b + c exact in float64"
    return float(torch.tensor(wide, dtype=torch.float64).float())


def _add32(a: float, b: float) -> float:
    return float(torch.tensor(a, dtype=torch.float32) + torch.tensor(b, dtype=torch.float32))


@pytest.mark.parametrize("k", [1, 15, 16, 37, 100])
def test_the_order_is_the_documented_one(k):
    """dot16 == fixed.py's recipe written out fma by fma in exact arithmetic: 16 lanes over k = l, l + 16, ... from
    +0.0, then the tree (l[i] + l[i + 8]), (s[i] + s[i + 4]), (s[i] + s[i + 2]), s[0] + s[1], then + bias."""
    i = torch.arange(2 * k, dtype=torch.float64)
    vals = ((i * 2654435761 + 7) % 4093 - 2046) * 2.0**-9  # 12 significant bits: every fma's exact value fits float64
    x, w = vals[:k].float().view(1, k), vals[k:].float().view(1, k)
    bias = torch.tensor([0.3])
    lanes = [0.0] * 16
    for j in range(k):
        lanes[j % 16] = _fma32(float(x[0, j]), float(w[0, j]), lanes[j % 16])
    s = [_add32(lanes[j], lanes[j + 8]) for j in range(8)]
    s = [_add32(s[j], s[j + 4]) for j in range(4)]
    s = [_add32(s[j], s[j + 2]) for j in range(2)]
    d = _add32(s[0], s[1])
    for name in PATHS:
        assert float(fixed.dot16(x, w, isa_name=name)[0, 0]) == d, name
        assert float(fixed.dot16(x, w, bias, isa_name=name)[0, 0]) == _add32(d, float(bias[0])), name


def test_probabilities_times_values_give_the_same_bits_on_every_path():
    gen = torch.Generator().manual_seed(5)
    for b, m, nblk, blk, t0, kv, dv in [(2, 9, 3, 8, -3, 20, 37), (1, 5, 4, 64, 10, 300, 256), (1, 130, 2, 64, -5,
                                                                                                  120, 17)]:
        p = torch.rand(b, m, nblk * blk, generator=gen)
        p[p < 0.3] = 0  # masked weights: skipped
        v = torch.randn(b, kv, dv, generator=gen)
        out = _all_paths_agree(lambda isa, t, p=p, v=v, blk=blk, t0=t0: fixed.chain_blocks(p, v, blk, t0, isa_name=isa,
                                                                                             threads=t))
        assert torch.equal(fixed.chain_blocks(p[:, :1], v, blk, t0), out[:, :1])  # a row alone
        # it is the blocks' weighted values and their sums of weights
        keys = torch.arange(nblk * blk) + t0
        seen = (keys >= 0) & (keys < kv)
        vp = torch.zeros(b, nblk * blk, dv + 1, dtype=torch.float64)
        vp[:, seen, :dv] = v[:, keys[seen]].double()
        vp[:, seen, dv] = 1
        want = torch.einsum("bmct,bctd->bmcd", p.double().view(b, m, nblk, blk), vp.view(b, nblk, blk, dv + 1))
        assert torch.allclose(out.double(), want, rtol=1e-5, atol=1e-4)


def test_the_kernel_is_pinned_by_its_version():
    """The golden hash of KERNEL's outputs on fixed inputs (integers scaled by powers of two: no generator whose
    bits could move): a change to the kernel that moves a bit must bump KERNEL (and this hash)."""
    assert KERNEL == "fixed-dot16/1"
    assert kernel_digest() == "e959e55774f0a8649df557f899e22168b4ee4fef609ef3fecd33e246424793d9"


def test_the_golden_digest_is_the_same_on_every_path(monkeypatch):
    want = kernel_digest()
    for name in PATHS:
        monkeypatch.setenv("KVGRAFT_KERNEL_ISA", name)
        assert kernel_digest(threads=1) == want, name
        assert kernel_digest(threads=3) == want, name


def test_the_build_is_cached_by_content_and_safe_when_two_processes_build_at_once(tmp_path):
    code = ("from kvstore.backends.transformers import fixed; import torch; "
            "print(float(fixed.dot16(torch.ones(1, 20), torch.ones(3, 20))[0, 0]))")
    env = {**os.environ, "KVGRAFT_CACHE": str(tmp_path), "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [o[1][-300:] for o in outs]
    assert [o[0].strip() for o in outs] == ["20.0"] * 3
    built = list((tmp_path / "kernels").iterdir())
    assert len(built) == 1 and built[0].name.startswith("fixed-") and built[0].suffix == ".so", built


def test_no_compiler_is_one_line_saying_why(tmp_path):
    code = ("from kvstore.backends.transformers.invariant import unavailable; print(unavailable())")
    env = {**os.environ, "KVGRAFT_CACHE": str(tmp_path), "PYTHONPATH": str(ROOT), "CC": "no-such-cc-kvgraft"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-500:]
    line = out.stdout.strip()
    assert "\n" not in line and "no C compiler 'no-such-cc-kvgraft'" in line and "batch_invariant" in line, line
