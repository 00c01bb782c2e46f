"""The llama.cpp backend on the bundled Gemma 3 270M GGUF: grafts through the store are byte-identical to the
fresh reference (same n_batch schedule), past the 512-token sliding window too, also when the artifact is
restored in another process; every admission check refuses naming the difference; an artifact never grafts
into another backend. Skipped (with the reason) where llama-cpp-python is not installed; `make setup` builds it."""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (make setup builds it)")

from kvstore import (  # noqa: E402
    LocalStore,
    check_graft,
    logits_sha256,
)
from kvstore.backends.llamacpp.backend import LlamaCppBackend  # noqa: E402
from kvstore.backends.llamacpp.settings import LlamaCppSettings  # noqa: E402
from kvstore.backends.llamacpp.state import serialize_state  # noqa: E402
from kvstore.errors import IncompatibleError  # noqa: E402

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
TEXT = "Problem: Find the number of ordered pairs of positive integers whose product is 2024. " * 30


@pytest.fixture(scope="module")
def be():
    b = LlamaCppBackend(LlamaCppSettings(n_ctx=1024, n_batch=256, n_ubatch=256))
    yield b
    b.close()


@pytest.fixture(scope="module")
def ids(be):
    out = be.encode(TEXT)
    assert len(out) > 600
    return out


@pytest.mark.parametrize("n", [24, 600])  # inside, and past, the 512-token sliding window
def test_a_graft_through_the_store_is_byte_identical_to_the_fresh_reference(be, ids, n, tmp_path):
    check = check_graft(be, ids[:n], be.encode(" The answer is", add_bos=False), store=LocalStore(tmp_path))
    assert check.equal and check.kl_max == 0.0 and check.argmax_agreement == 1.0, check.to_dict()
    snap = LocalStore(tmp_path).get(check.artifact_id)
    assert snap.determinism["backend"] == "llamacpp" and snap.dtype == "float16"
    kinds = [lyr.kind for lyr in snap.layers]
    assert kinds.count("full") == 3 and kinds.count("sliding") == 15  # Gemma 3: every 6th layer full
    assert {lyr.keys.shape[2] for lyr in snap.layers if lyr.kind == "sliding"} == {min(n, 512)}


_RESTORE = """
import json, sys
from kvstore import LocalStore, logits_sha256
from kvstore.backends.llamacpp.backend import LlamaCppBackend
from kvstore.backends.llamacpp.settings import LlamaCppSettings
from kvstore.engine.verify import graft_logits
root, aid, prefix, suffix = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
be = LlamaCppBackend(LlamaCppSettings(n_ctx=1024, n_batch=256, n_ubatch=256))
r = graft_logits(be, prefix, suffix, store=LocalStore(root), artifact_id=aid)
print(logits_sha256(r.logits))
"""


def _problem_ids(be) -> list[int]:
    """Real problem text (the repo's problem file): the repeated TEXT above happened to graft equal even in
    llama.cpp's own (unpadded) restore layout."""
    rows = [json.loads(line) for line in (REPO / "problems" / "kvgraft_original.jsonl").read_text().splitlines()]
    return be.encode("\n\n".join(f"Problem: {r['problem']}\nSolution: {r['solution']}" for r in rows[:12]))


def test_past_the_window_a_graft_lays_the_sliding_cache_out_as_a_fresh_prefill(be, tmp_path):
    """757 tokens at n_batch 256: the sliding cache's 512 unmasked cells restored from cell 0 (llama.cpp's
    own state layout) give other logits (measured max |diff| 0.75); with the placeholder cells that put
    position p in cell p, as the fresh prefill does, the graft is byte-identical."""
    ids, suffix = _problem_ids(be), be.encode(" The answer is", add_bos=False)
    check = check_graft(be, ids[:757], suffix, store=LocalStore(tmp_path), keep_logits=True)
    assert check.equal and check.kl_max == 0.0, check.to_dict()
    snap = LocalStore(tmp_path).get(check.artifact_id)
    blob = serialize_state(snap.layers, 757, snap.dtype, v_trans=True)  # llama.cpp's own layout, unpadded
    state = be.new_state()
    got = be.ll.llama_state_seq_set_data(be.ctx, (ctypes.c_uint8 * blob.size).from_buffer(blob), len(blob), 0)
    assert got == len(blob)
    state.tokens = list(ids[:757])
    unpadded = be.forward(suffix, state)
    assert logits_sha256(unpadded) != check.sha256_reference  # the layout is what makes it exact


def test_an_artifact_restored_in_another_process_gives_the_reference_bits(be, ids, tmp_path):
    prefix, suffix = ids[:560], be.encode(" so", add_bos=False)
    check = check_graft(be, prefix, suffix, store=LocalStore(tmp_path))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", _RESTORE, str(tmp_path), check.artifact_id, json.dumps(prefix),
                          json.dumps(suffix)], capture_output=True, text=True, env=env, timeout=600, check=True)
    assert out.stdout.strip().splitlines()[-1] == check.sha256_reference


def test_every_recorded_setting_and_the_gguf_are_admission_checks_naming_the_difference(be, ids):
    state, _ = be.prefill(ids[:40])
    snap = be.capture(state, ids[:40])
    for key, value, named in [("n_batch", 512, "determinism.n_batch: artifact 512, this process 256"),
                              ("flash_attn", True, "determinism.flash_attn"),
                              ("llama_cpp", "b0000", "determinism.llama_cpp: artifact 'b0000'"),
                              ("type_k", "float32", "determinism.type_k")]:
        bad = dataclasses.replace(snap, determinism={**snap.determinism, key: value})
        with pytest.raises(IncompatibleError, match=named):
            be.graft(bad)
    with pytest.raises(IncompatibleError, match="model fingerprint 000000000000 differs from the loaded model's"):
        be.graft(dataclasses.replace(snap, model_fingerprint="0" * 64))
    with pytest.raises(IncompatibleError, match="environment.cpu"):
        be.graft(dataclasses.replace(snap, environment={**snap.environment, "cpu": "another CPU"}))
    with pytest.raises(IncompatibleError, match="do not begin with the artifact's 40 tokens"):
        be.graft(snap, token_ids=ids[1:50])
    state = be.graft(snap, token_ids=ids[:50])  # after the refusals the context still grafts exactly
    assert be.seen(state) == 40


def test_an_artifact_never_grafts_into_another_backend(be, ids):
    from kvstore import load_backend

    state, _ = be.prefill(ids[:16])
    llama_snap = be.capture(state, ids[:16])
    tiny = load_backend("transformers", source="tiny-gemma3")
    with pytest.raises(IncompatibleError, match="deposited by the llamacpp backend, this is the transformers"):
        tiny.graft(llama_snap)
    cache, _ = tiny.prefill(tiny.encode("hello"))
    hf_snap = tiny.capture(cache, tiny.encode("hello"))
    with pytest.raises(IncompatibleError, match="deposited by the transformers backend, this is the llamacpp"):
        be.graft(hf_snap)


def test_an_old_state_handle_is_refused_once_the_context_holds_another(be, ids):
    old, _ = be.prefill(ids[:8])
    be.new_state()
    with pytest.raises(Exception, match="no longer the context's"):
        be.forward(ids[8:10], old)


@pytest.mark.slow
def test_the_position_sweep_on_llamacpp_reports_own_position_exact_and_other_offsets_refused(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "position_sweep.py"), "--backend", "llamacpp",
                           "--out", str(tmp_path), "--offsets", "1,100", "--prefix-tokens", "32",
                           "--suffix-tokens", "4"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "position_sweep.json").read_text())
    assert report["backend"] == "llamacpp" and report["exact_offsets"] == [0]
    assert report["refused_offsets"] == [1, 100]
    assert all("own position, the exact graft" in r["refused"] for r in report["offsets"][1:])
    assert "own position is exact and the only point grafted: offsets [1, 100] refused" in proc.stdout.splitlines()[-1]
