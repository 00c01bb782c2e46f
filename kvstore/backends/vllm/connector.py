"""KvgraftConnector: a vLLM KV connector that deposits prompt prefixes as kvgraft artifacts and grafts them back,
byte for byte, after the same checks as every kvgraft graft.

    from vllm import LLM
    from vllm.config import KVTransferConfig
    llm = LLM(model=folder, dtype="bfloat16", enforce_eager=True, enable_prefix_caching=True,
              kv_transfer_config=KVTransferConfig(
                  kv_connector="KvgraftConnector", kv_connector_module_path="kvstore.backends.vllm.connector",
                  kv_role="kv_both",                # kv_producer: deposit only; kv_consumer: graft only
                  kv_load_failure_policy="fail",    # a refused artifact fails the request; "recompute" recomputes
                  kv_connector_extra_config={"store": "runs/store",     # a folder or s3://bucket/prefix
                                             "deposit": "all",          # "all" | "marked" | "none"
                                             "journal": "runs/kvgraft-vllm.jsonl"}))

Deposit (worker side, `wait_for_save`): when a request's prompt has been prefilled, its whole blocks
(`len(prompt) // block_size * block_size` tokens; vLLM caches and reuses only whole blocks) are read out of the
paged cache into a Snapshot (kvstore/FORMAT.md: per layer (1, kv_heads, tokens, head_dim), a sliding layer its
last window - 1 positions) and put into the store, content-addressed, with the model and tokenizer fingerprints,
every binding engine setting (kvstore.backends.vllm.identity) and the environment. With deposit = "marked" only
requests whose SamplingParams carry `extra_args={"kv_transfer_params": {"kvgraft_deposit": True}}` deposit;
`"kvgraft_deposit": "prompt"` deposits the whole prompt, its last partial block included (an artifact of exactly the
prompt's tokens, as a library entry records it; a graft still loads whole blocks of it).

Graft (scheduler side finds and admits, worker side checks again and loads): the longest whole-block prefix of a
prompt that some artifact holds exactly (the store's token index), or only the artifact a request names
(`{"kv_transfer_params": {"kvgraft_graft": <artifact id>, "kvgraft_tokens": <how many of its tokens>}}`), is
admitted before the scheduler counts a token as matched (`get_num_new_matched_tokens`): the candidate is read (its
bytes re-hashed to its id), `admission_differences` runs against the engine's identity (which the worker learns in
register_kv_caches and hands to the scheduler through vLLM's handshake metadata), then the token and window checks.
A refused artifact is never claimed: 0 tokens, the prompt is computed, one line per refusal is logged and
journaled, and the request's output carries it in `kv_transfer_params` ({"kvgraft_refused": [...]}; a graft:
{"kvgraft_grafted": {...}}). So no refused load reaches the worker's recovery path (vllm #49250). The worker reads
the admitted artifact again and re-checks it before writing it into the request's blocks at its own positions (a
sliding layer's positions outside its window as zeros, as FORMAT.md section 10 lays out llama.cpp's); only what
changed in between can be refused there, and then nothing is written, the blocks are reported through
`get_block_ids_with_load_errors` and vLLM's kv_load_failure_policy decides (fail: finish_reason "error"). With
`"graft": "marked"` in the extra config, only requests that name their artifact graft (the store's token index is
not consulted): a caller that decides what to graft (kvgraft's own vLLM backend) and computes every other prompt
fresh. The artifact may hold more tokens than the whole blocks it grafts (its partial last block, say): the check
is that its first tokens are the prompt's and that each sliding layer holds the window before the grafted blocks'
end. Every request's kvgraft keys are checked first (kvstore.backends.vllm.params): keys that break the rule are
ignored and the output names why ({"kvgraft_invalid": ...}).

Exactness: a graft is byte-identical to the engine's own prefix-cache hit on the same blocks (same schedule:
prefix alone, then prefix + suffix), which is what scripts/verify_vllm.py measures.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorHandshakeMetadata,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.logger import init_logger

from kvstore.backends.vllm.identity import (
    EngineIdentity,
    dtype_name,
    engine_settings,
    model_fingerprint,
    tokenizer_fingerprint,
)
from kvstore.backends.vllm.paged import LearnedLayout, self_test
from kvstore.backends.vllm.params import (
    CACHED,
    GRAFT_MARK,
    GRAFT_TOKENS,
    GRAFTED,
    INVALID,
    MARK,
    PROMPT,
    REFUSED,
    check_params,
)
from kvstore.engine.admission import admission_differences
from kvstore.environment import current_environment
from kvstore.errors import IncompatibleError, KVStoreError, SettingsError, TransferParamsError
from kvstore.format.artifact import LayerKV, Snapshot, check_snapshot, tokens_sha256
from kvstore.format.invariants import cached_tokens

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

logger = init_logger("vllm.kvgraft")  # under vLLM's logger, so its handlers print our lines
DEPOSIT_MODES = ("all", "marked", "none")
GRAFT_MODES = ("all", "marked")


@dataclass
class LoadEntry:
    """Graft into request `req_id`: tokens [start, len(token_ids)) from the first admitted candidate."""

    req_id: str
    token_ids: list[int]
    candidates: list[str]
    start: int
    block_ids: list[int]


@dataclass
class SaveEntry:
    """Deposit the prompt prefix `token_ids` (whole blocks) of request `req_id` from its blocks."""

    req_id: str
    token_ids: list[int]
    block_ids: list[int]


@dataclass
class KvgraftMetadata(KVConnectorMetadata):
    loads: list[LoadEntry] = field(default_factory=list)
    saves: list[SaveEntry] = field(default_factory=list)


@dataclass
class IdentityHandshake(KVConnectorHandshakeMetadata):
    """The worker's EngineIdentity (learnt in register_kv_caches), handed to the scheduler side at engine start
    through vLLM's handshake metadata, so that admission runs before the scheduler counts any token as matched."""

    identity: EngineIdentity


def check_candidate(store: Any, aid: str, me: EngineIdentity, token_ids: list[int],
                    start: int) -> tuple[Snapshot | None, list[str]]:
    """Read artifact `aid` (its bytes re-hashed to its id) and check that it may graft the prompt prefix `token_ids`
    into this engine from position `start`: (the snapshot, []) when admitted, else (None, each reason)."""
    n = len(token_ids)
    try:
        snap = store.get(aid)  # the bytes hash to the id, or IntegrityError
        why = [d.message for d in admission_differences(snap, me.facts())]  # the one admission
        if snap.token_ids[:n] != token_ids or snap.start_position != 0:
            why.append(f"tokens: the artifact holds {snap.token_count} tokens from position "
                       f"{snap.start_position}, not the request's first {n}")
        elif not why:
            why += window_gaps(snap, n, start)
        if not why:
            check_snapshot(snap)
    except KVStoreError as e:
        return None, [f"{type(e).__name__}: {e}"]
    except Exception as e:  # noqa: BLE001 - a store that fails otherwise (OSError, SQLite) refuses it too
        return None, [f"{type(e).__name__}: {e}"]
    return (None, why) if why else (snap, [])


def window_gaps(snap: Snapshot, n: int, start: int) -> list[str]:
    """Layers that lack positions a graft of the first `n` tokens must write: an artifact of more than `n`
    tokens keeps, in a sliding layer, only the window before its own end, which may begin after n - window + 1."""
    out = []
    for i, lyr in enumerate(snap.layers):
        first = snap.token_count - lyr.keys.shape[2]  # the layer holds positions [first, token_count)
        need = start if lyr.kind == "full" or lyr.window is None else max(start, n - int(lyr.window) + 1)
        if first > need:
            out.append(f"layer {i}: holds positions from {first}, a graft of {n} tokens needs them from {need} "
                       f"(deposit the prompt's whole blocks instead, or an artifact of at most "
                       f"{lyr.window - 1 if lyr.window else n} tokens)")
            break
    return out


class KvgraftConnector(KVConnectorBase_V1):
    """See the module docstring."""

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        from kvstore.store.open import open_store

        cfg = self._kv_transfer_config
        spec = cfg.get_from_extra_config("store", None)
        if not spec:
            raise SettingsError("KvgraftConnector: kv_connector_extra_config has no 'store'; give a folder or an "
                                "s3://bucket/prefix, e.g. {'store': 'runs/store'}")
        self._store = open_store(spec)
        self._deposit = cfg.get_from_extra_config("deposit", "all")
        if self._deposit not in DEPOSIT_MODES:
            raise SettingsError(f"KvgraftConnector: deposit={self._deposit!r}; use one of {list(DEPOSIT_MODES)}")
        if not cfg.is_kv_producer:
            self._deposit = "none"
        self._graft = bool(cfg.is_kv_consumer)
        self._graft_mode = cfg.get_from_extra_config("graft", "all")
        if self._graft_mode not in GRAFT_MODES:
            raise SettingsError(f"KvgraftConnector: graft={self._graft_mode!r}; use one of {list(GRAFT_MODES)}")
        self._journal = cfg.get_from_extra_config("journal", None)
        self._block_size = int(vllm_config.cache_config.block_size)
        self._policy = str(cfg.kv_load_failure_policy)
        groups = kv_cache_config.kv_cache_groups if kv_cache_config is not None else []
        if len(groups) > 1:
            raise SettingsError(f"KvgraftConnector: {len(groups)} KV-cache groups (the hybrid KV cache manager is "
                                "on); start vLLM with disable_hybrid_kv_cache_manager=True (one group: every layer "
                                "keeps every block, which is what an artifact records)")
        pc = vllm_config.parallel_config
        ranks = {"tensor_parallel_size": int(getattr(pc, "tensor_parallel_size", 1)),
                 "pipeline_parallel_size": int(getattr(pc, "pipeline_parallel_size", 1))}
        if any(v > 1 for v in ranks.values()):
            raise SettingsError(f"KvgraftConnector: {ranks}: each rank would hold a shard of every layer's KV, and an "
                                "artifact records whole layers; run the connector with one rank (tensor and pipeline "
                                "parallel size 1)")
        if self._policy == "recompute":
            logger.warning("kvgraft: kv_load_failure_policy=recompute governs only a load the worker refuses after "
                           "admission (an artifact changed in between); vLLM's recompute path can return wrong "
                           "output on the V2 model runner (vllm #49250): prefer 'fail'")
        # scheduler side
        self._requests: dict[str, Request] = {}
        self._params_of: dict[str, dict[str, Any]] = {}  # each request's checked kvgraft keys
        self._invalid: dict[str, str] = {}  # why a request's kvgraft keys were refused
        self._matches: dict[str, tuple[int, list[str]]] = {}
        self._admitted: dict[str, str | None] = {}  # the artifact admitted for a request (None: every one refused)
        self._refused: dict[str, list[dict[str, Any]]] = {}  # what a request's response reports as refused
        self._to_load: dict[str, LoadEntry] = {}
        self._loaded: dict[str, int] = {}
        self._deposited: set[str] = set()
        self._cached: dict[str, dict[str, Any]] = {}  # a named artifact whose blocks the prefix cache already held
        # worker side
        self._caches: dict[str, torch.Tensor] = {}
        self._order: list[str] = []
        self._identity: EngineIdentity | None = None
        self._paged: dict[str, LearnedLayout] = {}  # per layer: the layout learned from its cache writer
        self._failed: set[int] = set()

    # ------------------------------------------------------------------ journal
    def _note(self, event: str, **fields: Any) -> None:
        if self._journal:
            line = json.dumps({"event": event, "time": round(time.time(), 3), **fields}, sort_keys=True)
            try:  # a journal that cannot be written (missing or read-only folder, full disk) is logged, never fatal
                with open(self._journal, "a", encoding="utf-8") as f:
                    f.write(line + "\n")
            except OSError as e:
                logger.error("kvgraft: journal %s cannot be written (%s: %s); event %s not journaled, the engine goes "
                             "on", self._journal, type(e).__name__, e, event)

    # ------------------------------------------------------------------ scheduler side
    def _match(self, request: Request) -> tuple[int, list[str]]:
        """The longest whole-block prefix of the prompt (leaving >= 1 token to compute) that artifacts hold
        exactly: (tokens, candidate ids); memoized per request (the store is only read)."""
        rid = request.request_id
        params = self._params(request)
        if rid not in self._matches and (GRAFT_MARK in params or self._graft_mode == "marked"):
            aid, held = params.get(GRAFT_MARK), params.get(GRAFT_TOKENS)
            prompt_len = len(request.prompt_token_ids or [])
            if aid is not None and held is None:
                try:
                    held = self._store.info(aid).token_count  # the index row; the bytes are read at admission
                except KVStoreError as e:
                    held, why = 0, f"{type(e).__name__}: {e}"
                    self._refused[rid] = [{"artifact": aid, "tokens": 0, "first_difference": why, "differences": [why]}]
                    logger.error("kvgraft: request %s: no artifact admitted, nothing grafted (refused at admission: "
                                 "the prompt is computed): artifact %s refused: %s", rid, aid[:16], why)
                    self._note("refused", request=rid, tokens=0, candidates=[aid], at="admission", policy=self._policy,
                               reasons=[f"artifact {aid[:16]} refused: {why}"])
            if aid is not None and held:
                n = min(held, prompt_len - 1) // self._block_size * self._block_size
                self._matches[rid] = (n, [aid]) if n > 0 else (0, [])
            else:
                self._matches[rid] = (0, [])
        if rid not in self._matches:
            prompt = list(request.prompt_token_ids or [])
            best: tuple[int, list[str]] = (0, [])
            try:  # the store's index (SQLite, S3) may fail under the running engine: that request computes fresh
                for k in range((len(prompt) - 1) // self._block_size, 0, -1):
                    n = k * self._block_size
                    ids = sorted(str(a) for a in self._store.find_tokens(tokens_sha256(prompt[:n])))
                    if ids:
                        best = (n, ids)
                        break
            except Exception as e:  # noqa: BLE001 - any store failure costs this request its graft, not the engine
                logger.error("kvgraft: request %s: store lookup failed (%s: %s); nothing grafted, its prompt is "
                             "computed", rid, type(e).__name__, e)
                self._note("lookup_failed", request=rid, reason=f"{type(e).__name__}: {e}")
                best = (0, [])
            self._matches[rid] = best
        return self._matches[rid]

    def _params(self, request: Request) -> dict[str, Any]:
        """The request's kvgraft keys, checked once (kvstore.backends.vllm.params); {} when they break the rule,
        which its response then names."""
        rid = request.request_id
        if rid not in self._params_of:
            try:
                self._params_of[rid] = check_params(request.kv_transfer_params)
            except TransferParamsError as e:
                self._params_of[rid], self._invalid[rid] = {}, str(e)
                logger.warning("kvgraft: request %s served without kvgraft: %s", rid, e)
                self._note("invalid_params", request=rid, reason=str(e))
        return self._params_of[rid]

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        """The tokens an admitted artifact adds to the engine's own prefix-cache hit. Admission runs here, before
        the scheduler counts a token as matched: a refused artifact is never claimed (0 tokens, the prompt is
        computed, the response names why), so no refused load reaches the worker's recovery path (vllm #49250)."""
        self._requests[request.request_id] = request
        if not self._graft:
            return 0, False
        n, ids = self._match(request)
        rid = request.request_id
        if n <= num_computed_tokens or not ids:
            if ids and n > 0 and GRAFT_MARK in self._params(request) and rid not in self._admitted:
                # named, but vLLM's own prefix cache already holds those blocks (computed or grafted by an earlier
                # request): nothing is read or loaded, and the response says so instead of saying nothing
                self._cached[rid] = {"artifact": ids[0], "tokens": n, "cached_tokens": int(num_computed_tokens),
                                     "why": "the engine's prefix cache already held these blocks (computed or "
                                            "grafted by an earlier request); the artifact was not read"}
            return 0, False
        self._cached.pop(rid, None)
        return (n - num_computed_tokens, False) if self._admit(request, n, ids, num_computed_tokens) else (0, False)

    def set_xfer_handshake_metadata(self, metadata: dict[int, KVConnectorHandshakeMetadata]) -> None:
        for meta in metadata.values():
            if isinstance(meta, IdentityHandshake):
                self._identity = meta.identity

    def _admit(self, request: Request, n: int, ids: list[str], start: int) -> str | None:
        """The first candidate admitted for the prompt's first `n` tokens (memoized per request), or None, when
        every one is refused: logged, journaled and kept for the response."""
        rid = request.request_id
        if rid not in self._admitted:
            prompt = list(request.prompt_token_ids or [])[:n]
            refusals: list[dict[str, Any]] = []
            self._admitted[rid] = None
            for aid in ids:
                if self._identity is None:
                    why = ["the engine's identity did not reach the scheduler (no handshake from the worker): "
                           "nothing can be admitted; report this with the vLLM version"]
                else:
                    _, why = check_candidate(self._store, aid, self._identity, prompt, start)
                if not why:
                    self._admitted[rid] = aid
                    break
                refusals.append({"artifact": aid, "tokens": n, "first_difference": why[0], "differences": why})
            if refusals and self._admitted[rid] is None:
                self._refused[rid] = refusals
                line = (f"kvgraft: request {rid}: no artifact admitted for its first {n} tokens, nothing grafted "
                        "(refused at admission: the prompt is computed): " + " | ".join(
                            f"artifact {r['artifact'][:16]} refused: {'; '.join(r['differences'])}" for r in refusals))
                logger.error(line)
                self._note("refused", request=rid, tokens=n, candidates=ids, at="admission", policy=self._policy,
                           reasons=[f"artifact {r['artifact'][:16]} refused: {'; '.join(r['differences'])}"
                                    for r in refusals])
        return self._admitted[rid]

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        self._requests[request.request_id] = request
        aid = self._admitted.get(request.request_id)
        if num_external_tokens > 0 and aid is not None:
            n, _ = self._match(request)
            prompt = list(request.prompt_token_ids or [])
            self._to_load[request.request_id] = LoadEntry(request.request_id, prompt[:n], [aid],
                                                          n - num_external_tokens, [])
            self._loaded[request.request_id] = n

    def _wants_deposit(self, request: Request) -> bool:
        if self._deposit == "all":
            return True
        return self._deposit == "marked" and bool(self._params(request).get(MARK))

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        meta = KvgraftMetadata()
        progress: list[tuple[str, int]] = []
        for req in scheduler_output.scheduled_new_reqs:
            plan = self._to_load.pop(req.req_id, None)
            if plan is not None:
                plan.block_ids = list(req.block_ids[0])
                meta.loads.append(plan)
            progress.append((req.req_id, req.num_computed_tokens))
        cached = scheduler_output.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            plan = self._to_load.pop(rid, None)
            if plan is not None and rid in cached.resumed_req_ids and cached.new_block_ids[i] is not None:
                plan.block_ids = list(cached.new_block_ids[i][0])  # a resumed request's block ids are all new
                meta.loads.append(plan)
            progress.append((rid, cached.num_computed_tokens[i]))
        if self._deposit != "none":
            for rid, computed in progress:
                request = self._requests.get(rid)
                if request is None or rid in self._deposited or not self._wants_deposit(request):
                    continue
                prompt = list(request.prompt_token_ids or [])
                if computed + scheduler_output.num_scheduled_tokens.get(rid, 0) < len(prompt):
                    continue  # the prompt's prefill ends in a later step
                self._deposited.add(rid)
                n = len(prompt) // self._block_size * self._block_size
                if self._params(request).get(MARK) == PROMPT:
                    n = len(prompt)
                if n == 0 or n <= self._loaded.get(rid, 0):
                    continue  # nothing whole to deposit, or exactly what was grafted
                assert self._kv_cache_manager is not None
                block_ids = list(self._kv_cache_manager.get_block_ids(rid)[0][: -(-n // self._block_size)])
                meta.saves.append(SaveEntry(rid, prompt[:n], block_ids))
        return meta

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        """Forget the request; what kvgraft did with it goes into its response's kv_transfer_params (vLLM's server
        returns them in the completion's JSON): {"kvgraft_grafted": {"artifact", "tokens"}}, {"kvgraft_refused":
        [{"artifact", "tokens", "first_difference", "differences"}]}, {"kvgraft_invalid": why}, {"kvgraft_cached":
        {"artifact", "tokens", "cached_tokens", "why"}} (a named artifact whose blocks vLLM's prefix cache already
        held: not read, nothing loaded), or None."""
        rid = request.request_id
        out: dict[str, Any] = {}
        if rid in self._invalid:
            out[INVALID] = self._invalid.pop(rid)
        if rid in self._refused:
            out[REFUSED] = self._refused.pop(rid)
        if rid in self._loaded and self._admitted.get(rid):
            out[GRAFTED] = {"artifact": self._admitted[rid], "tokens": self._loaded[rid]}
        elif rid in self._cached:
            out[CACHED] = self._cached[rid]
            self._note("cached", request=rid, **{k: v for k, v in self._cached[rid].items() if k != "why"})
        for table in (self._requests, self._matches, self._to_load, self._loaded, self._params_of, self._admitted,
                      self._cached):
            table.pop(rid, None)
        self._deposited.discard(rid)
        return False, out or None

    # ------------------------------------------------------------------ worker side
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """Learn the layers (order, kind, window), the kernel's block layout and this engine's identity."""
        from vllm.model_executor.models.utils import extract_layer_index

        ctx = self._vllm_config.compilation_config.static_forward_context
        self._caches = dict(kv_caches)
        self._order = sorted(kv_caches, key=extract_layer_index)
        layout = []
        for name in self._order:
            impl = ctx[name].impl
            window = getattr(impl, "sliding_window", None)
            window = None if window in (None, -1) else int(window)
            layout.append({"kind": "full" if window is None else "sliding", "window": window})
        first = ctx[self._order[0]]
        cache = kv_caches[self._order[0]]
        isa = str(getattr(first, "isa", "unknown"))
        dtype = cache.dtype
        impl = first.impl
        computes = dtype_name(self._vllm_config.model_config.dtype)
        if computes != dtype_name(dtype):  # checked before the probe (an FP8 cache quantises)
            raise IncompatibleError(f"KvgraftConnector: the KV cache holds {dtype_name(dtype)}, the model computes "
                                    f"in {computes}; set kv_cache_dtype='auto'")
        t_probe = time.perf_counter()
        learned: dict[tuple, LearnedLayout] = {}  # one probe per distinct (shape, dtype, strides, device, writer)
        for name in self._order:
            layer, c = ctx[name], kv_caches[name]
            if c.dim() != 4 or c.shape[2] != self._block_size:
                raise IncompatibleError(f"KvgraftConnector: layer {name} cache has shape {tuple(c.shape)}; expected "
                                        f"(blocks, kv_heads, {self._block_size}, 2 * head_dim)")
            key = (tuple(c.shape[1:]), c.dtype, c.stride(), str(c.device), type(layer.impl).__name__,
                   str(getattr(layer, "isa", None) or type(layer.impl).__name__))  # a GPU backend: its class
            if key not in learned:
                def writer(k: torch.Tensor, v: torch.Tensor, kc: torch.Tensor, s: torch.Tensor,
                           layer: Any = layer) -> None:
                    layer.impl.do_kv_cache_update(layer, k, v, kc, s)  # the attention backend's own cache writer

                learned[key] = self_test(writer, c, self._block_size, key[-1])
            self._paged[name] = learned[key]
        probe_s = time.perf_counter() - t_probe
        kv_layout = "; ".join(dict.fromkeys(x.recorded for x in self._paged.values()))  # layer order, once each
        mc = self._vllm_config.model_config
        folder = Path(mc.model)
        # CPU_ATTN as recorded since the first artifacts; any other backend by its implementation's class name
        attn = "CPU_ATTN" if cache.device.type == "cpu" else type(impl).__name__
        settings = engine_settings(self._vllm_config, torch.get_num_threads(), isa, kv_layout, attn)
        t0 = time.perf_counter()
        self._identity = EngineIdentity(
            model_fingerprint=model_fingerprint(folder), tokenizer_fingerprint=tokenizer_fingerprint(folder),
            settings=settings, environment=current_environment(cache.device).to_dict(), layout=layout,
            model_name=str(self._kv_transfer_config.get_from_extra_config("model_name", folder.name)),
        )
        logger.info("kvgraft: %d layers, paged layout %s learned from the cache writer in %.2f s (%d probe%s; %s), "
                    "isa %s, model %s (fingerprinted in %.1f s)", len(layout), kv_layout, probe_s, len(learned),
                    "" if len(learned) == 1 else "s",
                    "view: fast path" if all(x.view is not None for x in learned.values()) else "gather/scatter",
                    isa, self._identity.model_fingerprint[:12], time.perf_counter() - t0)

    def get_handshake_metadata(self) -> KVConnectorHandshakeMetadata | None:
        return IdentityHandshake(self._identity) if self._identity is not None else None

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, KvgraftMetadata)
        for entry in meta.loads:
            self._load(entry)

    def _load(self, entry: LoadEntry) -> None:
        assert self._identity is not None and self._paged
        n, bs = len(entry.token_ids), self._block_size
        refusals = []
        for aid in entry.candidates:  # admitted by the scheduler side; checked again here, on the bytes written
            snap, why = check_candidate(self._store, aid, self._identity, entry.token_ids, entry.start)
            if snap is None:
                refusals.append(f"artifact {aid[:16]} refused: {'; '.join(why)}")
                continue
            t0 = time.perf_counter()
            self._write(snap, entry)
            self._note("graft", request=entry.req_id, artifact=aid, tokens=n, loaded_from=entry.start,
                       seconds=round(time.perf_counter() - t0, 4))
            return
        self._failed.update(entry.block_ids[entry.start // bs : n // bs])
        line = (f"kvgraft: request {entry.req_id}: no artifact admitted for its first {n} tokens, nothing grafted "
                f"(refused at load, after admission: kv_load_failure_policy={self._policy}): " + " | ".join(refusals))
        logger.error(line)
        self._note("refused", request=entry.req_id, tokens=n, candidates=entry.candidates, reasons=refusals,
                   at="load", policy=self._policy)

    def _write(self, snap: Snapshot, entry: LoadEntry) -> None:
        assert self._paged
        n, start, total = len(entry.token_ids), entry.start, snap.token_count
        for name, lyr in zip(self._order, snap.layers, strict=True):
            cache = self._caches[name]
            first = total - lyr.keys.shape[2]  # the layer holds positions [first, total); n <= total
            lo = min(max(start, first), n)
            self._paged[name].zero(cache, entry.block_ids, start, lo)  # outside a sliding window: never attended
            self._paged[name].write(cache, entry.block_ids, lo, lyr.keys[:, :, lo - first : n - first],
                              lyr.values[:, :, lo - first : n - first])

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # every load completes in start_load_kv, before the forward pass

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: AttentionMetadata,
                      **kwargs: Any) -> None:
        return  # deposits read all layers after the step (wait_for_save)

    def wait_for_save(self) -> None:
        if not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        assert isinstance(meta, KvgraftMetadata)
        for entry in meta.saves:
            try:
                self._save(entry)
            except KVStoreError as e:  # a deposit that cannot be made is reported, never half-written
                logger.error("kvgraft: request %s: deposit of %d tokens failed: %s", entry.req_id,
                             len(entry.token_ids), e)
                self._note("deposit_failed", request=entry.req_id, tokens=len(entry.token_ids), reason=str(e))
            except Exception as e:  # noqa: BLE001 - nor is a store that fails otherwise (read-only, gone) fatal
                logger.error("kvgraft: request %s: deposit of %d tokens failed: %s: %s", entry.req_id,
                             len(entry.token_ids), type(e).__name__, e)
                self._note("deposit_failed", request=entry.req_id, tokens=len(entry.token_ids),
                           reason=f"{type(e).__name__}: {e}")

    def _save(self, entry: SaveEntry) -> None:
        assert self._identity is not None and self._paged
        me, n, t0 = self._identity, len(entry.token_ids), time.perf_counter()
        layers = []
        for name, kind in zip(self._order, me.layout, strict=True):
            held = cached_tokens(kind["kind"], kind["window"], n)
            k, v = self._paged[name].read(self._caches[name], entry.block_ids, n - held, n)
            layers.append(LayerKV(kind["kind"], kind["window"], n, k, v))
        snap = Snapshot(token_ids=list(entry.token_ids), start_position=0, layers=layers,
                        model_fingerprint=me.model_fingerprint, tokenizer_fingerprint=me.tokenizer_fingerprint,
                        dtype=me.settings["dtype"], determinism=dict(me.settings), environment=dict(me.environment),
                        model_name=me.model_name)
        check_snapshot(snap)
        aid = self._store.put(snap)
        self._note("deposit", request=entry.req_id, artifact=str(aid), tokens=n, bytes=snap.nbytes(),
                   seconds=round(time.perf_counter() - t0, 4))

    def get_block_ids_with_load_errors(self) -> set[int]:
        out, self._failed = self._failed, set()
        return out


def journal(path: str | os.PathLike) -> list[dict]:
    """The events a connector journaled (deposit, graft, refused, deposit_failed), in order."""
    p = Path(path)
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]
