"""Decoding on a frozen model: prefill what the cache has not seen, then greedy or seeded sampling up to a
token budget, each sequence stopping at EOS, a stop string or its budget.

`generate` continues one sequence; `generate_batch` continues one shared context `n` times (n samples of a
problem): the context is prefilled (or grafted) once, its cache is expanded to the batch, the rows decode
together and a finished row leaves the batch (its cache rows are dropped), so it stops costing compute.
The prefix a cache already holds (a graft) is not recomputed: `prefill_tokens` counts only what was.

    from harness.run.decode import generate, generate_batch
    g = generate(be, be.encode("Problem: ..."), max_new_tokens=64, stop=["\\n\\n"])
    gs = generate_batch(be, ids, 8, range(8), Sampling(64, strategy="sample"))

`be` is a kvstore backend (kvstore.Backend: transformers, llama.cpp, vLLM, the scripted fake); every model-shaped
step goes through the backend's verbs, and the path is chosen by what the backend can do: an engine that decodes
whole rows itself (kvstore.InEngineDecoding: vLLM) is handed the continuation; a step-wise one (kvstore.Stepwise)
is driven token by token here, several rows together only when it has kvstore.BatchedRows. What a run asks of its
backend (rows of a problem together, problems in flight) is refused once, when its config is composed
(harness.config.schema.check_capabilities, asked of the registry's class); a direct caller's by the same function.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from harness.config.schema import check_capabilities
from harness.errors import ConfigError, HarnessError
from kvstore import (
    Backend,
    Continuation,
    InEngineBatches,
    InEngineDecoding,
    RowsRequest,
    Stepwise,
    logits_sha256,
)

StopReason = Literal["eos", "stop", "length"]
STOP_REASONS: tuple[str, ...] = ("eos", "stop", "length")


@dataclass
class Generation:
    """One decoded sequence.

    stop_reason: "eos" (the model chose an end-of-sequence token), "stop" (a stop string appeared) or
    "length" (the token budget ran out).
    first_logits_sha256: `kvstore.logits_sha256` of the logits that produced the first generated token, so two
    computations of the same context (a graft and its in-context twin) can be compared without the model.
    ttft_s: seconds from the call until the first token was chosen, prefill (or the given cache) included.
    """

    token_ids: list[int]  # generated tokens, up to and including a stop, excluding EOS
    text: str  # decoded text, cut before the first stop string
    prefill_tokens: int
    decode_tokens: int  # tokens chosen (= token_ids plus a final EOS)
    stop_reason: StopReason
    first_logits_sha256: str
    ttft_s: float
    seed: int | None = None  # the sampling seed (None for greedy)


def _pick_rows(
    logits: torch.Tensor, strategy: str, temperature: float, top_p: float, gens: Sequence[torch.Generator | None]
) -> list[int]:
    """The next token of every row of `logits` (rows, vocab); row r samples with `gens[r]`.

    Sampling draws from the nucleus's candidates only (`_nucleus_candidates`, in vocabulary order), not from
    a vocabulary-sized vector: torch.multinomial draws one exponential per category, so a 262,144-entry
    draw costs more than the rest of a row's sampling. Same distribution; one softmax for all rows.
    """
    if strategy == "greedy":
        return [int(t) for t in torch.argmax(logits, dim=-1)]
    probs = fixed_order_softmax(logits, temperature)
    picks = []
    for r in range(probs.shape[0]):
        if top_p < 1.0:
            vals, ids = _nucleus_candidates(probs[r], top_p)
        else:
            vals, ids = probs[r], None
        j = int(torch.multinomial(vals, 1, generator=gens[r]))
        picks.append(j if ids is None else int(ids[j]))
    return picks


_LN2_HI, _LN2_LO = 6.93147180369123816490e-01, 1.90821492927058770002e-10  # fdlibm's split of ln 2
_INV_LN2 = 1.44269504088896338700e00
# exp(r) on |r| <= ln2/2 as Taylor terms 1/k!, k = 0..17: Horner's rule (below 2^-53 relative after the 17th term)
_EXP_TERMS = tuple(1.0 / math.factorial(k) for k in range(18))


def _fixed_exp(x: torch.Tensor) -> torch.Tensor:
    """exp of float64 `x` (<= 0) from IEEE elementwise operations only (each correctly rounded, so the same bits
    whatever vector width ATen's build uses): range reduction by ln 2, a fixed polynomial, and the power of two built
    from its exponent bits. Below -708 (a probability under 1e-307 of the largest) it is 0."""
    k = torch.round(x * _INV_LN2)
    r = (x - k * _LN2_HI) - k * _LN2_LO
    p = torch.full_like(r, _EXP_TERMS[-1])
    for c in reversed(_EXP_TERMS[:-1]):
        p = p * r + c
    kk = k.clamp(min=-1022).to(torch.int64)
    two_k = ((kk + 1023) << 52).view(torch.float64)
    return torch.where(x < -708.0, torch.zeros_like(p), p * two_k)


def _fixed_sum(x: torch.Tensor) -> torch.Tensor:
    """The sum over the last dim of `x` in one fixed pairwise order (zero-padded to a power of two, then halves
    added elementwise): the same bits whatever ATen's vectorised reductions would do. Shape (rows, 1)."""
    n = x.shape[-1]
    width = 1 << max(n - 1, 0).bit_length()
    y = torch.nn.functional.pad(x, (0, width - n))
    while y.shape[-1] > 1:
        half = y.shape[-1] // 2
        y = y[..., :half] + y[..., half:]
    return y


def fixed_order_softmax(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(logits / temperature) in float64, rows of `logits` (rows, vocab), computed from correctly rounded
    elementwise operations in a fixed order (`_fixed_exp`, `_fixed_sum`), so that a sampled run draws the same tokens
    under ATen's AVX2 and AVX-512 builds (issue 61; torch.softmax's vectorised exp and sum give other last bits per
    build). Equal to torch.softmax within a few ulp."""
    z = logits.double() / max(temperature, 1e-6)
    z = z - z.max(dim=-1, keepdim=True).values  # exact: the max, then one rounding per element
    e = _fixed_exp(z)
    return e / _fixed_sum(e)


def _pick(
    logits: torch.Tensor, strategy: str, temperature: float, top_p: float, generator: torch.Generator | None
) -> int:
    """The next token from one row of logits (vocab,): `_pick_rows` on a batch of one."""
    return _pick_rows(logits[None], strategy, temperature, top_p, [generator])[0]


def _nucleus_by_sort(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """`probs` with everything outside the top-p nucleus set to 0: the definition (a full sort of the vocab)."""
    sorted_p, idx = torch.sort(probs, descending=True)
    keep = torch.cumsum(sorted_p, -1) - sorted_p < top_p
    return torch.zeros_like(probs).scatter(-1, idx[keep], sorted_p[keep])


def _nucleus_candidates(probs: torch.Tensor, top_p: float, candidates: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-p nucleus of one row as (probabilities, token ids) in increasing token id: exactly the nonzero
    entries of `_nucleus_by_sort`, bit for bit, found from the top `candidates` probabilities only.

    Sorting 262,144 probabilities costs more than a decode step's sampling otherwise does. The sorted
    prefix holds the same values whichever way it is found, and CPU cumsum is a sequential scan, so the keep
    test over the prefix gives the same booleans. The shortcut is taken only when it is unambiguous: the
    candidates' mass reaches past top_p (no later position can be kept), the kept positions are a prefix,
    and the last kept value is strictly above the next one (no tie whose order a sort would decide).
    Otherwise it falls back to the full sort. Both paths give the candidates in token-id order, so the draw
    made from them does not depend on which path found them.
    """
    k_cand = min(candidates, probs.shape[-1])
    top, idx = torch.topk(probs, k_cand)  # (k_cand,) descending
    cum = torch.cumsum(top, -1)
    keep = cum - top < top_p
    k = int(keep.sum())
    if (
        k < k_cand
        and float(cum[-1]) >= top_p + 1e-9
        and bool(keep[:k].all())
        and float(top[k - 1]) > float(top[k])
    ):
        ids, order = torch.sort(idx[:k])
        return top[:k][order], ids
    full = _nucleus_by_sort(probs, top_p)
    ids = torch.nonzero(full).flatten()
    return full[ids], ids


def _nucleus(probs: torch.Tensor, top_p: float, candidates: int = 1024) -> torch.Tensor:
    """`probs` with everything outside the nucleus set to 0, from `_nucleus_candidates` (= `_nucleus_by_sort`)."""
    vals, ids = _nucleus_candidates(probs, top_p, candidates)
    return torch.zeros_like(probs).scatter(-1, ids, vals)


@dataclass(frozen=True)
class Sampling:
    """How a continuation is chosen, one value for every decode (the run's decoding.* settings and prompt.stop):
    a token budget, the stop strings, greedy or seeded sampling at a temperature within the top-p nucleus."""

    max_new_tokens: int
    stop: tuple[str, ...] = ()
    strategy: str = "greedy"
    temperature: float = 0.7
    top_p: float = 0.95

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop", tuple(self.stop))
        if self.strategy not in ("greedy", "sample"):
            raise ConfigError(f"decoding.strategy={self.strategy!r}: use 'greedy' or 'sample'")
        if self.max_new_tokens < 1:
            raise ConfigError(f"decoding.max_new_tokens={self.max_new_tokens}: use a budget of at least 1 token")


def generate(
    be: Backend,
    prompt_ids: list[int],
    *,
    max_new_tokens: int,
    stop: Sequence[str] = (),
    strategy: str = "greedy",
    temperature: float = 0.7,
    top_p: float = 0.95,
    seed: int | None = None,
    cache=None,
    on_token: Callable[[int], None] | None = None,
    eos: set[int] | None = None,
) -> Generation:
    """Continue `prompt_ids` once (a Sampling from the keywords; `generate_batch` with one row). `cache` may already
    hold a prefix of them (a graft); the rest is prefilled.

    on_token: called after every decode step with the number of tokens chosen in it (progress in tokens).
    eos: the token ids that end a sequence (default `eos_ids(be)`; an empty set runs every budget out).
    """
    sampling = Sampling(max_new_tokens, tuple(stop), strategy, temperature, top_p)
    return generate_batch(be, prompt_ids, 1, [int(seed or 0)], sampling, cache=cache, on_token=on_token, eos=eos)[0]


def generate_batch(
    be: Backend,
    prompt_ids: list[int],
    n: int,
    seeds: Sequence[int] | None,
    sampling: Sampling,
    *,
    cache=None,
    on_token: Callable[[int], None] | None = None,
    eos: set[int] | None = None,
) -> list[Generation]:
    """Continue `prompt_ids` `n` times, the rows decoded together; row i samples with its own `seeds[i]`.

    The shared context is prefilled once (or taken from `cache`, e.g. a graft); the first token of every row
    is chosen from those logits, then the cache is repeated to the rows still running and each step feeds
    one token per running row. A row that hits EOS, a stop string or its budget leaves the batch.

    Reproducibility: the same inputs, seeds and `n` give identical outputs. With n=1 this is `generate`.
    A batch of n rows need not give the same bits as n runs at batch size 1 (batch invariance, see
    DESIGN.md: GEMM blocking depends on the batch), so the batch size is part of what a run depends on.

    Runs under `torch.inference_mode` (no autograd bookkeeping per op; the same kernels, so the same bits:
    measured identical tokens and per-step logits SHA-256 against `no_grad`). The cache stays usable after.
    """
    with torch.inference_mode():
        return _generate_batch(be, prompt_ids, n, seeds, sampling, cache=cache, on_token=on_token, eos=eos)


def _generate_batch(
    be: Backend,
    prompt_ids: list[int],
    n: int,
    seeds: Sequence[int] | None,
    sampling: Sampling,
    *,
    cache,
    on_token: Callable[[int], None] | None,
    eos: set[int] | None,
) -> list[Generation]:
    t0 = time.perf_counter()
    if n < 1:
        raise ConfigError(f"batch of n={n} rows: use n >= 1")
    seeds = list(range(n)) if seeds is None else [int(s) for s in seeds]
    if len(seeds) != n:
        raise ConfigError(f"{len(seeds)} seeds for a batch of n={n} rows: give one seed per row")
    job = Job(list(prompt_ids), seeds, cache, t0)
    if isinstance(be, InEngineDecoding):  # an engine that decodes whole requests itself: the same contract, there
        seen = prefilled_from(be, job)
        rows = be.continue_rows(cache, job.prompt_ids, seeds, **_engine_sampling(be, sampling, eos))
        return [finish(be, row, len(prompt_ids) - seen, seed, sampling, on_token)
                for seed, row in zip(seeds, rows, strict=True)]
    if not isinstance(be, Stepwise):
        raise HarnessError(f"the {be.name} backend neither decodes in its engine (kvstore.InEngineDecoding) nor step "
                           "by step (kvstore.Stepwise); a backend declares one of them (docs/extending.md)")
    check_capabilities(type(be), n, 1)  # a direct caller's rows (a run's config refused them already)
    return _decode_steps(be, [job], sampling, on_token=on_token, eos=eos)[0]


def _engine_sampling(be: Backend, sampling: Sampling, eos: set[int] | None) -> dict:
    """The keywords an in-engine decode takes (`continue_rows`, `continue_many`): the budget, the stop strings, the
    sampler and the EOS ids (the backend's unless given)."""
    return dict(max_new_tokens=sampling.max_new_tokens, stop=tuple(s for s in sampling.stop if s),
                strategy=sampling.strategy, temperature=sampling.temperature, top_p=sampling.top_p,
                eos=be.eos_ids() if eos is None else set(eos))


def prefilled_from(be: Backend, job: Job) -> int:
    """How many tokens of `job`'s prompt its cache already holds (a graft; 0 without one); a HarnessError when it
    holds all of them (nothing would be prefilled, so no logits to choose the first token from)."""
    seen = be.seen(job.cache) if job.cache is not None else 0
    if seen >= len(job.prompt_ids):
        raise HarnessError(f"the cache already holds {seen} tokens of a {len(job.prompt_ids)}-token prompt; "
                           "nothing to prefill")
    return seen


@dataclass
class Job:
    """One context of a batch of contexts (`generate_many`): its prompt, one seed per row, the cache that may hold
    a prefix of it (a graft) and when it was submitted (perf counter; its rows' TTFT runs from there)."""

    prompt_ids: list[int]
    seeds: list[int]
    cache: object = None
    submitted: float = 0.0


def generate_many(
    be: Backend,
    jobs: Sequence[Job],
    sampling: Sampling,
    *,
    on_token: Callable[[int], None] | None = None,
    eos: set[int] | None = None,
) -> list[list[Generation]]:
    """`generate_batch` for several contexts at once (problems in flight): the rows of every job decode together
    and the result is each job's generations, in job order.

    An engine with its own scheduler (kvstore.InEngineBatches: vLLM) is given every job's rows at once. A step-wise
    engine with kvstore.RaggedRows (transformers) prefills (or takes the graft of) each context alone, in its pinned
    schedule, picks each job's first tokens from its own logits exactly as `generate_batch` does, then joins the
    caches (left-padded, each row at its own positions) and steps every running row together; a finished row leaves
    the batch. Each row's bits equal its single-job run's where the engine's forward is batch-invariant
    (determinism.batch_invariant=true); elsewhere they may differ in the last bits (the batch is another GEMM)."""
    jobs = list(jobs)
    if not jobs:
        return []
    for job in jobs:
        if not job.seeds:
            raise ConfigError("a job with no rows: give each job at least one seed")
    check_capabilities(type(be), 1, max(2, len(jobs)))  # a direct caller's contexts (refused at composition)
    if isinstance(be, InEngineBatches):
        return _continue_many(be, jobs, sampling, on_token=on_token, eos=eos)
    with torch.inference_mode():
        return _decode_steps(be, jobs, sampling, on_token=on_token, eos=eos)


def _decode_steps(be, jobs: list[Job], sampling: Sampling, *, on_token: Callable[[int], None] | None,
                  eos: set[int] | None) -> list[list[Generation]]:
    """The one decode loop of a step-wise engine, for one context (`generate_batch`) or several (`generate_many`):
    each context is prefilled (or its graft taken) alone, in its pinned schedule, and each job's first tokens picked
    from its own logits; then the rows still running step together (one context: `step`, its rows repeated from the
    shared context; several: their caches joined, `step_rows`, each row at its own positions) and a finished row
    leaves the batch. A row ends at EOS, a stop string or its budget."""
    max_new_tokens, stop, strategy = sampling.max_new_tokens, [s for s in sampling.stop if s], sampling.strategy
    eos = be.eos_ids() if eos is None else set(eos)
    # A stop string completed by the newest token lies within the last len(stop) characters, so decoding a tail
    # of that many tokens (each is >= 1 character) finds it without re-decoding the whole text every step.
    tail = max((len(s) for s in stop), default=0) + 4
    # one entry per row of every job: (job index, row index in the job)
    owners = [(j, r) for j, job in enumerate(jobs) for r in range(len(job.seeds))]
    seeds = [jobs[j].seeds[r] for j, r in owners]
    gens = ([torch.Generator(device="cpu").manual_seed(s) for s in seeds] if strategy == "sample"
            else [None] * len(owners))
    outs: list[list[int]] = [[] for _ in owners]
    reasons: list[StopReason] = ["length"] * len(owners)
    ttft = [0.0] * len(owners)
    shas, prefilled, lengths, caches, running_rows = [], [], [], [], []

    def chosen(i: int, tok: int) -> bool:
        """Record row i's token; True while the row continues."""
        if tok in eos:
            reasons[i] = "eos"
            return False
        outs[i].append(tok)
        if stop and _first_stop(be.decode(outs[i][-tail:]), stop) is not None:
            reasons[i] = "stop"
            return False
        return True

    first_row = 0
    for job in jobs:  # each context alone, as one problem at a time would compute it
        n = len(job.seeds)
        t0 = job.submitted or time.perf_counter()
        cache = job.cache if job.cache is not None else be.new_state()
        seen = prefilled_from(be, job)
        cache, logits = be.prefill(job.prompt_ids[seen:], cache)  # (1, vocab): shared by every row's first token
        shas.append(logits_sha256(logits))
        prefilled.append(len(job.prompt_ids) - seen)
        lengths.append(len(job.prompt_ids))
        rows = list(range(first_row, first_row + n))
        picks = _pick_rows(logits.expand(n, -1), strategy, sampling.temperature, sampling.top_p,
                           [gens[i] for i in rows])
        going = []
        for i, tok in zip(rows, picks, strict=True):
            ttft[i] = time.perf_counter() - t0
            if chosen(i, tok):
                going.append(i)
        if on_token is not None:
            on_token(n)
        if going and max_new_tokens > 1:
            if len(going) > 1:
                be.repeat_rows(cache, len(going))  # every row starts from the same context (BatchedRows)
            caches.append(cache)
            running_rows += going
        first_row += n

    active = running_rows
    if active:
        state = be.join_rows(caches) if len(caches) > 1 else caches[0]
        joined = len(caches) > 1
        for step in range(1, max_new_tokens):
            tokens = [outs[i][-1] for i in active]
            positions = [lengths[owners[i][0]] + step - 1 for i in active]
            if joined:
                logits = be.step_rows(state, tokens, positions)
            else:  # one context: its rows at one position
                logits = be.step(state, tokens, positions[0])  # (rows, vocab)
            picks = _pick_rows(logits, strategy, sampling.temperature, sampling.top_p, [gens[i] for i in active])
            keep = [k for k, (i, tok) in enumerate(zip(active, picks, strict=True)) if chosen(i, tok)]
            if on_token is not None:
                on_token(len(active))
            if not keep or step + 1 == max_new_tokens:
                break
            if len(keep) < len(active):
                be.keep_rows(state, keep)
            active = [active[k] for k in keep]

    out: list[list[Generation]] = [[] for _ in jobs]
    for i, (j, _) in enumerate(owners):
        row = Continuation(outs[i], reasons[i], shas[j], ttft[i])
        out[j].append(finish(be, row, prefilled[j], seeds[i], sampling))
    return out


def _continue_many(be: InEngineBatches, jobs: list[Job], sampling: Sampling, *,
                   on_token: Callable[[int], None] | None, eos: set[int] | None) -> list[list[Generation]]:
    """`generate_many` on an InEngineBatches backend (vLLM): every job's rows in one submission."""
    seen = [prefilled_from(be, job) for job in jobs]
    requests = [RowsRequest(job.cache, list(job.prompt_ids), list(job.seeds)) for job in jobs]
    answers = be.continue_many(requests, **_engine_sampling(be, sampling, eos))
    if len(answers) != len(jobs):
        raise HarnessError(f"backend {be.name} answered {len(answers)} of {len(jobs)} jobs in flight")
    return [[finish(be, row, len(job.prompt_ids) - held, seed, sampling, on_token)
             for seed, row in zip(job.seeds, rows, strict=True)]
            for job, held, rows in zip(jobs, seen, answers, strict=True)]


def finish(be: Backend, row: Continuation, prefilled: int, seed: int, sampling: Sampling,
           on_token: Callable[[int], None] | None = None) -> Generation:
    """A Generation from a decoded row (an engine's Continuation, or the step-wise loop's): its text cut at the
    first stop string, its tokens chosen counted (a final EOS included; reported to `on_token` when given: an
    engine's row, whose steps the caller did not see), its seed kept when sampled."""
    if row.stop_reason not in STOP_REASONS:
        raise HarnessError(f"backend {be.name} ended a row with {row.stop_reason!r}; expected one of "
                           f"{list(STOP_REASONS)}")
    text = be.decode(row.token_ids)
    hit = _first_stop(text, [s for s in sampling.stop if s])
    if hit is not None:
        text = text[:hit]
    decode_tokens = len(row.token_ids) + (row.stop_reason == "eos")
    if on_token is not None:
        on_token(decode_tokens)
    return Generation(list(row.token_ids), text, prefilled, decode_tokens, row.stop_reason, row.first_logits_sha256,
                      row.ttft_s, seed=seed if sampling.strategy == "sample" else None)


def eos_ids(be: Backend) -> set[int]:
    """Token ids that end generation (the backend's `eos_ids`; transformers: the config's eos_token_id, int or
    list, and the tokenizer's)."""
    return be.eos_ids()


def _first_stop(text: str, stop: Sequence[str]) -> int | None:
    hits = [text.find(s) for s in stop if s and s in text]
    return min(hits) if hits else None
