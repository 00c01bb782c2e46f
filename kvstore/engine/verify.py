"""The exactness procedure, written once: is a grafted prefix byte-identical to computing it fresh?

    check = check_graft(be, prefix_ids, suffix_ids, store=LocalStore(root), oneshot=True)
    check.equal, check.sha256_reference, check.sha256_graft, check.kl_max, check.timing_s

The claim (../README, DESIGN.md "Fresh reference"): for a prefix and a suffix,
  (a) fresh reference: prefill the prefix in the pinned chunk schedule, then forward the suffix;
  (b) graft: deposit the prefix (prefill + capture), through a store when one is given (put, then get, which
      re-hashes every byte), graft the snapshot into a fresh cache at its own position, forward the same suffix;
and the suffix logits of (a) and (b) have the same SHA-256. `check_graft` runs both and compares them
(`compare_logits`: SHA-256 of the bytes, KL, max |difference|, argmax agreement). Optionally it also reports
(c) one-shot: one forward over prefix+suffix on a fresh cache, a different computation (other GEMM and
attention shapes) that differs at ~1e-5 on CPU: reported, never part of the verdict.

The halves are public so that a benchmark can time them alone and a script can run (b) in another process:
`reference_logits`, `graft_logits` (returns `Restored`: logits + timings), `oneshot_logits`; `check_graft`
takes a `restore` callable for the cross-process case (scripts/verify_graft.py).

Every model-shaped step goes through the backend (kvstore.engine.protocol.Backend with the Stepwise capability: the
suffix is one `forward` on each side): `be` is the backend load_backend returns (transformers, llama.cpp, the fake).
The procedure is the same on every such backend: its own pinned prefill schedule on both sides, its own capture and
graft. An engine that decodes only in itself (vLLM, InEngineDecoding) is checked through its requests instead
(scripts/verify_vllm.py).

`offset` > 0 is the position experiment (scripts/position_sweep.py): the reference is computed at positions
offset.., the graft re-rotates the keys (a backend with the Repositioning capability: transformers); only offset 0
is expected to be exact.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field

import torch

from kvstore.engine.protocol import Backend, Repositioning, Stepwise
from kvstore.errors import KVStoreError
from kvstore.format.artifact import Snapshot
from kvstore.store.base import Store


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
        raise KVStoreError(f"compare_logits: logits shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}; "
                           "compare the logits of the same positions")
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


# --------------------------------------------------------------------------------------------- the halves
def _stepwise(be: Backend, offset: int = 0) -> Backend:
    """`be` when it has what the check needs (Stepwise; Repositioning for offset > 0), else a KVStoreError."""
    if not isinstance(be, Backend):
        raise KVStoreError(f"{type(be).__name__} is not a kvstore backend; load one with kvstore.load_backend() "
                           "(a transformers FrozenModel's: kvstore.backends.transformers.TransformersBackend.of)")
    if not isinstance(be, Stepwise):
        raise KVStoreError(f"the {be.name} backend decodes inside its engine (no step-wise forward), so the graft "
                           "check's suffix forward does not exist there; check it through its requests "
                           f"(scripts/verify_graft.py --backend {be.name})")
    if offset and not isinstance(be, Repositioning):
        raise KVStoreError(f"offset {offset}: re-rotating keys (the position experiment) needs a backend that "
                           f"repositions (transformers), this is {be.name}; use offset 0 (own position, the exact "
                           "graft)")
    return be


def reference_logits(be: Backend, prefix_ids: list[int], suffix_ids: list[int],
                     offset: int = 0) -> torch.Tensor:
    """(a) The fresh reference: prefill the prefix at positions offset.. in the pinned schedule, then the
    suffix. Returns the suffix logits (1, len(suffix), vocab)."""
    be = _stepwise(be, offset)
    state, _ = be.prefill(list(prefix_ids), position=offset)
    return be.forward(list(suffix_ids), state, position=offset + len(prefix_ids))


def oneshot_logits(be: Backend, prefix_ids: list[int], suffix_ids: list[int]) -> torch.Tensor:
    """(c) One forward over prefix+suffix on a fresh state, sliced to the suffix: (1, len(suffix), vocab)."""
    be = _stepwise(be)
    return be.forward(list(prefix_ids) + list(suffix_ids), be.new_state())[:, len(prefix_ids) :, :]


@dataclass(frozen=True)
class Restored:
    """The graft half's result: suffix logits on a rebuilt cache, and where the time went (seconds:
    get, when read from a store; graft; forward)."""

    logits: torch.Tensor  # (1, suffix, vocab)
    timing_s: dict[str, float]


def graft_logits(
    be: Backend,
    prefix_ids: list[int],
    suffix_ids: list[int],
    snapshot: Snapshot | None = None,
    *,
    store: Store | None = None,
    artifact_id: str | None = None,
    offset: int = 0,
) -> Restored:
    """(b) The graft half: the snapshot (or `store.get(artifact_id)`, bytes verified) grafted into a fresh
    cache, checked against prefix+suffix, then the suffix forward. offset > 0 re-rotates the keys instead."""
    be = _stepwise(be, offset)
    timing: dict[str, float] = {}
    t0 = time.perf_counter()
    if snapshot is None:
        if store is None or artifact_id is None:
            raise KVStoreError("graft_logits needs a snapshot, or a store and an artifact id to get it from")
        snapshot = store.get(artifact_id)
        timing["get"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    if offset == 0:
        cache = be.graft(snapshot, token_ids=list(prefix_ids) + list(suffix_ids))
    else:
        if list(snapshot.token_ids) != list(prefix_ids):
            raise KVStoreError("graft_logits: the snapshot's token ids are not the prefix given")
        cache = be.graft_repositioned(snapshot, offset)  # Repositioning (checked by _stepwise)
    t2 = time.perf_counter()
    logits = be.forward(list(suffix_ids), cache, position=offset + len(prefix_ids))
    timing.update(graft=t2 - t1, forward=time.perf_counter() - t2)
    return Restored(logits, timing)


# --------------------------------------------------------------------------------------------- the check
@dataclass(frozen=True)
class GraftCheck:
    """The outcome of one check: graft vs fresh reference (and, when asked, one-shot vs reference).

    timing_s (seconds): deposit (prefill + capture), put (into the store), reference, oneshot, restore (the
    whole graft half as the caller saw it), and the graft half's own get / graft / forward.
    """

    prefix_tokens: int
    suffix_tokens: int
    offset: int
    graft: Comparison  # a = fresh reference, b = graft
    oneshot: Comparison | None  # a = fresh reference, b = one-shot forward; information only
    artifact_id: str | None  # the artifact's id in the store (None without a store)
    timing_s: dict[str, float]
    reference_logits: torch.Tensor | None = field(default=None, repr=False, compare=False)
    graft_logits: torch.Tensor | None = field(default=None, repr=False, compare=False)

    @property
    def equal(self) -> bool:
        """The exactness verdict: graft and fresh reference logits have the same SHA-256."""
        return self.graft.sha256_equal

    @property
    def sha256_reference(self) -> str:
        return self.graft.sha256_a

    @property
    def sha256_graft(self) -> str:
        return self.graft.sha256_b

    @property
    def kl_max(self) -> float:
        return self.graft.kl_max

    @property
    def max_abs_diff(self) -> float:
        return self.graft.max_abs_diff

    @property
    def argmax_agreement(self) -> float:
        return self.graft.argmax_agreement

    def to_dict(self) -> dict:
        return {"prefix_tokens": self.prefix_tokens, "suffix_tokens": self.suffix_tokens, "offset": self.offset,
                "equal": self.equal, "graft": self.graft.to_dict(),
                "oneshot": None if self.oneshot is None else self.oneshot.to_dict(),
                "artifact_id": self.artifact_id, "timing_s": dict(self.timing_s)}


def check_graft(
    be: Backend,
    prefix_ids: list[int],
    suffix_ids: list[int],
    store: Store | None = None,
    *,
    snapshot: Snapshot | None = None,
    offset: int = 0,
    oneshot: bool = False,
    restore: Callable[[str], Restored] | None = None,
    tags: Iterable[str] = (),
    extra: dict | None = None,
    keep_logits: bool = False,
) -> GraftCheck:
    """Graft vs fresh reference for one (prefix, suffix): see the module docstring.

    store: put the deposit there and get it back by id (every byte re-hashed); without one the snapshot is
        grafted straight from memory.
    snapshot: an artifact of exactly `prefix_ids` made earlier (skips the deposit).
    offset: positions to move the artifact by (0 = own position, the exact case; > 0 re-rotates the keys).
    oneshot: also compare one forward over prefix+suffix with the reference (reported, not part of `equal`).
    restore: runs the graft half given the artifact id, e.g. in another process; needs a store.
    tags, extra: the store tags and the snapshot's `extra` metadata of the deposit.
    keep_logits: keep both logits tensors on the result (reference_logits, graft_logits).
    """
    prefix_ids, suffix_ids = list(prefix_ids), list(suffix_ids)
    be = _stepwise(be, max(offset, 0))
    if not prefix_ids or not suffix_ids:
        raise KVStoreError(f"check_graft needs a non-empty prefix and suffix (got {len(prefix_ids)} and "
                           f"{len(suffix_ids)} tokens)")
    if offset < 0:
        raise KVStoreError(f"check_graft: offset {offset} must be >= 0")
    if restore is not None and store is None:
        raise KVStoreError("check_graft(restore=...) needs a store: the restorer gets the artifact by its id")
    timing: dict[str, float] = {}
    t0 = time.perf_counter()
    if snapshot is None:
        state, _ = be.prefill(prefix_ids)  # the deposit: prefill from position 0, then capture
        snapshot = be.capture(state, prefix_ids, extra=extra)
        del state
        timing["deposit"] = time.perf_counter() - t0
    aid = None
    if store is not None:
        t0 = time.perf_counter()
        aid = store.put(snapshot, tags=tags)
        timing["put"] = time.perf_counter() - t0
        snapshot = None  # from here on the artifact exists only in the store

    t0 = time.perf_counter()
    reference = reference_logits(be, prefix_ids, suffix_ids, offset)
    timing["reference"] = time.perf_counter() - t0
    shot = None
    if oneshot:
        t0 = time.perf_counter()
        shot = compare_logits(reference, oneshot_logits(be, prefix_ids, suffix_ids))
        timing["oneshot"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    if restore is not None:
        restored = restore(aid)
    else:
        restored = graft_logits(be, prefix_ids, suffix_ids, snapshot, store=store, artifact_id=aid, offset=offset)
    timing["restore"] = time.perf_counter() - t0
    timing.update(restored.timing_s)
    return GraftCheck(
        prefix_tokens=len(prefix_ids), suffix_tokens=len(suffix_ids), offset=offset,
        graft=compare_logits(reference, restored.logits), oneshot=shot, artifact_id=aid, timing_s=timing,
        reference_logits=reference if keep_logits else None,
        graft_logits=restored.logits if keep_logits else None,
    )
