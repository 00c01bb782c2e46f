"""The vLLM backend behind kvgraft's seam (kvstore.engine.protocol: the core, InEngineDecoding, InEngineBatches): an
in-process `vllm.LLM` on CPU, threads pinned and its KV cache sized explicitly (kvstore.backends.vllm.launch
.start_engine), its KvgraftConnector doing every deposit and graft. Runs in `.venv-vllm` (`make setup-vllm`).

    be = kvstore.load_backend("vllm")                 # the bundled Gemma 3 270M, bf16, 2 threads
    state, logits = be.prefill(be.encode("Problem: ..."))

vLLM runs whole requests, not single forward steps, so a state here is what the next request will hold: the tokens it
stands for and, after a graft, the artifact the connector is to load. What the engine computed lives in its prefix
cache, which every fresh state empties (`reset_prefix_cache`): a row never reuses another row's blocks, so a run's
bits do not depend on which rows came before it (a resumed run equals an uninterrupted one).

    prefill   one request (the state's tokens + the new ones, max_tokens=1): vLLM's raw logits over the whole
              vocabulary at the last position (logprobs=-1, logprobs_mode="raw_logits"); its whole blocks stay in
              the prefix cache, so a longer prompt next hits them (vLLM's own split schedule)
    capture   the prompt prefilled from a clean cache and deposited by the connector whole (its partial last block
              included: an artifact of exactly these tokens, as a library entry records it)
    graft     the one admission (kvstore.engine.admission.admit), the window check, then the artifact is put into the
              connector's scratch store; the next request names it and the connector loads its whole blocks at their
              own positions after re-checking everything (kvstore.backends.vllm.connector)
    continue_rows  the decode, inside the engine: greedy (one row) or n seeded rows sampled by vLLM
    context_size   the engine's own max_model_len (what vLLM accepts as prompt + decoded tokens)

It has no step-wise capability (no forward, step, repeat_rows, keep_rows): the harness hands it whole rows.

Exactness on vLLM: a graft loads whole blocks (`len // block_size` of them) and the engine computes the rest, exactly
as its own prefix cache does; the reference is the same prompt after the artifact's tokens were prefilled alone from
a clean cache (`prefill(entry)` then the whole prompt: a prefix-cache hit on the same blocks). Both go through the same
requests, so their rows are bit-identical (docs/vllm.md).

The first logits of a continuation are hashed inside the engine by the FirstLogitsDigest logits processor
(kvstore.backends.vllm.digest: the SHA-256 of the same float32 bytes `prefill`'s whole-vocabulary logits hash to, and
their argmax, without the vocabulary crossing processes). A greedy row is one request (ROW_SCHEDULE): the digest is
taken at the position its first token is sampled from, which must be that argmax, and the engine decodes the rest in
its own decode steps. n sampled rows are one request of n seeded rows after a first-logits request (max_tokens=1).

Until 2026-12-03 a greedy row was two requests: the first logits (max_tokens=1), then prompt + first token (its
second token computed in a prefill of the prompt's tail, not a decode step: other bits). Runs recorded then carry no
`row_schedule` in their comparable and resume keys, so no later run is compared with or resumed into them.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from kvstore.backends.vllm.digest import DIGEST, PROCESSOR, DigestReader
from kvstore.backends.vllm.identity import NAME, model_fingerprint, tokenizer_fingerprint
from kvstore.backends.vllm.launch import model_folder, start_engine
from kvstore.backends.vllm.params import CACHED, GRAFT_MARK, GRAFT_TOKENS, GRAFTED, INVALID, MARK, PROMPT, REFUSED
from kvstore.backends.vllm.settings import VllmBackendSettings, VllmSettings
from kvstore.engine.admission import admit
from kvstore.engine.protocol import Backend, Continuation, InEngineBatches, RowsRequest
from kvstore.engine.text import HFTokenizer, eos_of
from kvstore.errors import IncompatibleError, KVStoreError, ModelLoadError, SettingsError
from kvstore.format.artifact import Snapshot, tokens_sha256
from kvstore.format.invariants import cached_tokens
from kvstore.store.open import open_store

# How this backend computes a greedy row (recorded in a run's comparable and resume keys: `row_schedule`)
ROW_SCHEDULE = "vllm greedy row: one request, first-logits digest in the engine (2026-12-03)"


@dataclass
class VllmState:
    """What the next request holds: `ids` (the tokens this state stands for) and, after a graft, the artifact the
    connector loads for them (`graft`: its id and token count)."""

    ids: list[int] = field(default_factory=list)
    graft: tuple[str, int] | None = None
    epoch: int = -1  # the prefix-cache epoch (VllmBackend.new_state) in which `prefill` computed `ids` into the cache


class VllmBackend(Backend, InEngineBatches):
    """kvstore.engine.protocol.Backend and InEngineBatches (so InEngineDecoding) on an in-process vllm.LLM (module
    docstring)."""

    name = NAME
    settings_class = VllmBackendSettings
    requires = "vllm"
    install = ("it lives in .venv-vllm (`make setup-vllm`): run `.venv-vllm/bin/python -m ...`, or the make target, "
               "which picks .venv-vllm for a vLLM model")
    batch_invariant_absent = ("vLLM's batch-invariant mode (VLLM_BATCH_INVARIANT) runs only on a GPU and refuses the "
                              "CPU by design")

    @classmethod
    def load(cls, settings: VllmBackendSettings) -> VllmBackend:
        """The registry's loader (kvstore.backends): an engine for `settings` with its connector."""
        return cls(settings)

    @classmethod
    def load_text(cls, settings: VllmBackendSettings) -> Any:
        """The model's tokenizer and fingerprints without an engine (kvstore.backends.vllm.text.VllmText)."""
        from kvstore.backends.vllm.text import load_text

        return load_text(settings)

    def __init__(self, settings: VllmBackendSettings) -> None:
        self.cfg = settings
        scratch = settings.scratch or tempfile.mkdtemp(prefix="kvgraft-vllm-")
        Path(scratch).mkdir(parents=True, exist_ok=True)
        self.scratch = scratch
        self.journal = str(Path(scratch) / "journal.jsonl")
        self.engine = VllmSettings.of(  # the caller's settings; the connector's choices are this backend's own
            settings, store=scratch, role="kv_both", deposit="marked", graft="marked", on_refused="fail",
            journal=self.journal, max_logprobs=-1, logprobs_mode="raw_logits")
        folder = Path(model_folder(self.engine))
        t0 = time.perf_counter()
        self.llm = start_engine(self.engine, logits_processors=[PROCESSOR])
        self.start_s = time.perf_counter() - t0
        self.store = open_store(scratch)
        self.digests, self._asks = DigestReader(str(Path(scratch) / "digests.jsonl")), itertools.count()
        self._nonce = uuid.uuid4().hex[:16]  # digest keys unique to this backend: no other engine's line can match
        self._epoch = 0  # counts prefix-cache resets (new_state): which states' blocks the cache still holds
        hf = self.llm.get_tokenizer()
        self.model_name = settings.model_name
        self.fingerprint = model_fingerprint(folder)
        self.tokenizer_fingerprint = tokenizer_fingerprint(folder)
        config = _json(folder / "config.json")
        text = config.get("text_config", config) if isinstance(config.get("text_config"), dict) else config
        # config.json's and generation_config.json's eos_token_id (int or list) and the tokenizer's: the tokens vLLM
        # stops at, given to every request as stop_token_ids
        textcfg = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
        eos = eos_of(config.get("eos_token_id"), textcfg.get("eos_token_id"),
                     _json(folder / "generation_config.json").get("eos_token_id"), hf.eos_token_id)
        self._text = HFTokenizer(hf, eos, int(text.get("vocab_size") or len(hf)))
        self._vocab = self._text.vocab_size()
        # The engine's binding settings and environment, as its connector records them: read from a probe deposit
        # (one block), so what admission compares here is exactly what the worker compares.
        space = hf.encode(" ", add_special_tokens=False)[-1]  # Gemma 3: 236743
        probe_ids = [int(hf.bos_token_id or 0)] + [int(space)] * (settings.block_size - 1)
        probe = self.capture(VllmState(), probe_ids)
        self._settings, self._environment, self.dtype = dict(probe.determinism), dict(probe.environment), probe.dtype
        self.layout = probe.layout

    # ------------------------------------------------------------------ facts
    def settings(self) -> dict:
        """The engine's binding settings (kvstore.backends.vllm.identity.engine_settings: backend "vllm", the vLLM
        version, block size, dtype, layout, ISA, prefill budget, threads, ...), as its connector records them."""
        return dict(self._settings)

    def environment(self) -> dict:
        return dict(self._environment)

    def row_schedule(self) -> str | None:
        """ROW_SCHEDULE: a greedy row is one request (module docstring); runs of the two-request schedule before it
        recorded none."""
        return ROW_SCHEDULE

    def context_size(self) -> int | None:
        """The engine's max_model_len, as vLLM resolved it: the most positions a prompt and its decoded tokens take."""
        return int(self.llm.llm_engine.model_config.max_model_len)

    # ------------------------------------------------------------------ text
    def tokenizer(self) -> HFTokenizer:
        """The engine's tokenizer: BOS first when asked (control tokens written in the text are parsed either way, as
        the transformers backend's are), decoded without special tokens, config.json's vocabulary."""
        return self._text

    # ------------------------------------------------------------------ requests
    def sampling_params(self, state: VllmState | None = None, deposit: bool = False, digest: str | None = None,
                        **kw: Any) -> Any:
        """vllm.SamplingParams(**kw) for a request of this engine: naming the state's graft (the connector loads it),
        with `deposit` marking the prompt to be deposited whole, with `digest` (a key) asking the engine for its
        first-logits digest (kvstore.backends.vllm.digest)."""
        from vllm import SamplingParams

        transfer: dict[str, Any] = {}
        if state is not None and state.graft is not None:
            transfer.update({GRAFT_MARK: state.graft[0], GRAFT_TOKENS: state.graft[1]})
        if deposit:
            transfer[MARK] = PROMPT
        extra_args: dict[str, Any] = {"kv_transfer_params": transfer} if transfer else {}
        if digest is not None:
            extra_args[DIGEST] = {"key": digest, "journal": self.digests.path}
        return SamplingParams(**kw, **({"extra_args": extra_args} if extra_args else {}))

    def _run(self, prompts: list[list[int]], params: list[Any]) -> list[Any]:
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        for o, p, ids in zip(outs, params, prompts, strict=True):
            told = getattr(o, "kv_transfer_params", None) or {}
            asked = (getattr(p, "extra_args", None) or {}).get("kv_transfer_params") or {}
            # whole blocks a named graft loads: its outcome must be reported, unless a stop string ended the request
            # (vLLM's frontend cuts it and aborts it in the engine: its output carries no kv_transfer_params)
            cut = any(isinstance(getattr(c, "stop_reason", None), str) for c in o.outputs)
            blocks = min(int(asked.get(GRAFT_TOKENS) or 0), len(ids) - 1) // self.cfg.block_size if GRAFT_MARK in \
                asked and not cut else 0
            if any(c.finish_reason == "error" for c in o.outputs) or REFUSED in told or INVALID in told or (
                    blocks > 0 and GRAFTED not in told and CACHED not in told):
                # refused at admission (the prompt was computed instead), or a named graft with no outcome reported:
                # not the graft this row asked for
                why = told.get(REFUSED) or told.get(INVALID) or "its journal and log line name why"
                raise IncompatibleError(
                    f"vLLM request {o.request_id}: the connector admitted no artifact for its prompt "
                    f"({len(o.prompt_token_ids or [])} tokens; journal {self.journal}): {why}")
        return outs

    def logits_of(self, output: Any) -> torch.Tensor:
        """The whole-vocabulary raw logits of the first generated position of a `first_logits_params` request's
        output, (1, vocab) float32.

        The requests ask for them flat (`flat_logprobs=True`: a few lists instead of 262,144 Logprob objects, about
        0.55 s less per request here); a position lists the sampled token first, then every token by rank, so the
        sampled one appears twice with the same value. Every vocabulary entry must be set: a gap is an error."""
        table = output.outputs[0].logprobs
        if hasattr(table, "start_indices"):  # vllm.logprobs.FlatLogprobs
            a, b = table.start_indices[0], table.end_indices[0]
            ids = torch.tensor(table.token_ids[a:b], dtype=torch.long)
            vals = torch.tensor(table.logprobs[a:b], dtype=torch.float32)
        else:  # list[dict[int, Logprob]]
            ids = torch.tensor(list(table[0].keys()), dtype=torch.long)
            vals = torch.tensor([lp.logprob for lp in table[0].values()], dtype=torch.float32)
        out, seen = torch.zeros(self._vocab, dtype=torch.float32), torch.zeros(self._vocab, dtype=torch.bool)
        out[ids], seen[ids] = vals, True
        if not bool(seen.all()):
            raise KVStoreError(f"vLLM returned logits for {int(seen.sum())} of {self._vocab} vocabulary "
                               f"entries (request {output.request_id}); the engine must run with max_logprobs=-1")
        return out[None]

    def first_logits_params(self, state: VllmState | None) -> Any:
        """The request for a state's next-position logits: one greedy token, the whole vocabulary's raw logits, flat."""
        return self.sampling_params(state, max_tokens=1, temperature=0.0, logprobs=-1, flat_logprobs=True,
                                    detokenize=False)

    def _first(self, prompts: list[list[int]], states: list[VllmState]) -> list[tuple[str, int]]:
        """Each context's first-logits SHA-256 and greedy first token, in one submission: the engine hashes the
        whole-vocabulary float32 logits itself (kvstore.backends.vllm.digest; the same bytes `logits_sha256` of
        `logits_of` hashes), so no vocabulary crosses to this process."""
        keys = [f"{self._nonce}-r{next(self._asks)}" for _ in prompts]
        outs = self._run(prompts, [self.sampling_params(s, digest=k, max_tokens=1, temperature=0.0, detokenize=False)
                                   for s, k in zip(states, keys, strict=True)])
        got = self.digests.take(keys)
        for o, k in zip(outs, keys, strict=True):
            _check_first(o, got[k][1])
        return [got[k][:2] for k in keys]

    def _greedy(self, prompts: list[list[int]], states: list[VllmState], max_new_tokens: int, stop: list[str],
                eos: set[int]) -> list[tuple[str, list[int], float]]:
        """Each context's greedy row in one request, all in one submission (ROW_SCHEDULE): (first-logits SHA-256
        hashed in the engine at the position the first token is sampled from, the row's token ids as vLLM returns
        them, seconds from submission to those first logits). The first token must be the hashed logits' argmax."""
        keys = [f"{self._nonce}-r{next(self._asks)}" for _ in prompts]
        t0 = time.time()  # wall clock: the engine process stamps its digest lines with the same clock
        outs = self._run(prompts, [self.sampling_params(
            s, digest=k, max_tokens=max_new_tokens, temperature=0.0, stop=stop or None, stop_token_ids=sorted(eos),
            ignore_eos=not eos) for s, k in zip(states, keys, strict=True)])
        got = self.digests.take(keys)
        rows = []
        for o, k in zip(outs, keys, strict=True):
            ids, (sha, argmax, at) = list(o.outputs[0].token_ids), got[k]
            _check_first(o, argmax)
            rows.append((sha, ids, max(0.0, at - t0)))
        return rows

    # ------------------------------------------------------------------ compute
    def new_state(self) -> VllmState:
        """An empty state; the engine's prefix cache is emptied with it (no row reuses another row's blocks)."""
        if not self.llm.reset_prefix_cache():
            raise KVStoreError("vLLM could not reset its prefix cache (requests still running); finish them first")
        self._epoch += 1  # every state computed before it lost its blocks
        return VllmState()

    def seen(self, state: VllmState) -> int:
        return len(state.ids)

    def prefill(self, token_ids: list[int], state: VllmState | None = None,
                position: int | None = None) -> tuple[VllmState, torch.Tensor]:
        """One request of the state's tokens + `token_ids` (a graft in the state is loaded by it): the new state and
        the last position's logits (1, vocab). Its whole blocks stay cached for the next request."""
        state = self.new_state() if state is None else state
        if position is not None and position != len(state.ids):
            raise SettingsError(f"prefill at position {position}: the vLLM backend continues the state's "
                                f"{len(state.ids)} tokens only")
        ids = state.ids + list(token_ids)
        out = self._run([ids], [self.first_logits_params(state)])[0]
        return VllmState(ids, epoch=self._epoch), self.logits_of(out)

    def _recache(self, states: list[VllmState]) -> None:
        """Make the prefix cache hold the blocks of every state `prefill` computed (no graft: the next request reads
        them from the cache) before a wave is submitted. A state whose blocks a later `new_state` emptied (each job
        of a wave prefilled in turn: issue 51, item 4) would otherwise be computed cold inside the longer prompt,
        while recorded as entry-then-rest. When any is stale: one reset, then each such state's tokens prefilled
        alone, in order (one request each, the schedule `prefill` ran), so every row reads its prefix as computed
        alone from a clean cache."""
        relying = [st for st in states if st.graft is None and st.ids]
        if all(st.epoch == self._epoch for st in relying):
            return
        self.new_state()
        done: set[tuple[int, ...]] = set()
        for st in relying:
            key = tuple(st.ids)
            if key not in done:
                done.add(key)
                self._run([list(st.ids)], [self.first_logits_params(None)])
            st.epoch = self._epoch

    # ------------------------------------------------------------------ decode
    def continue_rows(self, state: VllmState | None, prompt_ids: list[int], seeds: Sequence[int], *,
                      max_new_tokens: int, stop: Sequence[str] = (), strategy: str = "greedy",
                      temperature: float = 0.7, top_p: float = 0.95,
                      eos: set[int] | None = None) -> list[Continuation]:
        """Continue `prompt_ids` (the state holds a prefix of them: a graft, or blocks cached by `prefill`) once
        per seed, inside the engine. Greedy: one request, its first-logits digest taken in the engine where its first
        token is sampled (ROW_SCHEDULE); sample: a first request gives the logits, then one request of n seeded
        rows. Stop strings are checked on each row's tokens as the harness's decode does (the first token whose
        text completes one), eos ends a row (not counted in its token_ids). The one-context case of `continue_many`
        (the same requests, the same bits)."""
        return self.continue_many([RowsRequest(state, list(prompt_ids), seeds)], max_new_tokens=max_new_tokens,
                                  stop=stop, strategy=strategy, temperature=temperature, top_p=top_p, eos=eos)[0]

    def continue_many(self, requests: Sequence[RowsRequest], *, max_new_tokens: int, stop: Sequence[str] = (),
                      strategy: str = "greedy", temperature: float = 0.7, top_p: float = 0.95,
                      eos: set[int] | None = None) -> list[list[Continuation]]:
        """`continue_rows` for several contexts at once (problems in flight): greedy, every context's row in one
        submission; sampled, the first-logits requests of every context in one submission, then every context's rows
        in a second one. The engine's scheduler batches them all (its continuous batching fills each step with
        whatever rows are still running). Answers in request order. A row's bits can depend on what shares its batch
        (vLLM on CPU is not batch-invariant): `rows_depend_on_batch` says so, and the harness records it."""
        t0 = time.perf_counter()
        if not requests:
            return []
        if all(r.state is None for r in requests):
            self.new_state()  # an empty prefix cache for the wave, as one problem at a time starts from
        states = [r.state if r.state is not None else VllmState() for r in requests]
        for r, state in zip(requests, states, strict=True):
            if list(r.prompt_ids[: len(state.ids)]) != state.ids:
                raise IncompatibleError("the prompt does not begin with the tokens the state holds; graft or "
                                        "prefill its prefix first")
        self._recache(states)
        eos = self.eos_ids() if eos is None else set(eos)
        stop = [s for s in stop if s]
        stop_ids = sorted(eos)
        if strategy == "greedy":  # one submission: every context's row is one request
            done = self._greedy([list(r.prompt_ids) for r in requests], states, max_new_tokens, stop, eos)
            return [[Continuation(*self._finish(ids, stop, eos, max_new_tokens), sha, ttft)]
                    for sha, ids, ttft in done]
        firsts = self._first([list(r.prompt_ids) for r in requests], states)
        shas, ttft = [sha for sha, _ in firsts], time.perf_counter() - t0
        prompts, params, owner = [], [], []  # the second submission: every context's rows
        rows: list[list[list[int]]] = [[[] for _ in r.seeds] for r in requests]
        for j, (r, state) in enumerate(zip(requests, states, strict=True)):
            for k, seed in enumerate(r.seeds):
                prompts.append(list(r.prompt_ids))
                params.append(self.sampling_params(
                    state, max_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=int(seed),
                    stop=stop or None, stop_token_ids=stop_ids, ignore_eos=not eos))
                owner.append((j, k))
        outs = self._run(prompts, params) if prompts else []
        for (j, k), o in zip(owner, outs, strict=True):
            rows[j][k] = list(o.outputs[0].token_ids)
        answers = []
        for j, job_rows in enumerate(rows):
            done = []
            for ids in job_rows:
                ids, reason = self._finish(ids, stop, eos, max_new_tokens)
                done.append(Continuation(ids, reason, shas[j], ttft))
            answers.append(done)
        return answers

    def _stop_at(self, ids: list[int], stop: list[str]) -> int | None:
        """The number of tokens up to and including the first one whose text completes a stop string (the
        harness's rule: the last few tokens decoded after each token), or None."""
        if not stop:
            return None
        tail = max(len(s) for s in stop) + 4
        for k in range(1, len(ids) + 1):
            text = self.decode(ids[max(0, k - tail):k])
            if any(s in text for s in stop):
                return k
        return None

    def _finish(self, ids: list[int], stop: list[str], eos: set[int], budget: int) -> tuple[list[int], str]:
        """(token ids up to and including a stop, without EOS; "eos" | "stop" | "length")."""
        end = next((i for i, t in enumerate(ids) if t in eos), None)
        cut = self._stop_at(ids if end is None else ids[:end], stop)
        if cut is not None:
            return ids[:cut], "stop"
        if end is not None:
            return ids[:end], "eos"
        return ids[:budget], "length"

    # ------------------------------------------------------------------ artifacts
    def capture(self, state: Any, token_ids: list[int], extra: dict | None = None) -> Snapshot:
        """The artifact of `token_ids` from position 0: prefilled from a clean cache in one request (the pinned
        schedule, the one `prefill` runs) and deposited whole by the connector; `extra` recorded with it."""
        ids = list(token_ids)
        self.new_state()
        self._run([ids], [self.sampling_params(deposit=True, max_tokens=1, temperature=0.0, detokenize=False)])
        for aid in self.store.find_tokens(tokens_sha256(ids)):
            snap = self.store.get(aid)
            if list(snap.token_ids) == ids and snap.start_position == 0:
                return dataclasses.replace(snap, extra=dict(extra)) if extra else snap
        raise KVStoreError(f"the connector deposited no artifact of these {len(ids)} tokens into {self.scratch}; "
                           f"its journal {self.journal} says why")

    def graft_refusal(self, token_count: int) -> str | None:
        """Why an artifact of `token_count` tokens deposited here (from position 0) is refused before a longer prompt,
        or None: vLLM grafts whole blocks and computes the tail, and a sliding layer keeps only its last window - 1
        positions, so an entry of more than window - 1 tokens grafts only when it ends on a block boundary."""
        n = token_count // self.cfg.block_size * self.cfg.block_size
        held = [cached_tokens(lyr["kind"], lyr["window"], token_count) for lyr in self.layout]
        return self._window_gap(self.layout, held, token_count, n)

    def _window_gap(self, layout: list[dict], held: list[int], token_count: int, n: int) -> str | None:
        """The first sliding layer (kinds and windows `layout`, positions held `held`) that lacks a position the
        engine's computation after `n` grafted tokens needs, in one line; None when every layer has them."""
        for i, (lyr, h) in enumerate(zip(layout, held, strict=True)):
            first, window = token_count - h, lyr["window"]
            if lyr["kind"] != "full" and window is not None and first > max(0, n - int(window) + 1):
                return (f"layer {i} keeps positions from {first} only, and vLLM grafts whole blocks ({n} of its "
                        f"{token_count} tokens), which need them from {n - int(window) + 1}; deposit entries of at "
                        f"most {int(window) - 1} tokens, or of whole {self.cfg.block_size}-token blocks, for this "
                        "backend")
        return None

    def graft(self, snapshot: Snapshot, token_ids: list[int] | None = None) -> VllmState:
        """A fresh state whose next request loads `snapshot`'s whole blocks (the engine computes the rest), after
        the one admission and the window check; the connector checks it all again before a byte is written."""
        admit(snapshot, self, token_ids)
        if snapshot.layout != self.layout:
            raise IncompatibleError(f"{snapshot.model_name or 'artifact'}: layer layout differs from this engine's "
                                    f"({len(snapshot.layers)} vs {len(self.layout)} layers); deposit it again here")
        context = len(token_ids) if token_ids is not None else snapshot.token_count + 1
        n = min(snapshot.token_count, context - 1) // self.cfg.block_size * self.cfg.block_size
        gap = self._window_gap(snapshot.layout, [lyr.keys.shape[2] for lyr in snapshot.layers], snapshot.token_count, n)
        if gap is not None:
            raise IncompatibleError(f"{snapshot.model_name or 'artifact'}: {gap}")
        self.new_state()
        aid = str(self.store.put(snapshot))
        return VllmState(list(snapshot.token_ids), (aid, snapshot.token_count))


def _check_first(output: Any, argmax: int) -> None:
    """A greedy request's first token must be the argmax of the logits the engine hashed for it."""
    ids = output.outputs[0].token_ids
    if not ids:  # no token to check the digest's position against: not evidence, refused
        raise KVStoreError(f"vLLM request {output.request_id} returned no token, so the first-logits digest's position "
                           "cannot be checked against the sampled token (finish reason "
                           f"{output.outputs[0].finish_reason!r}); report this with the engine's settings")
    if ids[0] != argmax:
        raise KVStoreError(f"vLLM request {output.request_id} sampled token {ids[0]} greedily, but the argmax of the "
                           f"logits hashed in the engine is {argmax}; the digest is not of the sampled position "
                           "(report this with the engine's settings)")


def _json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{path}: unreadable ({e}); convert the model folder again") from e
    return data if isinstance(data, dict) else {}

