"""Issue 52: an artifact deposited in the batch-invariant mode moves between CPU kinds whose numerics fingerprint for
the mode is equal. Admission then compares the environment without the CPU's names (kvstore.environment.CPU_IDENTITY)
and takes the mode's measured fingerprint as the evidence: on "another machine kind" (this process presenting another
CPU name and instruction set; its kernels, so its fingerprint for the mode, are this machine's) the graft is admitted
and its logits equal the cold one-pass computation of the whole prompt, bit for bit. The default mode stays bound to
the CPU's names, and the mode on a machine whose fingerprint differs is refused, each in one line."""

from __future__ import annotations

import pytest
import torch

from kvstore import Determinism, EnvironmentMismatchError, LocalStore
from kvstore.backends.transformers import TransformersBackend
from kvstore.backends.transformers.capture import forward, new_cache
from kvstore.backends.transformers.model import load_frozen_model
from kvstore.engine.verify import graft_logits

IDS = [2] + [4 + (7 * i) % 200 for i in range(90)]  # past a 64-key block
SPLIT = 70


def _other_cpu(env: dict) -> dict:
    name = "AMD EPYC 9R45 (Zen 5)" if "9R45" not in str(env.get("cpu_model")) else "Intel(R) Xeon(R) Platinum"
    return {**env, "cpu_model": name, "device_name": name,
            "aten_cpu_capability": "AVX512" if env.get("aten_cpu_capability") != "AVX512" else "AVX2"}


def _deposited(mode: bool, tmp_path):
    fm = load_frozen_model("tiny-gemma3", Determinism(batch_invariant=mode, prefill_chunk=0))
    store = LocalStore(tmp_path / ("mode" if mode else "default"))
    return TransformersBackend.of(fm), store, store.put(TransformersBackend.of(fm).deposit(IDS[:SPLIT]))


def test_the_mode_grafts_on_another_cpu_kind_with_an_equal_fingerprint_and_equals_one_pass(tmp_path, monkeypatch):
    be, store, aid = _deposited(True, tmp_path)
    monkeypatch.setattr(be, "environment", lambda env=be.environment(): _other_cpu(env))  # the second machine kind
    got = graft_logits(be, IDS[:SPLIT], IDS[SPLIT:], store=store, artifact_id=aid).logits[0]
    one_pass = forward(be.fm, IDS, new_cache(be.fm))[0][SPLIT:]  # cold, the whole prompt at once
    assert torch.equal(got, one_pass)


def test_the_default_mode_stays_bound_to_the_cpus_names(tmp_path, monkeypatch):
    be, store, aid = _deposited(False, tmp_path)
    monkeypatch.setattr(be, "environment", lambda env=be.environment(): _other_cpu(env))
    with pytest.raises(EnvironmentMismatchError, match="environment.cpu_model") as e:
        graft_logits(be, IDS[:SPLIT], IDS[SPLIT:], store=store, artifact_id=aid)
    assert "\n" not in str(e.value)


def test_the_mode_on_a_cpu_whose_fingerprint_differs_is_refused(tmp_path, monkeypatch):
    be, store, aid = _deposited(True, tmp_path)
    monkeypatch.setattr(be, "environment", lambda env=be.environment(): _other_cpu(env))
    monkeypatch.setattr(be, "numerics", lambda: "f" * 64)  # its kernels compute the mode's bits otherwise
    # no equal fingerprint measured on both sides: the mode's exemption from the CPU's names does not apply (issue 61)
    with pytest.raises(EnvironmentMismatchError, match="environment.cpu_model") as e:
        graft_logits(be, IDS[:SPLIT], IDS[SPLIT:], store=store, artifact_id=aid)
    assert "\n" not in str(e.value)
