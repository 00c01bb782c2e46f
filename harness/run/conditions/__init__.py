"""Conditions: how a problem is put to the frozen model. A condition is one class (a subclass of `Baseline`, the
protocol) with a registry `name`, `uses_library` and, when it has settings of its own, a `Settings` dataclass
filled from its config's `condition.settings` (configs/condition/<name>.yaml). The registry `CONDITIONS` (config
name -> class) is every such class in this package: the three below and one module per further condition
(harness/run/conditions/<name>.py, found by importing the package's modules), so a new condition is its module, its
config and its test (docs/extending.md). `build_condition` makes one from the typed config pieces.

baseline   the model alone: prefill the query prompt, decode.
graft      retrieve a verified library entry, graft its artifact (read from the store, verified) at its own
           positions, prefill only the query prompt after it, decode with the same settings as baseline.
incontext  the control for graft: the same retrieval (same entry, same exclude_self), but the entry's tokens are
           computed fresh in the same pinned schedule as its deposit (the backend's `prefill`, the same
           determinism.prefill_chunk as a deposit), then the query. Its rows must be bit-identical to
           graft's (harness/compare/pairing.py checks that); it only costs the entry's prefill. With
           determinism.batch_invariant=true the whole context is prefilled as one prompt, as a baseline would.

Every model-shaped step (encode, prefill, graft, decode) goes through the backend (kvstore.engine.protocol.Backend):
a condition is given the backend load_model returns (transformers, llama.cpp, vLLM, the scripted fake of the unit
tests).

ttft_s of a row runs from the start of the problem (retrieval, artifact read and graft, or the entry's fresh
prefill) to its first token.

A condition is built once per run and turns (problem, samples) into `harness.record.rows.Completion`s. With
`decoding.batch_size` > 1 the samples of a problem decode together (`harness.run.decode.generate_batch`), in
chunks of batch_size rows: each chunk's context is prefilled (or grafted) once and shared by its rows.
With run.in_flight = N > 1 the jobs of up to N problems decode together (`complete_jobs`): each context is set
up and prefilled alone, then the rows of all of them share the engine's batch (harness.run.decode.generate_many).
Sample s samples with seed `decoding.seed + s` whatever the batch size; the batch size is still part of what a
run's bits depend on (harness.run.loop.comparable_key), since a batch need not give the bits of n single rows.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from harness.config.schema import DecodingConfig, LibraryConfig, PromptConfig
from harness.errors import ConfigError, LibraryError
from harness.library.build import Library, Match, open_library
from harness.record.rows import Completion, Group, Retrieval, group_for
from harness.run.decode import Generation, Job, Sampling, generate_batch, generate_many
from harness.task.chat import ChatFrame, encode_prompt, encode_query
from harness.task.problems import Problem
from harness.task.prompts import render
from kvstore import Backend, EnvironmentMismatchError, KVStoreError, Prefetcher, check_numerics


@dataclass
class Context:
    """What the model sees before decoding: the rendered prompt, every context token, and how the cache that
    holds a prefix of them is made (None: nothing cached, the whole context is prefilled)."""

    prompt: str
    context_ids: list[int]
    make_cache: Callable[[], Any] | None = None  # a fresh cache holding `grafted` (or fresh-computed) tokens
    grafted: int = 0  # tokens restored from an artifact (graft only)
    match: Match | None = None
    precomputed: int = 0  # tokens make_cache computes fresh (incontext: the entry), counted as prefill
    extra: dict[str, Any] | None = None  # the condition's own per-row values (Completion.extra)


def _completion(ctx: Context, gen: Generation, setup_s: float) -> Completion:
    m = ctx.match
    return Completion(
        prompt=ctx.prompt, context_ids=ctx.context_ids, text=gen.text, token_ids=gen.token_ids,
        stop_reason=gen.stop_reason, prefill_tokens=ctx.precomputed + gen.prefill_tokens,
        grafted_tokens=ctx.grafted,
        decode_tokens=gen.decode_tokens, first_logits_sha256=gen.first_logits_sha256,
        ttft_s=round(setup_s + gen.ttft_s, 6),
        seed=gen.seed, retrieval=Retrieval(m.entry.entry_id, m.entry.artifact_id, m.similarity, m.kind) if m else None,
        extra=ctx.extra,
    )


class Baseline:
    """The frozen model alone; the protocol every condition follows (module docstring). A subclass overrides
    `context` (what the model sees before decoding) and, if it reads ahead, `upcoming`/`close`."""

    name: ClassVar[str] = "baseline"
    uses_library: ClassVar[bool] = False  # True: opened with a Library, and its runs (and rows) have a Group
    Settings: ClassVar[type | None] = None  # a dataclass of the condition's own settings (condition.settings)

    def __init__(self, be: Backend, prompt: PromptConfig, decoding: DecodingConfig) -> None:
        self.prompt, self.decoding = prompt, decoding
        self.be: Backend = be
        self.settings: Any = None  # an instance of Settings, set by build_condition
        self.frame: ChatFrame | None = None  # the model's chat template around the prompt (model.chat), if any

    def describe(self) -> dict[str, Any]:
        settings = {} if self.settings is None else {"settings": dataclasses.asdict(self.settings)}
        chat = {} if self.frame is None else {"chat_frame": self.frame.describe()}
        return {"condition": self.name, **settings, **chat}

    @property
    def group(self) -> Group | None:
        """The run's group and each of its rows' (harness.record.rows.Group): None without a library."""
        return None

    def context(self, problem: Problem) -> Context:
        """The query prompt alone, prefilled whole."""
        prompt = query_prompt(self.prompt.template, problem)
        return Context(prompt, encode_prompt(self.be, self.frame, prompt))

    def complete_samples(
        self, problem: Problem, samples: Sequence[int], on_token: Callable[[int], None] | None = None
    ) -> list[Completion]:
        """Completions of `problem` for the given sample indices, decoded together (one shared context and
        cache); `complete` and the run loop call it with chunks of at most decoding.batch_size samples."""
        d = self.decoding
        t0 = time.perf_counter()
        ctx = self.context(problem)
        cache = ctx.make_cache() if ctx.make_cache is not None else None
        setup_s = time.perf_counter() - t0  # retrieval, artifact read + graft (or fresh prefix): part of the TTFT
        sampling = Sampling(d.max_new_tokens, tuple(self.prompt.stop), str(d.strategy), d.temperature, d.top_p)
        gens = generate_batch(self.be, ctx.context_ids, len(samples), [d.seed + s for s in samples], sampling,
                              cache=cache, on_token=on_token)
        return [_completion(ctx, g, setup_s) for g in gens]

    def complete_jobs(
        self, jobs: Sequence[tuple[Problem, Sequence[int]]], on_token: Callable[[int], None] | None = None
    ) -> list[list[Completion]]:
        """The completions of several (problem, samples) jobs decoded together (problems in flight, run.in_flight):
        each job's context set up as `complete_samples` does it, then every row of every job in one batch
        (`harness.run.decode.generate_many`); the TTFT of a row runs from its own job's start."""
        d = self.decoding
        sampling = Sampling(d.max_new_tokens, tuple(self.prompt.stop), str(d.strategy), d.temperature, d.top_p)
        prepared = []
        for problem, samples in jobs:
            t0 = time.perf_counter()
            ctx = self.context(problem)
            cache = ctx.make_cache() if ctx.make_cache is not None else None
            setup_s = time.perf_counter() - t0
            prepared.append((ctx, setup_s, Job(ctx.context_ids, [d.seed + s for s in samples], cache,
                                               time.perf_counter())))
        gens = generate_many(self.be, [job for _, _, job in prepared], sampling, on_token=on_token)
        return [[_completion(ctx, g, setup_s) for g in gs] for (ctx, setup_s, _), gs in zip(prepared, gens,
                                                                                           strict=True)]

    def complete(self, problem: Problem, sample: int) -> Completion:
        """One sample of `problem` (batch size 1)."""
        return self.complete_samples(problem, [sample])[0]

    def upcoming(self, problem: Problem) -> None:
        """`problem` comes next: a condition may start reading what it will need (the baseline needs nothing)."""

    def close(self) -> None:
        """Release background resources (none for the baseline)."""


class Graft(Baseline):
    """A verified library entry grafted at its own positions before the query prompt."""

    name: ClassVar[str] = "graft"
    uses_library: ClassVar[bool] = True

    def __init__(self, be: Backend, prompt: PromptConfig, decoding: DecodingConfig, library: Library,
                 prefetch_bytes: int = 0) -> None:
        super().__init__(be, prompt, decoding)
        self.library = library
        # the next problem's artifact is read + verified in the background while the current one decodes
        self.prefetch = Prefetcher(library.store, prefetch_bytes) if prefetch_bytes > 0 else None
        self._ahead: dict[str, Match | None] = {}  # problem id -> its retrieval, done once when it was announced

    @property
    def group(self) -> Group | None:
        return group_for(self.library.exclude_self)

    def upcoming(self, problem: Problem) -> None:
        if self.prefetch is None:
            return
        match = self._ahead[problem.id] = self.library.retrieve(problem)
        if match is not None:
            self.prefetch.schedule([match.entry.artifact_id])

    def close(self) -> None:
        if self.prefetch is not None:
            self.prefetch.close()

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "library": self.library.describe()}

    def _entry(self, problem: Problem):
        """(rendered prompt, match, the entry's snapshot) or None when retrieval found nothing."""
        # exclude_self and retrieval were fixed when the library was opened; announced problems were retrieved then
        ahead = self._ahead.pop(problem.id) if problem.id in self._ahead else None
        read = self.prefetch.get if self.prefetch is not None else None
        found = retrieve_entry(self.library, problem, read=read, match=ahead)
        if found is None:
            return None
        return query_prompt(self.prompt.template, problem), *found

    def context(self, problem: Problem) -> Context:
        found = self._entry(problem)
        if found is None:  # nothing to graft: the query alone, recorded as such
            return super().context(problem)
        prompt, match, snapshot = found
        try:  # the numerics fingerprint it was deposited under (a store tag) must be recorded and be this process's
            try:
                tags = self.library.store.info(match.entry.artifact_id).tags
            except KVStoreError:
                tags = None  # no readable record: refused (absent evidence is not evidence; issue 51)
            check_numerics(tags, self.be,
                           f"library entry {match.entry.entry_id}",
                           allow_environment_mismatch=self.be.allows_environment_mismatch(),
                           source=f"store {getattr(self.library.store, 'root', self.library.store)!s}")
        except EnvironmentMismatchError as exc:
            raise LibraryError(f"{exc}. For a library: `python -m harness.library --redeposit` re-deposits its entries "
                               "here") from None
        context = graft_context(self.be, self.frame, snapshot, prompt)
        # checks backend, model, tokenizer, layout and the token prefix; a fresh state per chunk of rows
        return Context(prompt, context, lambda: graft_entry(self.be, snapshot, context), snapshot.token_count,
                       match)


def retrieve_entry(library: Library, problem: Problem, read: Callable[[str], Any] | None = None,
                   match: Match | None = None) -> tuple[Match, Any] | None:
    """The library entry the graft condition (and its in-context control) uses for `problem`, with the entry's
    artifact: `library.retrieve` (its exclude_self and retrieval fixed when it was opened; `match` when it was
    retrieved ahead), the artifact read through `read` (default: the library's store.get; its bytes hashed to its
    id) and checked to hold the entry's own tokens. None when retrieval finds nothing. The one retrieval owner: the
    conditions here and the library-aware server (harness.serve) call it."""
    match = match if match is not None else library.retrieve(problem)
    if match is None:
        return None
    aid = match.entry.artifact_id  # verified on read (the prefetcher reads through the same store.get)
    snapshot = (read or library.store.get)(aid)
    library.check_artifact(match.entry, snapshot)  # the entry's own tokens, whatever the store says
    return match, snapshot


def query_prompt(template: str, problem: Problem) -> str:
    """The query prompt every condition puts to the model for `problem` (prompt.template rendered)."""
    return render(template, problem=problem.problem)


def graft_context(be: Any, frame: ChatFrame | None, snapshot: Any, prompt: str) -> list[int]:
    """The context of a library condition: the entry's tokens (the artifact's: exactly the ids it was deposited
    from) and then the query prompt's. The entry ends in a blank line (and, with a chat template, opens the user turn
    the query closes). The one prompt composer: the conditions here and harness.serve call it."""
    return list(snapshot.token_ids) + encode_query(be, frame, prompt)


def graft_entry(be: Backend, snapshot, context: list[int]):
    """`backend.graft(snapshot, context)`; an artifact refused for its compute environment is re-raised with what
    fixes it in the harness's terms (kvstore names its own parameters, the harness its commands and config keys)."""
    try:
        return be.graft(snapshot, token_ids=context)
    except EnvironmentMismatchError as exc:
        raise LibraryError(f"{exc}. For a library: `python -m harness.library --redeposit` re-deposits its entries "
                           "here, or determinism.allow_environment_mismatch=true grafts them anyway and marks the run "
                           "not guaranteed exact") from None


class InContext(Graft):
    """The graft's control: the same entry's tokens computed fresh (deposit schedule), then the query."""

    name: ClassVar[str] = "incontext"

    def context(self, problem: Problem) -> Context:
        found = self._entry(problem)
        if found is None:
            return Baseline.context(self, problem)
        prompt, match, snapshot = found
        entry_ids = list(snapshot.token_ids)  # the very ids the artifact was deposited from
        context = graft_context(self.be, self.frame, snapshot, prompt)
        if self.be.batch_invariant():
            # determinism.batch_invariant: no schedule changes a bit, so the control is the fresh computation a
            # baseline makes: the whole context (entry + query) prefilled as one prompt, in the run's schedule
            # (one pass when determinism.prefill_chunk covers it)
            return Context(prompt, context, None, 0, match)
        # the backend's `prefill` from position 0 in its pinned schedule: the deposit's schedule exactly, so the
        # state holds the bits the artifact holds, computed now instead of read.
        return Context(prompt, context, lambda: self.be.prefill(entry_ids)[0], 0, match, len(entry_ids))


def _registry() -> dict[str, type[Baseline]]:
    """Every condition class of this package by name: this module's and each submodule's (imported here)."""
    for mod in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{mod.name}")
    found: dict[str, type[Baseline]] = {}
    todo: list[type[Baseline]] = [Baseline]
    while todo:
        cls = todo.pop(0)
        todo += cls.__subclasses__()
        if "name" not in vars(cls):  # a helper subclass that names no condition of its own
            continue
        if cls.name in found and found[cls.name] is not cls:
            raise ConfigError(f"two conditions are named {cls.name!r} ({found[cls.name].__module__}, "
                              f"{cls.__module__}); rename one (its `name` and configs/condition/<name>.yaml)")
        found[cls.name] = cls
    return found


def condition_class(name: str) -> type[Baseline]:
    """The registered class for a config's `condition.name`; a ConfigError naming the choices otherwise."""
    try:
        return CONDITIONS[name]
    except KeyError:
        raise ConfigError(f"condition={name!r} is not one of {sorted(CONDITIONS)} (configs/condition/)") from None


def condition_settings(cls: type[Baseline], settings: Mapping[str, Any] | None) -> Any:
    """`cls.Settings` filled from `condition.settings`; a ConfigError naming the unknown or missing key and the
    allowed ones. None for a condition without settings (and settings must then be empty)."""
    given = dict(settings or {})
    if cls.Settings is None:
        if given:
            raise ConfigError(f"condition.settings: {cls.name} takes no settings, got {sorted(given)}; remove them")
        return None
    allowed = [f.name for f in dataclasses.fields(cls.Settings)]
    unknown = sorted(set(given) - set(allowed))
    if unknown:
        raise ConfigError(f"condition.settings.{unknown[0]}: not a setting of {cls.name}; allowed: {allowed} "
                          f"(configs/condition/{cls.name}.yaml)")
    try:
        return cls.Settings(**given)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"condition.settings of {cls.name}: {exc} (configs/condition/{cls.name}.yaml)") from None


def build_condition(
    name: str,
    be: Backend,
    prompt: PromptConfig,
    decoding: DecodingConfig,
    library: LibraryConfig,
    project_root: Path,
    build_library_if_missing: bool = False,
    settings: Mapping[str, Any] | None = None,
    chat: ChatFrame | None = None,
) -> Baseline:
    """The condition `name`, built once from the typed config pieces and its own `settings` (condition.settings);
    its library opened if it uses one."""
    cls = condition_class(name)
    own = condition_settings(cls, settings)
    if not cls.uses_library:
        cond = cls(be, prompt, decoding)
    else:
        lib = open_library(library, be, project_root, build_if_missing=build_library_if_missing, chat=chat)
        cond = cls(be, prompt, decoding, lib, prefetch_bytes=max(0, int(library.prefetch_mb)) << 20)
    cond.settings = own
    cond.frame = chat
    return cond


CONDITIONS: dict[str, type[Baseline]] = _registry()
