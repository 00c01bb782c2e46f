"""The one graft admission: before a byte of an artifact reaches any engine, compare every fact it recorded with the
backend that would take it, and refuse the first difference in one line naming it (kvstore/FORMAT.md section 5).

    admit(snapshot, be, token_ids)          # raises IncompatibleError, or returns and the backend restores
    admission_differences(snapshot, facts)  # the same checks as a list (vLLM's connector logs them all)

In order: the backend that made it, the model fingerprint, the tokenizer fingerprint, the dtype, the layer layout
(only where the Facts carry one: vLLM's connector), the pinned settings
(`settings_differences`: every field the backend's `settings()` and the artifact's `determinism` hold), the compute
environment (its opt-out: `allow_environment_mismatch`, which warns and marks the graft not guaranteed exact), the
numerics evidence (`numerics_evidence_problem`: the record a store read or a capture attached to the snapshot must be
exactly this engine's measured fingerprint; absent evidence is not evidence, issue 51; same opt-out), the
format's own invariants, the vocabulary, and the token prefix. Every backend calls this from its `graft` and then
runs only what is its own: its layout check (layers, shapes, context size) and the restore.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

from kvstore.engine.protocol import Backend, artifact_backend
from kvstore.environment import (
    KERNEL_RECORD,
    both_invariant,
    environment_differences,
    numerics_differences,
    numerics_of_tags,
    recorded_kernel,
)
from kvstore.errors import EnvironmentMismatchError, IncompatibleError, KVStoreError, ValidationError
from kvstore.format.artifact import NumericsRecord, Snapshot, check_snapshot

#: Settings added to the format after artifacts had been written, with the value every earlier artifact ran under:
#: an artifact that does not record one is compared as if it had recorded this value (when the backend has it).
RECORDED_DEFAULTS: dict[str, Any] = {"profile": "native"}


def settings_differences(recorded: Any, current: dict[str, Any]) -> list[str]:
    """Each pinned setting that differs between an artifact's `determinism` and a backend's `settings()`, as
    "determinism.<field>: artifact X, this process Y" (empty when all agree). Types count: a recorded 1 is not the
    setting True. Where both are the batch-invariant mode, the versions of its kernel too (`recorded_kernel`: a
    record without one ran UNVERSIONED_KERNEL), so an artifact of another kernel is refused, never assumed. The one
    rule every backend's admission uses."""
    rec = dict(recorded) if isinstance(recorded, dict) else {}
    for key, value in RECORDED_DEFAULTS.items():
        if key in current:
            rec.setdefault(key, value)
    out = []
    kernels = recorded_kernel(rec), recorded_kernel(current)
    if None not in kernels and kernels[0] != kernels[1]:
        out.append(f"determinism.{KERNEL_RECORD}: artifact {kernels[0]!r}, this process {kernels[1]!r} (another "
                   "version of the mode's kernel computes other bits)")
    for key in sorted((set(rec) | set(current)) - {KERNEL_RECORD}):
        a, b = rec.get(key, "<not recorded>"), current.get(key, "<not set>")
        if a != b or type(a) is not type(b):
            out.append(f"determinism.{key}: artifact {a!r}, this process {b!r}")
    return out


def artifact_differences(snapshot: Snapshot, be: Backend) -> list[str]:
    """Every recorded setting and environment fact that differs, named (settings first)."""
    env = snapshot.environment if isinstance(snapshot.environment, dict) else {}
    settings = be.settings()
    return settings_differences(snapshot.determinism, settings) + environment_differences(
        env, be.environment(), both_invariant(snapshot.determinism, settings, measured_numerics(
            snapshot.numerics, be.numerics(), be.former_numerics())))


def measured_numerics(record: NumericsRecord | None, current: str | None,
                      former: tuple[str, ...] = ()) -> tuple[str | None, str | None]:
    """(the record's numerics fingerprint, this engine's) as `both_invariant` takes them: the record's one
    fingerprint (one of this engine's former ones counts as its current one, as admission reads it), or None where
    there is no single readable record; None for an engine that measures none."""
    if current is None or record is None or record.error is not None or len(record.fingerprints) != 1:
        return None, current
    fp = record.fingerprints[0]
    return (current if fp in former else fp), current



@dataclass(frozen=True)
class Facts:
    """What admission compares an artifact with: a backend's recorded facts (`Facts.of(backend)`), or an engine's
    own when it admits in another process (vLLM's connector). `layout` (per layer {"kind", "window"}) is compared
    only when given; a backend's `graft` checks its own layout after admission. vocab_size 0: not compared."""

    backend: str
    model_name: str
    fingerprint: str
    tokenizer_fingerprint: str
    dtype: str
    settings: dict[str, Any]
    environment: dict[str, Any]
    vocab_size: int = 0
    layout: list[dict[str, Any]] | None = None
    numerics: str | None = None  # the engine's measured numerics fingerprint; None: it measures none
    former_numerics: tuple[str, ...] = ()  # its fingerprints under earlier battery formats (Backend.former_numerics)

    @classmethod
    def of(cls, be: Backend) -> Facts:
        return cls(be.name, be.model_name, be.fingerprint, be.tokenizer_fingerprint,
                   be.dtype, be.settings(), be.environment(), be.vocab_size(),
                   numerics=be.numerics(), former_numerics=be.former_numerics())


@dataclass(frozen=True)
class Difference:
    """One recorded fact of an artifact that differs from the engine that would take it: `fact` ("backend", "model",
    "tokenizer", "dtype", "layout", "settings", "environment", "numerics", "format", "vocabulary", "tokens") and the
    one line that names it and what to do."""

    fact: str
    message: str

    def error(self) -> KVStoreError:
        """The refusal `admit` raises for it (EnvironmentMismatchError for the environment and the numerics, the
        facts with an opt-out; IncompatibleError for every other fact)."""
        return (EnvironmentMismatchError if self.fact in ("environment", "numerics") else IncompatibleError)(
            self.message)


def admission_differences(snapshot: Snapshot, be: Backend | Facts,
                          token_ids: list[int] | None = None) -> list[Difference]:
    """Every reason `snapshot` may not graft into `be` (a Backend, or the Facts of an engine), in the order of the
    module docstring; empty = admitted. `admit` raises the first. A snapshot made by another backend is only that
    difference; the format's invariants, the vocabulary and the token prefix are checked once every recorded fact
    agrees (a snapshot that breaks the format ends the list: nothing after it can be read safely)."""
    me = be if isinstance(be, Facts) else Facts.of(be)
    name = snapshot.model_name or "artifact"
    made_by = artifact_backend(snapshot)
    if made_by != me.backend:
        return [Difference("backend", (
            f"{name}: deposited by the {made_by} backend, this is the {me.backend} backend; an artifact grafts only "
            f"into the engine that made it: deposit it again with {me.backend} or load the model with the "
            f"{made_by} backend"))]
    out = []
    if snapshot.model_fingerprint != me.fingerprint:
        out.append(Difference("model", (
            f"{name}: model fingerprint {snapshot.model_fingerprint[:12]} differs from the loaded model's "
            f"{me.fingerprint[:12]} ({me.model_name}); deposit it again with this model")))
    if snapshot.tokenizer_fingerprint != me.tokenizer_fingerprint:
        out.append(Difference("tokenizer", (
            f"{name}: tokenizer fingerprint {snapshot.tokenizer_fingerprint[:12]} differs from the loaded "
            f"tokenizer's {me.tokenizer_fingerprint[:12]}; deposit it again with this tokenizer")))
    if snapshot.dtype != me.dtype:
        out.append(Difference("dtype", (
            f"{name}: artifact dtype {snapshot.dtype} differs from the model's {me.dtype}; load the model with "
            f"dtype={snapshot.dtype} or deposit the artifact again")))
    if me.layout is not None and snapshot.layout != me.layout:
        first = next((i for i, (a, b) in enumerate(zip(snapshot.layout, me.layout)) if a != b),
                     min(len(snapshot.layout), len(me.layout)))
        got = snapshot.layout[first] if first < len(snapshot.layout) else "<none>"
        want = me.layout[first] if first < len(me.layout) else "<none>"
        out.append(Difference("layout", (
            f"{name}: layout: {len(snapshot.layout)} layers vs {len(me.layout)}, first difference at layer {first}: "
            f"artifact {got}, this engine {want}; deposit it again with this model")))
    settings = settings_differences(snapshot.determinism, me.settings)
    if settings:
        out.append(Difference("settings", (
            f"{name}: the artifact was computed under other settings than this process uses, so a graft would not "
            f"be byte-identical to the fresh reference: {'; '.join(settings)}. Load the model with the artifact's "
            "settings or deposit the artifact again under the current ones")))
    env = environment_differences(snapshot.environment if isinstance(snapshot.environment, dict) else {},
                                  me.environment, both_invariant(snapshot.determinism, me.settings, measured_numerics(
                                      snapshot.numerics, me.numerics, me.former_numerics)))
    if env:
        out.append(Difference("environment", (
            f"{name}: the artifact was deposited in another compute environment, so a graft would not be "
            f"guaranteed byte-identical to the fresh reference: {'; '.join(env)}. Deposit it again here, or run "
            "where it was deposited, or graft anyway with allow_environment_mismatch=True, which marks the graft "
            "not guaranteed exact")))
    numerics = numerics_evidence_problem(snapshot.numerics, me.numerics, name, me.former_numerics)
    if numerics:
        out.append(Difference("numerics", numerics))
    if out:  # the format, the vocabulary and the tokens are read once every recorded fact agrees
        return out
    try:
        check_snapshot(snapshot)
    except ValidationError as e:  # a snapshot that breaks the format cannot match any model
        return [Difference("format", f"{e} (refused at graft, before any tensor reached the model)")]
    if me.vocab_size and snapshot.token_ids and max(snapshot.token_ids) >= me.vocab_size:
        out.append(Difference("vocabulary", (
            f"{name}: token id {max(snapshot.token_ids)} is outside the model's vocabulary [0, {me.vocab_size}); "
            "deposit it again with this model's tokenizer")))
    if token_ids is not None:
        n = snapshot.token_count
        if list(token_ids[:n]) != list(snapshot.token_ids):
            first = next((i for i, (a, b) in enumerate(zip(token_ids, snapshot.token_ids)) if a != b),
                         min(len(token_ids), n))
            out.append(Difference("tokens", (
                f"{name}: the context's token ids do not begin with the artifact's {n} tokens (first difference at "
                f"index {first}); graft only onto text that starts with the artifact's text")))
    return out


def admit(snapshot: Snapshot, be: Backend, token_ids: list[int] | None = None, *,
          allow_environment_mismatch: bool = False) -> None:
    """Raise the first of `admission_differences(snapshot, backend, token_ids)` (an IncompatibleError naming it; the
    compute environment an EnvironmentMismatchError); return when the artifact may be restored into it. With
    `allow_environment_mismatch` an environment difference is a RuntimeWarning instead (not guaranteed exact)."""
    for d in admission_differences(snapshot, be, token_ids):
        if d.fact == "environment" and allow_environment_mismatch:
            env = environment_differences(snapshot.environment if isinstance(snapshot.environment, dict) else {},
                                          be.environment(), both_invariant(
                                              snapshot.determinism, be.settings(), measured_numerics(
                                                  snapshot.numerics, be.numerics(), be.former_numerics())))
            warnings.warn(f"{snapshot.model_name or 'artifact'}: grafted across compute environments (not guaranteed "
                          f"exact): {'; '.join(env)}", RuntimeWarning, stacklevel=2)
            continue
        if d.fact == "numerics" and allow_environment_mismatch:
            warnings.warn(f"grafted without matching numerics evidence (not guaranteed exact): {d.message}",
                          RuntimeWarning, stacklevel=2)
            continue
        raise d.error()


def numerics_evidence_problem(record: NumericsRecord | None, current: str | None, name: str = "artifact",
                              former: tuple[str, ...] = ()) -> str:
    """Why the numerics evidence of an artifact does not show it was computed under this engine's numerics
    fingerprint `current` ("" when it does). The rule (docs/reliability.md, issue 51): absent evidence is not
    evidence. An engine that measures a fingerprint admits an artifact only when exactly one is recorded for it and
    that one is its own; no record, a record that could not be read, or several (a forged one beside the real
    one reads the same as two machines' claims) are refused, each naming what to do. An engine that measures none
    (llama.cpp, vLLM, fake: their evidence is the environment record in the artifact's bytes) refuses an artifact
    whose record names a fingerprint it cannot confirm. `former`: this engine's fingerprints under earlier formats of
    its battery (`Backend.former_numerics`); a record of one of them is this machine's too, as when it was recorded."""
    fix = ("re-verify it by reproduction on this machine (`kvstore reverify ID`, or rebuild the library with "
           "`python -m harness.library`: each recomputes the prefix, compares the bytes and records what it "
           "measured) or deposit it again here")
    if current is None:
        if record is not None and record.fingerprints:
            return (f"{name}: its numerics record names fingerprint {record.fingerprints[0][:16]} ({record.source}), "
                    "and this engine measures none, so it cannot confirm it; graft it with the backend that "
                    "deposited it")
        return ""
    if record is None:
        return (f"{name}: no numerics record (the snapshot was not read from a store and not captured by this "
                f"process), so nothing shows it was computed under this machine's numerics {current[:16]}; read it "
                f"with store.get, which attaches the store's record, or {fix}")
    if record.error is not None:
        return (f"{name}: its numerics record in {record.source} could not be read ({record.error}); refused, as "
                f"for no record: fix the index (`kvstore gc`), then run again, or {fix}")
    fps = list(dict.fromkeys(record.fingerprints))
    if not fps:
        return (f"{name}: no numerics record in {record.source} (deposited before the record existed, by `kvstore "
                "deposit` of an older kvgraft, copied by a path that dropped it, or stripped), so nothing shows it "
                f"was computed under this machine's numerics {current[:16]}; {fix}")
    if len(fps) > 1:
        return (f"{name}: its numerics record in {record.source} names {len(fps)} fingerprints "
                f"({', '.join(f[:16] for f in fps)}); an artifact is computed under one, so the record is forged or "
                f"damaged and proves nothing: {fix}")
    diffs = [] if fps[0] in former else numerics_differences(fps, current)
    if diffs:
        return (f"{name}: the artifact was deposited on a machine whose kernels compute other bits, so a graft would "
                f"not be byte-identical to the fresh reference here: {diffs[0]}. Deposit it again on this machine, "
                f"or {fix}, or graft anyway with allow_environment_mismatch=True, which marks the graft not "
                "guaranteed exact")
    return ""


def check_numerics(tags: Any, be: Backend, name: str = "artifact", *,
                   allow_environment_mismatch: bool = False, source: str = "the store") -> None:
    """Refuse (EnvironmentMismatchError, one line) an artifact whose store tags (`numerics:<sha256>`) do not show it
    was computed under this backend's numerics fingerprint: `numerics_evidence_problem` of the record they make.
    No tag, several tags, or another machine's tag are each refused (absent evidence is not evidence; issue 51).
    `tags` None: the lookup of the record failed, refused too. With `allow_environment_mismatch` it warns instead.

    The fingerprint is kept beside the artifact (a store tag), not in its bytes, so artifact ids, library
    identities and resume keys of the default path do not move (kvstore/FORMAT.md section 8)."""
    record = (NumericsRecord((), source, "the lookup failed") if tags is None else
              NumericsRecord(tuple(numerics_of_tags(tags)), source))
    problem = numerics_evidence_problem(record, be.numerics(), name, be.former_numerics())
    if not problem:
        return
    if not allow_environment_mismatch:
        raise EnvironmentMismatchError(problem)
    warnings.warn(f"grafted without matching numerics evidence (not guaranteed exact): {problem}", RuntimeWarning,
                  stacklevel=2)
