"""The vLLM backend: the admission check on synthetic
artifacts, and the KvgraftConnector in a real vLLM engine (tests/kvstore/vllm_cases.py, run inside .venv-vllm
once for the module: one engine start): a graft equals the engine's own prefix-cache hit byte for byte; a
tampered, a foreign-model, a foreign-settings and a foreign-layout artifact are each refused at admission in one
line, nothing grafted, the prompt computed and the refusal named in the request's output (kv_transfer_params). The registered
backend (kvstore.load_backend("vllm"), tests/kvstore/vllm_backend_cases.py, one more engine start): the harness's
decode after a graft gives the rows of its in-context twin bit for bit (greedy and seeded samples), a foreign
artifact is refused before the engine sees it. The engine tests skip (one line, why) where .venv-vllm does not
exist; `make setup-vllm` builds it. The exactness figures across engines: scripts/verify_vllm.py.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from kvstore.backends import backend_names, settings_class
from kvstore.backends.vllm.identity import EngineIdentity
from kvstore.backends.vllm.settings import VllmBackendSettings
from kvstore.engine.admission import admission_differences
from kvstore.format.artifact import LayerKV, NumericsRecord, Snapshot

# the name artifacts record as determinism.kv_layout for vLLM's "vec" CPU kernel (kvstore.backends.vllm.paged.VIEWS)
VEC_LAYOUT = "cpu_attn/blocks,heads[keys(head_dim,block);values(block,head_dim)]"


def _identity_and_snapshot() -> tuple[EngineIdentity, Snapshot]:
    layout = [{"kind": "sliding", "window": 512}, {"kind": "full", "window": None}]
    settings = {"backend": "vllm", "threads": 2, "deterministic_algorithms": False, "attn_implementation": "CPU_ATTN",
                "dtype": "bfloat16", "prefill_chunk": 8192, "block_size": 128, "batch_invariant": False,
                "kv_layout": VEC_LAYOUT}
    env = {"format": "kvgraft-env/1", "device_kind": "cpu", "cpu_model": "AMD EPYC", "torch_threads": 2}
    me = EngineIdentity("a" * 64, "b" * 64, settings, env, layout, "m")
    kv = torch.zeros(1, 1, 128, 4, dtype=torch.bfloat16)
    snap = Snapshot(list(range(128)), 0, [LayerKV("sliding", 512, 128, kv, kv), LayerKV("full", None, 128, kv, kv)],
                    "a" * 64, "b" * 64, "bfloat16", dict(settings), dict(env), "m")
    return me, snap


def test_admission_admits_a_matching_artifact() -> None:
    me, snap = _identity_and_snapshot()
    assert admission_differences(snap, me.facts()) == []


@pytest.mark.parametrize(("change", "named"), [
    (lambda s: dataclasses.replace(s, model_fingerprint="c" * 64), "model fingerprint cccccccccccc differs"),
    (lambda s: dataclasses.replace(s, tokenizer_fingerprint="c" * 64), "tokenizer fingerprint cccccccccccc"),
    (lambda s: dataclasses.replace(s, determinism={**s.determinism, "block_size": 64}),
     "determinism.block_size: artifact 64, this process 128"),
    (lambda s: dataclasses.replace(s, determinism={**s.determinism, "batch_invariant": True}),
     "determinism.batch_invariant: artifact True, this process False"),
    (lambda s: dataclasses.replace(s, layers=[dataclasses.replace(s.layers[0], window=1024), s.layers[1]]),
     "layout: 2 layers vs 2, first difference at layer 0"),
    (lambda s: dataclasses.replace(s, environment={**s.environment, "cpu_model": "Intel Xeon"}),
     "environment.cpu_model: artifact 'Intel Xeon', this process 'AMD EPYC'"),
    (lambda s: dataclasses.replace(s, determinism={k: v for k, v in s.determinism.items() if k != "backend"}),
     "deposited by"),
    (lambda s: dataclasses.replace(s, numerics=NumericsRecord(("e" * 64,), "a store")),  # issue 51: the connector's
     "its numerics record names fingerprint eeee"),                                     # admission reads it too
], ids=["model", "tokenizer", "block_size", "batch_invariant", "layout", "environment", "backend", "numerics"])
def test_admission_names_each_difference(change, named: str) -> None:  # noqa: ANN001
    me, snap = _identity_and_snapshot()
    why = [d.message for d in admission_differences(change(snap), me.facts())]  # the one admission, as a list
    assert why and any(named in line for line in why), why
    assert all("\n" not in line for line in why)


def test_the_vllm_backend_is_registered_with_a_settings_class_that_imports_no_engine() -> None:
    assert "vllm" in backend_names()
    assert settings_class("vllm") is VllmBackendSettings  # the harness's model.vllm schema comes from it


# ------------------------------------------------------------------ the connector in a real engine
@pytest.fixture(scope="module")
def cases(vllm_engine_cases) -> dict:  # noqa: ANN001  (tests/conftest.py: started once the suite is collected)
    return vllm_engine_cases.result("kvstore/vllm_cases.py")


@pytest.fixture(scope="module")
def backend_cases(vllm_engine_cases) -> dict:  # noqa: ANN001
    return vllm_engine_cases.result("kvstore/vllm_backend_cases.py")


@pytest.mark.integration
def test_engine_deposits_each_marked_prompt_as_whole_blocks(cases: dict) -> None:
    assert [e["tokens"] for e in cases["deposits"]] == [128] * 5  # 200-token prompts: one whole 128-token block
    assert len({e["artifact"] for e in cases["deposits"]}) == 5


@pytest.mark.integration
def test_graft_is_byte_identical_to_the_engines_own_prefix_cache_hit(cases: dict) -> None:
    good = cases["cases"]["good"]
    assert [e["event"] for e in good["events"]] == ["graft"] and good["events"][0]["tokens"] == 128
    assert good["graft"] is not None and good["graft"] == good["reference"]
    assert good["told"] == {"kvgraft_grafted": {"artifact": good["events"][0]["artifact"], "tokens": 128}}


@pytest.mark.integration
@pytest.mark.parametrize(("case", "named"), [
    ("tampered", "IntegrityError"),
    ("model", "model fingerprint"),
    ("settings", "determinism.batch_invariant: artifact True, this process False"),
    ("layout", "layout: 18 layers vs 18, first difference at layer 0: artifact {'kind': 'full', 'window': None}"),
])
def test_foreign_artifact_is_refused_in_one_line_and_never_grafted(cases: dict, case: str, named: str) -> None:
    c = cases["cases"][case]
    assert [e["event"] for e in c["events"]] == ["refused"], c["events"]  # no graft event: nothing written
    reasons = c["events"][0]["reasons"]
    assert len(reasons) == 1 and named in reasons[0] and "\n" not in reasons[0], reasons
    assert c["events"][0]["at"] == "admission"  # decided before the scheduler claimed a token: never loaded
    refused = c["told"]["kvgraft_refused"]  # the request's output names the artifact and the difference
    assert len(refused) == 1 and named in refused[0]["first_difference"]
    assert c["finish"] != "error" and c["sha"] is not None  # the prompt was computed, as without the artifact
    request = c["events"][0]["request"]
    lines = [ln for ln in cases["log"].splitlines() if f"request {request}: no artifact admitted" in ln]
    assert len(lines) == 1 and named in lines[0], "the refusal is logged as one line naming the difference"


@pytest.mark.integration
def test_recompute_policy_computes_a_refused_prefix_and_counts_the_refusal(cases: dict) -> None:
    c = cases["cases"]["recompute"]
    assert [e["event"] for e in c["events"]] == ["refused"] and c["events"][0]["policy"] == "recompute"
    assert "model fingerprint" in c["events"][0]["reasons"][0] and c["events"][0]["at"] == "admission"
    assert c["finish"] != "error" and c["sha"] is not None  # the request completed, on recomputed blocks


# ------------------------------------------------------------------ the registered backend (load_backend("vllm"))
@pytest.mark.integration
def test_registered_backend_names_vllm_and_its_version_in_its_settings(backend_cases: dict) -> None:
    assert backend_cases["is_backend"]  # kvstore.Backend (the runtime-checkable protocol)
    s = backend_cases["settings"]
    assert s["backend"] == "vllm" and s["vllm"] == backend_cases["version"] and s["dtype"] == "bfloat16"


@pytest.mark.integration
def test_registered_backend_captures_every_token_of_an_entry(backend_cases: dict) -> None:
    n = backend_cases["entry"]
    assert n == 200 and backend_cases["artifact_tokens"] == n  # a whole block and a partial one, all recorded
    assert all(h == n for h in backend_cases["held"])  # 200 < the 511 positions a sliding layer keeps


@pytest.mark.integration
@pytest.mark.parametrize("strategy", ["greedy", "sample"])
def test_registered_backend_graft_rows_equal_their_in_context_twins(backend_cases: dict, strategy: str) -> None:
    c = backend_cases[strategy]
    graft, incontext = c["graft"]["rows"], c["incontext"]["rows"]
    assert len(graft) == len(incontext) == (1 if strategy == "greedy" else 2)
    assert graft == incontext  # token ids, text, stop reason, counts and the first logits' SHA-256
    assert all(r["decode_tokens"] > 0 and r["stop_reason"] in ("eos", "stop", "length") for r in graft)
    events = [e["event"] for e in c["graft"]["events"]]
    # the connector loaded it once per row set; a later look-up of the same blocks finds them in vLLM's prefix cache
    # and says so (`cached`, issue 51: neither admitted nor refused silently)
    assert events[0] == "graft" and set(events[1:]) <= {"cached"}
    assert c["graft"]["events"][0]["tokens"] == 128  # whole blocks only; the engine computed the rest
    assert c["incontext"]["events"] == [] and c["cold"]["events"] == []  # neither twin nor cold grafts anything


@pytest.mark.integration
def test_registered_backend_refuses_a_foreign_artifact_before_the_engine_sees_it(backend_cases: dict) -> None:
    f = backend_cases["foreign"]
    assert f["refused"] is not None and "model fingerprint" in f["refused"] and "\n" not in f["refused"]
    assert f["events"] == []  # refused by the admission: never offered to the connector


@pytest.mark.integration
def test_registered_backend_names_the_entries_it_cannot_graft_and_refuses_them_in_the_same_words(
        backend_cases: dict) -> None:
    r = backend_cases["refusal"]
    assert r["200"] is None and r["640"] is None  # within the window; whole 128-token blocks
    assert "layer" in r["552"] and "at most 511 tokens" in r["552"] and "128-token blocks" in r["552"]
    assert r["graft_552"] is not None and r["graft_552"].endswith(r["552"]) and "\n" not in r["graft_552"]
    assert "graft" not in r["events"]  # the deposit is made; no graft ever reaches the connector


def _overflow_line(be, limit: int) -> str:  # noqa: ANN001
    """The refusal run.context_overflow=refuse gives on `be` for a 200-word problem and a budget 8 short of `limit`."""
    from harness.config.schema import compose_config, typed
    from harness.errors import ConfigError
    from harness.run.loop import fit_context
    from harness.task.problems import Problem

    c = typed(compose_config(["model=tiny_gemma3", f"decoding.max_new_tokens={limit - 8}"]))
    with pytest.raises(ConfigError) as caught:
        fit_context([Problem("long-1", " ".join(["seven"] * 200) + " What is 3+4?", "7")], be, c)
    return str(caught.value)


@pytest.mark.integration
def test_context_overflow_is_refused_on_vllm_in_the_line_transformers_gives(backend_cases: dict) -> None:
    """vLLM's context is its engine's max_model_len (the backend's context_size), so run.context_overflow=refuse
    refuses there as on transformers: the same line, only the numbers differ."""
    from kvstore import load_backend

    o = backend_cases["overflow"]
    assert o["context_size"] == VllmBackendSettings().max_model_len  # 8192: what the engine resolved
    assert o["refused"] is not None and "\n" not in o["refused"]
    tiny = load_backend("transformers", source="tiny-gemma3")
    tiny.fm.config.max_position_embeddings = 256
    transformers_line = _overflow_line(tiny, 256)
    numbers = re.compile(r"[0-9][0-9,]*")
    assert numbers.sub("N", o["refused"]) == numbers.sub("N", transformers_line), (o["refused"], transformers_line)
    assert "context of 8,192" in o["refused"] and "run.context_overflow=truncate" in o["refused"]


def test_a_journal_or_store_that_fails_under_the_engine_costs_at_most_its_request(cases: dict) -> None:
    # issue 41, finding 5: at a1b00c4 the first failing journal write or index lookup raised in the connector and
    # every later request got EngineDeadError
    f = cases["faults"]
    assert f["journal_deposit"] in ("length", "stop") and f["journal_next"] in ("length", "stop"), f
    assert f["store_lookup"] in ("length", "stop") and f["store_deposit"] in ("length", "stop"), f
    assert f["after"] in ("length", "stop"), f
    events = {e["event"] for e in f["store_events"]}
    assert "lookup_failed" in events and "deposit_failed" in events, f["store_events"]


@pytest.mark.integration
def test_problems_in_flight_on_vllm_graft_each_job_its_own_artifact_in_one_submission(backend_cases: dict) -> None:
    """Issue 42: generate_many (InEngineBatches.continue_many) sends three contexts at once, two of them grafting
    different artifacts: each job gets its own rows in job order, the connector loads both artifacts, and how many
    rows equal the same job decoded alone is recorded (vLLM on CPU is not batch-invariant: the harness marks such
    rows "rows depend on batch composition" and its twin check refuses to run on them)."""
    f = backend_cases["in_flight"]
    assert [len(rows) for rows in f["many"]] == [1, 1, 1]
    grafted = [e for e in f["events"] if e["event"] == "graft"]
    assert sorted({e["artifact"] for e in grafted}) == sorted(f["artifacts"])  # both loaded, each by its own job
    assert not [e for e in f["events"] if e["event"] in ("refused", "lookup_failed")], f["events"]
    # job order kept: each job's prefill is its own prompt less what its graft holds (200, 256, nothing)
    assert [rows[0]["prefill_tokens"] for rows in f["many"]] == [f["prompts"][0] - 200, f["prompts"][1] - 256,
                                                                 f["prompts"][2]]
    assert [rows[0]["prefill_tokens"] for rows in f["many"]] == [rows[0]["prefill_tokens"] for rows in f["alone"]]
    assert all(r[0]["decode_tokens"] > 0 and r[0]["stop_reason"] in ("eos", "stop", "length") for r in f["many"])


@pytest.mark.integration
def test_first_logits_digest_hashed_in_the_engine_equals_the_whole_vocabulary_logits_hash(backend_cases: dict) -> None:
    """Issue 42: the rows' first-logits SHA-256 is hashed inside the engine (kvstore.backends.vllm.digest) instead of
    the whole vocabulary coming back as logprobs; it must be the same hash of the same bytes, so no recorded row hash
    moves. One request asks for both (a cold prompt, a graft, three long prompts together past the 8,192-token
    prefill budget: the processor's last line per key is the sampled position's); a row decoded alone equals
    prefill's whole-vocabulary hash. (Two separate submissions of several prompts are not compared: vLLM's engine
    core may start a step before every request of a submission has arrived, so their batches can differ.)"""
    d = backend_cases["digests"]
    assert d["cold"]["engine"] == d["cold"]["prefill"] == d["cold"]["both"]["engine"][0]
    assert d["graft"]["engine"] == d["graft"]["prefill"] == d["graft"]["both"]["engine"][0]
    for case in (d["cold"]["both"], d["graft"]["both"], d["long"]):
        assert case["engine"] == case["logprobs"], case
        assert case["argmax"] == case["logits_argmax"] == [s[0] for s in case["sampled"]], case
        # every line of the request's window is one of its own keys, and every key has its line(s): the last one per
        # key is the digest taken (issue 51, item 7: `lines >= len(engine)` held whatever the lines were)
        assert case["lines"] == len(case["line_keys"]) and set(case["line_keys"]) == set(case["keys"]), case
    assert len(set(d["long"]["engine"])) == 3
    r = d["row"]  # a greedy row is one request (ROW_SCHEDULE): the digest is of its first token's position
    assert r["engine"] == r["prefill"] and r["first"] == r["argmax"], r
    assert r["tokens"] > 1 and 0 < r["ttft"] and "one request" in r["schedule"], r
    p = d["processor"]
    assert p["unchanged"] and p["step1"] == {"a": True, "c": True}
    assert p["step2_c_row0"] and p["step3_c_row1"] and not p["a_after_output"]
    assert "must be {'key': str, 'journal': str}" in p["refused"]


def test_the_connectors_admission_refuses_an_artifact_whose_numerics_record_it_cannot_confirm(tmp_path) -> None:
    """Issue 51: the connector's admission path (check_candidate, the scheduler's and the worker's) reads the store's
    numerics record with the artifact: a forged `numerics:` tag on a vLLM artifact is refused, never claimed."""
    pytest.importorskip("vllm", reason="needs .venv-vllm")
    import sqlite3

    from kvstore.backends.vllm.connector import check_candidate
    from kvstore.store.local import LocalStore

    me, snap = _identity_and_snapshot()
    snap.layers = [dataclasses.replace(lyr, keys=lyr.keys.clone(), values=lyr.values.clone()) for lyr in snap.layers]
    store = LocalStore(tmp_path / "store")
    aid = store.put(snap)
    got, why = check_candidate(store, aid, me, list(range(128)), 0)
    assert got is not None and why == []
    db = sqlite3.connect(store.index_path)
    db.execute("INSERT INTO tags VALUES (?, ?)", (aid, "numerics:" + "e" * 64))
    db.commit()
    db.close()
    got, why = check_candidate(store, aid, me, list(range(128)), 0)
    assert got is None and any("numerics record names fingerprint eeee" in w for w in why), why
