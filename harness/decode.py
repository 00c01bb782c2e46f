"""Batch-size-1 decoding on a frozen model: prefill what the cache has not seen, then greedy or seeded
sampling up to a token budget, stopping at EOS or a stop string.

The prefix a cache already holds (a graft) is not recomputed: `prefill_tokens` counts only what was.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

import torch

from harness.errors import ConfigError, HarnessError
from kvstore import FrozenModel, forward, logits_sha256, new_cache, prefill

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


def _pick(
    logits: torch.Tensor, strategy: str, temperature: float, top_p: float, generator: torch.Generator | None
) -> int:
    if strategy == "greedy":
        return int(torch.argmax(logits, dim=-1))
    probs = torch.softmax(logits.double() / max(temperature, 1e-6), dim=-1)
    if top_p < 1.0:
        sorted_p, idx = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_p, -1) - sorted_p < top_p
        probs = torch.zeros_like(probs).scatter(-1, idx[keep], sorted_p[keep])
    return int(torch.multinomial(probs, 1, generator=generator))


def generate(
    fm: FrozenModel,
    prompt_ids: list[int],
    *,
    max_new_tokens: int,
    stop: list[str] = (),
    strategy: str = "greedy",
    temperature: float = 0.7,
    top_p: float = 0.95,
    seed: int | None = None,
    cache=None,
) -> Generation:
    """Continue `prompt_ids`. `cache` may already hold a prefix of them (a graft); the rest is prefilled."""
    t0 = time.perf_counter()
    if strategy not in ("greedy", "sample"):
        raise ConfigError(f"decoding.strategy={strategy!r}: use 'greedy' or 'sample'")
    if max_new_tokens < 1:
        raise ConfigError(f"decoding.max_new_tokens={max_new_tokens}: use a budget of at least 1 token")
    cache = cache if cache is not None else new_cache(fm)
    seen = cache.get_seq_length()
    if seen >= len(prompt_ids):
        raise HarnessError(
            f"the cache already holds {seen} tokens of a {len(prompt_ids)}-token prompt; nothing to prefill"
        )
    gen = None
    if strategy == "sample":
        gen = torch.Generator(device="cpu").manual_seed(int(seed or 0))
    eos = eos_ids(fm)
    cache, logits = prefill(fm, prompt_ids[seen:], cache)
    first_sha, ttft = "", 0.0
    out: list[int] = []
    reason = "length"
    # A stop string completed by the newest token lies within the last len(stop) characters, so decoding a tail
    # of that many tokens (each is >= 1 character) finds it without re-decoding the whole text every step.
    tail = max((len(s) for s in stop), default=0) + 4
    for step in range(max_new_tokens):
        tok = _pick(logits[0].cpu(), strategy, temperature, top_p, gen)
        if step == 0:
            ttft = time.perf_counter() - t0
            first_sha = logits_sha256(logits)
        if tok in eos:
            reason = "eos"
            break
        out.append(tok)
        if stop and _first_stop(fm.decode(out[-tail:]), stop) is not None:
            reason = "stop"
            break
        if step + 1 < max_new_tokens:
            logits = forward(fm, [tok], cache)[:, -1, :]
    text = fm.decode(out)
    hit = _first_stop(text, stop)
    if hit is not None:
        text = text[:hit]
    return Generation(
        out, text, len(prompt_ids) - seen, len(out) + (reason == "eos"), reason, first_sha, ttft,
        seed=int(seed or 0) if strategy == "sample" else None,
    )


def eos_ids(fm: FrozenModel) -> set[int]:
    """Token ids that end generation: the config's eos_token_id (int or list) and the tokenizer's."""
    ids: set[int] = set()
    for v in (getattr(fm.config, "eos_token_id", None), fm.tokenizer.eos_token_id):
        if isinstance(v, int):
            ids.add(v)
        elif isinstance(v, (list, tuple)):
            ids.update(int(x) for x in v)
    return ids


def _first_stop(text: str, stop: list[str]) -> int | None:
    hits = [text.find(s) for s in stop if s and s in text]
    return min(hits) if hits else None
