"""kvgraft's own float32 products with a fixed reduction order (fixed_kernel.c), the batch-invariant mode's only
products: an output's bits depend on its own operands only, never on how many rows share the call, where the row
sits in it, the thread count, the vendor BLAS or its switches, or the instruction set.

What they compute, exactly (float32, round to nearest even; fma is one rounding):

- `dot16(x, w, bias)`: out[i, j] = D(x[i], w[j]) (then + bias[j], one separately rounded addition), with x [M, K]
  and w [N, K] both contiguous in K (w as torch.nn.Linear stores its weight). D accumulates in 16 lanes: lane l is
  an fma chain over k = l, l + 16, l + 32, ... < K in increasing k, from +0.0; the lanes are then summed by a fixed
  pairwise tree: s8[i] = l[i] + l[i + 8] (i < 8), s4[i] = s8[i] + s8[i + 4] (i < 4), s2[i] = s4[i] + s4[i + 2]
  (i < 2), D = s2[0] + s2[1].
- `chain_blocks(p, v, blk, t0)`: for probabilities p [M, nblk * blk] over positions t and values v [kv, dv] (key
  of position t: t + t0), out[i, c, :dv] is, for each block c of `blk` positions, an fma chain
  acc = fma(p[i, t], v[t + t0], acc) over the block's positions in increasing t, from +0.0, skipping positions
  whose key is outside [0, kv) and terms with p == 0; out[i, c, dv] = the plain sum of the same p terms in the
  same order, from +0.0 (the block's sum of weights).

The same roundings run for every output whatever tile it falls in: AVX-512 (one zmm per 16 lanes), AVX2 + FMA
(two ymm, lanes 0-7 and 8-15) and the scalar reference (fmaf) give the same bits (tests/kvstore/test_fixed.py).
Threads split the outputs, never a sum: OpenMP regions on torch.get_num_threads() threads, in torch's own OpenMP
runtime (its libgomp.so.1 is loaded before the kernel, so the kernel's reference to that name resolves to it: one
thread pool for torch and the kernel). A product too small to gain from threads runs on the calling thread; the
split changes which thread computes an output, never how.

The C source is compiled at first use with the system C compiler (`CC`, default gcc) into
`$KVGRAFT_CACHE/kernels` (default ~/.cache/kvgraft/kernels), the file named by the SHA-256 of the source, the flags
and the compiler's version, written atomically (a temporary file, then a rename: two processes compiling at once
each write their own and the last rename wins, with identical content). `KVGRAFT_KERNEL_ISA=scalar|avx2|avx512`
forces an instruction set (tests; a slower one gives the same bits).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from kvstore.errors import SettingsError

SOURCE = Path(__file__).with_name("fixed_kernel.c")
FLAGS = ("-O3", "-fno-fast-math", "-ffp-contract=off", "-fPIC", "-shared", "-fopenmp", "-std=gnu11")
ISAS = {"scalar": 0, "avx2": 1, "avx512": 2}


class KernelUnavailableError(SettingsError):
    """The fixed-order kernel could not be built or loaded here (no C compiler, a compile error, a CPU without the
    instructions asked for): the batch-invariant mode cannot run. The message says why; install gcc, or leave
    determinism.batch_invariant off."""


def cache_dir() -> Path:
    """Where compiled kernels live: $KVGRAFT_CACHE/kernels, default ~/.cache/kvgraft/kernels."""
    return Path(os.environ.get("KVGRAFT_CACHE", Path.home() / ".cache" / "kvgraft")) / "kernels"


def _compiler() -> tuple[str, str]:
    cc = os.environ.get("CC", "gcc")
    path = shutil.which(cc)
    if path is None:
        raise KernelUnavailableError(f"no C compiler {cc!r} on PATH to build the batch-invariant mode's kernel "
                                     f"({SOURCE.name}); install gcc (or set CC), or leave determinism.batch_invariant "
                                     "off")
    try:
        version = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise KernelUnavailableError(f"the C compiler {path} did not run ({exc}); install a working gcc (or set "
                                     "CC), or leave determinism.batch_invariant off") from exc
    return path, version.splitlines()[0] if version else path


@functools.cache
def library() -> ctypes.CDLL:
    """The compiled kernel (built once per source, flags and compiler; KernelUnavailableError, one line, if not)."""
    cc, version = _compiler()
    source = SOURCE.read_bytes()
    key = hashlib.sha256(source + "\0".join(FLAGS).encode() + b"\0" + version.encode()).hexdigest()
    target = cache_dir() / f"fixed-{key[:32]}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".fixed-", suffix=".so", dir=target.parent)
        os.close(fd)
        try:
            done = subprocess.run([cc, *FLAGS, "-o", tmp, str(SOURCE), "-lm"], capture_output=True, text=True,
                                  timeout=300)
            if done.returncode != 0:
                why = (done.stderr.strip().splitlines() or ["no message"])[-1]
                raise KernelUnavailableError(f"{cc} could not build {SOURCE.name} (exit {done.returncode}: {why}); "
                                             "the batch-invariant mode needs it: fix the compiler, or leave "
                                             "determinism.batch_invariant off")
            os.replace(tmp, target)
        except subprocess.SubprocessError as exc:
            raise KernelUnavailableError(f"{cc} did not finish building {SOURCE.name} ({exc}); leave "
                                         "determinism.batch_invariant off") from exc
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    lib = ctypes.CDLL(str(target))
    i, p = ctypes.c_long, ctypes.c_void_p
    lib.kvg_supported.argtypes = [ctypes.c_int]
    lib.kvg_dot16.argtypes = [i, i, i, i, p, i, i, p, i, i, p, p, i, i, ctypes.c_int, ctypes.c_int]
    lib.kvg_chain.argtypes = [i, i, i, i, i, i, i, p, i, i, p, i, i, p, i, i, ctypes.c_int, ctypes.c_int]
    return lib


@functools.cache
def _best_isa() -> int:
    lib = library()
    return next(code for code in (2, 1, 0) if lib.kvg_supported(code))


def isa(name: str | None = None) -> int:
    """The instruction set's code: `name`, else $KVGRAFT_KERNEL_ISA, else the best this CPU has."""
    name = name or os.environ.get("KVGRAFT_KERNEL_ISA") or None
    if name is None:
        return _best_isa()
    if name not in ISAS:
        raise KernelUnavailableError(f"KVGRAFT_KERNEL_ISA={name!r} is not one of {sorted(ISAS)}; unset it")
    if not library().kvg_supported(ISAS[name]):
        raise KernelUnavailableError(f"KVGRAFT_KERNEL_ISA={name!r}: this CPU lacks those instructions; unset it")
    return ISAS[name]


def _rows(t: torch.Tensor) -> torch.Tensor:
    """`t` with a unit last stride and float32 on the CPU (a copy only where it is not)."""
    if t.dtype != torch.float32 or t.device.type != "cpu":
        raise KernelUnavailableError(f"the fixed-order kernel computes float32 on the CPU, got {t.dtype} on "
                                     f"{t.device}; use dtype=float32 and device=cpu with determinism.batch_invariant")
    return t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()


def dot16(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, *, isa_name: str | None = None,
          threads: int | None = None) -> torch.Tensor:
    """out[..., i, j] = D(x[..., i, :], w[..., j, :]) (+ bias[j]) (module doc). x [..., M, K]; w [N, K] (shared)
    or [B, N, K] with x [B, M, K]; returns [..., M, N]."""
    x, w = _rows(x), _rows(w)
    k = x.shape[-1]
    if w.shape[-1] != k:
        raise ValueError(f"dot16: x has {k} columns, w {w.shape[-1]}")
    n = w.shape[-2]
    if w.dim() == 2:  # every row of x against the same weight: one product of all rows
        lead = x.shape[:-1]
        x2 = x.reshape(-1, k) if x.dim() != 2 else x
        out = torch.empty(x2.shape[0], n, dtype=torch.float32)
        b, m, sxb, ldx, swb, sob = 1, x2.shape[0], 0, x2.stride(0), 0, 0
        xp = x2
    else:
        if x.dim() != 3 or w.dim() != 3 or x.shape[0] != w.shape[0]:
            raise ValueError(f"dot16: batched x {tuple(x.shape)} and w {tuple(w.shape)} must be [B, M, K], [B, N, K]")
        lead = x.shape[:-1]
        b, m = x.shape[0], x.shape[1]
        out = torch.empty(b, m, n, dtype=torch.float32)
        xp, sxb, ldx, swb, sob = x, x.stride(0), x.stride(1), w.stride(0), m * n
    if bias is not None:
        bias = _rows(bias).contiguous()
    if out.numel():
        rc = library().kvg_dot16(b, m, n, k, xp.data_ptr(), sxb, ldx, w.data_ptr(), swb, w.stride(-2),
                                 bias.data_ptr() if bias is not None else None, out.data_ptr(), sob, n,
                                 isa(isa_name), threads or torch.get_num_threads())
        if rc:
            raise KernelUnavailableError("the fixed-order kernel refused the instruction set; unset KVGRAFT_KERNEL_ISA")
    return out.reshape(*lead, n)


def chain_blocks(p: torch.Tensor, v: torch.Tensor, blk: int, t0: int, *, isa_name: str | None = None,
                 threads: int | None = None) -> torch.Tensor:
    """The blocks' weighted values and sums of weights (module doc): p [B, M, nblk * blk], v [B, kv, dv] ->
    [B, M, nblk, dv + 1]."""
    p, v = _rows(p), _rows(v)
    b, m, total = p.shape
    kv, dv = v.shape[1], v.shape[2]
    nblk = total // blk
    out = torch.empty(b, m, nblk, dv + 1, dtype=torch.float32)
    if out.numel():
        rc = library().kvg_chain(b, m, nblk, blk, t0, kv, dv, p.data_ptr(), p.stride(0), p.stride(1), v.data_ptr(),
                                 v.stride(0), v.stride(1), out.data_ptr(), m * nblk * (dv + 1), nblk * (dv + 1),
                                 isa(isa_name), threads or torch.get_num_threads())
        if rc:
            raise KernelUnavailableError("the fixed-order kernel refused the instruction set; unset KVGRAFT_KERNEL_ISA")
    return out
