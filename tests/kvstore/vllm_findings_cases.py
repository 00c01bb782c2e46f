"""Issue 51 items 4, 5 and 9's connector finding, in .venv-vllm without an engine (run by
tests/kvstore/test_serve_findings.py::test_findings_in_vllm): the connector and the backend built around scripted
stand-ins for vLLM's scheduler request and vllm.LLM (a prefix cache of whole blocks). Prints one JSON line: case ->
"ok" or what went wrong."""

from __future__ import annotations

import itertools
import json
import tempfile
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

from kvstore.backends.vllm.backend import VllmBackend, VllmState, _check_first
from kvstore.backends.vllm.connector import KvgraftConnector
from kvstore.backends.vllm.digest import DIGEST, PROCESSOR, DigestReader
from kvstore.backends.vllm.launch import check_sync, engine_kwargs
from kvstore.backends.vllm.params import CACHED
from kvstore.backends.vllm.settings import VllmBackendSettings, VllmSettings
from kvstore.engine.protocol import RowsRequest
from kvstore.errors import IncompatibleError, KVStoreError, SettingsError

AID = "ab" * 32
BS = 128
TMP = Path(tempfile.mkdtemp(prefix="kvgraft-findings-"))


def connector() -> KvgraftConnector:
    c = object.__new__(KvgraftConnector)
    c._graft, c._graft_mode, c._block_size, c._journal, c._policy = True, "all", BS, None, "fail"
    c._store = SimpleNamespace(info=lambda aid: SimpleNamespace(token_count=256))
    c._identity = None
    for name in ("_requests", "_params_of", "_invalid", "_matches", "_admitted", "_refused", "_to_load", "_loaded",
                 "_cached"):
        setattr(c, name, {})
    c._deposited = set()
    return c


def named_artifact_already_cached_is_reported() -> None:
    c = connector()
    req = SimpleNamespace(request_id="r1", prompt_token_ids=list(range(300)),
                          kv_transfer_params={"kvgraft_graft": AID, "kvgraft_tokens": 256})
    assert c.get_num_new_matched_tokens(req, 256) == (0, False)
    _, out = c.request_finished(req, [])
    assert out is not None and out[CACHED]["artifact"] == AID and out[CACHED]["cached_tokens"] == 256, out


class FakeLLM:
    """vllm.LLM as the backend uses it: a prefix cache of whole blocks; each request's cached prefix recorded."""

    def __init__(self, vocab: int = 8) -> None:
        self.cache: set[tuple[int, ...]] = set()
        self.log: list[tuple[list[int], int, bool]] = []  # (prompt, tokens the cache held at submission, digest?)
        self.vocab, self.ids = vocab, itertools.count()
        self.told: dict | None = None

    def reset_prefix_cache(self) -> bool:
        self.cache.clear()
        return True

    def generate(self, prompts, params, use_tqdm=False):  # noqa: ANN001, ANN201
        outs = []
        for p, sp in zip(prompts, params, strict=True):
            ids = p["prompt_token_ids"]
            hit = 0
            while hit + BS <= len(ids) - 1 and tuple(ids[: hit + BS]) in self.cache:
                hit += BS
            ask = (sp.extra_args or {}).get(DIGEST)
            self.log.append((list(ids), hit, ask is not None))
            for k in range(BS, len(ids) + 1, BS):
                self.cache.add(tuple(ids[:k]))
            if ask is not None:
                with open(ask["journal"], "a") as f:
                    f.write(json.dumps({"key": ask["key"], "sha256": "s", "argmax": 3, "at": time.time()}) + "\n")
            table = [{i: SimpleNamespace(logprob=float(i)) for i in range(self.vocab)}]
            outs.append(SimpleNamespace(request_id=f"q{next(self.ids)}", prompt_token_ids=ids, kv_transfer_params=
                                        self.told, outputs=[SimpleNamespace(token_ids=[3, 1], finish_reason="length",
                                                                            logprobs=table)]))
        return outs


def backend() -> VllmBackend:
    be = object.__new__(VllmBackend)
    be.cfg, be.llm, be.journal, be._vocab, be._eos = VllmBackendSettings(), FakeLLM(), "", 8, set()
    be.digests, be._asks, be._nonce, be._epoch = DigestReader(str(TMP / f"d{time.time()}.jsonl")), itertools.count(), \
        "nonce1", 0
    return be


def backend_refuses_a_named_graft_without_an_outcome() -> None:
    be = backend()
    params = be.sampling_params(VllmState(list(range(300)), (AID, 256)), max_tokens=1)
    try:
        be._run([list(range(300))], [params])
        raise AssertionError("a named graft with no outcome reported was taken as grafted")
    except IncompatibleError:
        pass
    be.llm.told = {CACHED: {"artifact": AID, "tokens": 256}}
    be._run([list(range(300))], [params])


def entries() -> tuple[list[int], list[int], list[int], list[int]]:
    a, b = [1] + list(range(1000, 1299)), [1] + list(range(2000, 2299))
    return a, a + [5, 6, 7], b, b + [8, 9]


def inflight_incontext_entries_are_cached_when_the_wave_runs() -> None:
    be = backend()
    a, qa, b, qb = entries()
    sa, sb = be.prefill(a)[0], be.prefill(b)[0]  # each job's context set up in turn (complete_jobs)
    be.continue_many([RowsRequest(sa, qa, [0]), RowsRequest(sb, qb, [0])], max_new_tokens=2, eos=set())
    wave = [(ids, hit) for ids, hit, digest in be.llm.log if digest]
    assert [ids for ids, _ in wave] == [qa, qb], wave
    held = [hit for _, hit in wave]
    assert held == [len(a) // BS * BS, len(b) // BS * BS], f"the wave's rows found {held} tokens cached"


def single_job_incontext_prefills_once() -> None:
    be = backend()
    a, qa, _, _ = entries()
    sa = be.prefill(a)[0]
    be.continue_many([RowsRequest(sa, qa, [0])], max_new_tokens=2, eos=set())
    prefills = [ids for ids, _, digest in be.llm.log if not digest]
    assert prefills == [a], f"{len(prefills)} prefill requests"
    assert [hit for _, hit, digest in be.llm.log if digest] == [len(a) // BS * BS]


def digest_engine_runs_with_sync_scheduling() -> None:
    folder = TMP / "model"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text("{}")
    kw = engine_kwargs(VllmSettings(model=str(folder)), logits_processors=[PROCESSOR])
    assert kw["async_scheduling"] is False, kw


def engine_with_async_scheduling_is_refused() -> None:
    def llm(value):  # noqa: ANN001, ANN202
        return SimpleNamespace(llm_engine=SimpleNamespace(vllm_config=SimpleNamespace(
            scheduler_config=SimpleNamespace(async_scheduling=value))))

    check_sync(llm(False))
    for value in (True, None):
        try:
            check_sync(llm(value))
            raise AssertionError(f"async_scheduling={value} accepted")
        except SettingsError:
            pass


def greedy_request_without_a_token_is_refused() -> None:
    try:
        _check_first(SimpleNamespace(request_id="x", outputs=[SimpleNamespace(token_ids=[], finish_reason="abort")]), 5)
        raise AssertionError("a request without a token passed the argmax check")
    except KVStoreError:
        pass


def digest_keys_are_unique_per_backend() -> None:
    be = backend()
    be._first([list(range(10))], [VllmState()])
    be._greedy([list(range(10))], [VllmState()], 2, [], set())
    lines = [json.loads(x) for x in Path(be.digests.path).read_text().splitlines()]
    assert lines and all(x["key"].startswith("nonce1-") for x in lines), lines


def main() -> None:
    out = {}
    for name, fn in list(globals().items()):
        if callable(fn) and fn.__module__ == __name__ and name not in ("main", "connector", "backend", "entries") \
                and not isinstance(fn, type):
            try:
                fn()
                out[name] = "ok"
            except Exception:  # noqa: BLE001 - reported, case by case
                out[name] = traceback.format_exc()[-1500:]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
