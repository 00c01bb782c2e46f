"""The pinned determinism settings: one object, validated when made, applied in one place, recorded with every
artifact and run.

Byte-exact grafts need the same computation on both sides: the same thread count (CPU GEMM blocking
depends on it), deterministic algorithms, the same attention implementation, dtype and prefill chunking, and
the same kernel paths (`profile`: "native" or "portable", kvstore/environment.py; its variables must be set
before torch is imported, which `apply()` checks). `allow_environment_mismatch` is not a setting of the
computation but the graft policy a run chose: it is never recorded in an artifact.

`Determinism.apply()` is the only code in kvstore that changes process-wide torch state (threads,
deterministic algorithms, cuDNN/TF32 switches, grad mode); nothing happens at import time.
A bad value raises `kvstore.errors.SettingsError` naming the `determinism.<field>` and what it accepts.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any

import torch

from kvstore.environment import KERNEL_RECORD, PROFILES, check_profile
from kvstore.errors import SettingsError

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
ATTN_IMPLEMENTATIONS = ("sdpa", "eager")


@dataclass(frozen=True)
class Determinism:
    """Settings that must be equal for two computations to be byte-identical.

    threads: intra-op CPU threads (torch.set_num_threads).
    deterministic_algorithms: torch.use_deterministic_algorithms.
    attn_implementation: transformers attention backend ("sdpa" or "eager").
    dtype: the dtype the model computes and caches in.
    prefill_chunk: tokens per prefill forward pass (0 = the whole sequence at once).
    profile: the kernel paths ("native": the machine's own; "portable": pinned to AVX2, kvstore.environment).
    batch_invariant: every forward batch-invariant (transformers on CPU, float32): linear layers in fixed row tiles
        and an attention over fixed key blocks aligned to absolute positions, so a row's bits do not depend on how
        many rows or tokens share its call (one-pass prefill == chunked == token-by-token == batched rows;
        kvstore/backends/transformers/invariant.py). Recorded only when true, so the dicts, artifact ids and hashes
        made without it are those from before it existed. False here (the value an absent record means); the
        harness's default is true wherever the setup has the mode (harness/config/exact.py, issue 52).
    allow_environment_mismatch: graft artifacts deposited in another compute environment anyway (the result
        is then not guaranteed exact); not recorded, not part of equality.
    """

    threads: int = 2
    deterministic_algorithms: bool = True
    attn_implementation: str = "sdpa"
    dtype: str = "float32"
    prefill_chunk: int = 512
    profile: str = "native"
    batch_invariant: bool = False
    allow_environment_mismatch: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        if self.profile not in PROFILES:
            raise SettingsError(f"determinism.profile={self.profile!r}: use one of {list(PROFILES)}")
        if not isinstance(self.allow_environment_mismatch, bool):
            raise SettingsError(
                f"determinism.allow_environment_mismatch={self.allow_environment_mismatch!r} must be true or false"
            )
        if self.dtype not in _DTYPES:
            raise SettingsError(f"determinism.dtype={self.dtype!r} is not one of {sorted(_DTYPES)}")
        if not _is_int(self.threads) or self.threads < 1:
            raise SettingsError(f"determinism.threads={self.threads!r} must be a whole number >= 1")
        if not isinstance(self.deterministic_algorithms, bool):
            raise SettingsError(
                f"determinism.deterministic_algorithms={self.deterministic_algorithms!r} must be true or false"
            )
        if not _is_int(self.prefill_chunk) or self.prefill_chunk < 0:
            raise SettingsError(
                f"determinism.prefill_chunk={self.prefill_chunk!r} must be a whole number >= 0 (0 = no chunking)"
            )
        if not isinstance(self.batch_invariant, bool):
            raise SettingsError(f"determinism.batch_invariant={self.batch_invariant!r} must be true or false")
        if self.batch_invariant and self.dtype != "float32":
            raise SettingsError(
                f"determinism.batch_invariant=true with determinism.dtype={self.dtype!r}: the batch-invariant mode is "
                "measured and offered for float32 only; set determinism.dtype=float32 or leave batch_invariant off"
            )
        if self.attn_implementation not in ATTN_IMPLEMENTATIONS:
            raise SettingsError(
                f"determinism.attn_implementation={self.attn_implementation!r}: use one of {list(ATTN_IMPLEMENTATIONS)}"
            )

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    def to_dict(self) -> dict:
        """The settings of the computation, as recorded with every artifact and run (the graft policy left out;
        batch_invariant only when true, so the default mode records what it recorded before the setting existed)."""
        d = asdict(self)
        del d["allow_environment_mismatch"]
        if not self.batch_invariant:
            del d["batch_invariant"]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Determinism:
        """The settings recorded by `to_dict` or by a backend's `settings()` (missing keys take their defaults; an
        unknown key is an error). The mode's kernel version (KERNEL_RECORD) is a fact of the code that computed, not a
        setting to choose: it is read past here, and admission compares it (`recorded_kernel`)."""
        if not isinstance(d, dict):
            raise SettingsError(f"determinism settings must be a mapping of field -> value, got {type(d).__name__}")
        d = {k: v for k, v in d.items() if k != KERNEL_RECORD}
        known = {f.name for f in fields(cls)}
        unknown = sorted(str(k) for k in d if k not in known)
        if unknown:
            raise SettingsError(
                f"unknown determinism setting(s) {', '.join(f'determinism.{k}' for k in unknown)}; "
                f"the settings are {sorted(known)}"
            )
        return cls(**d)

    def apply(self) -> None:
        """Apply the settings to this process (idempotent), and switch autograd off: kvstore only infers.
        A profile whose kernel variables are not in force is a SettingsError with the command to run."""
        check_profile(self.profile)
        # cuBLAS needs this set before the first GEMM to be deterministic on GPU.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)
        torch.use_deterministic_algorithms(self.deterministic_algorithms)
        torch.backends.cudnn.benchmark = False
        if torch.cuda.is_available():
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        torch.set_grad_enabled(False)


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def add_arguments(parser: argparse.ArgumentParser, *, exclude: tuple[str, ...] = ()) -> None:
    """One command-line flag per Determinism field, read off the dataclass (`--prefill-chunk` for prefill_chunk;
    a boolean as `--x` / `--no-x`), each defaulting to None (= the field's default): every script takes the pinned
    settings from here, so a field added to Determinism is a flag of every script with no script edited."""
    for f in fields(Determinism):
        if f.name in exclude:
            continue
        default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
        flag, what = "--" + f.name.replace("_", "-"), f"determinism.{f.name} (default {default!r})"
        if isinstance(default, bool):
            parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=what)
        else:
            parser.add_argument(flag, dest=f.name, type=type(default), default=None, metavar=f.name.upper(),
                                help=what)


def from_arguments(args: argparse.Namespace, **overrides: Any) -> Determinism:
    """The Determinism the flags of `add_arguments` give (a flag not given keeps the field's default)."""
    given = {f.name: getattr(args, f.name) for f in fields(Determinism) if getattr(args, f.name, None) is not None}
    return Determinism(**{**given, **overrides})
