"""Issue 61, items 1-4 (kvstore): no record that nobody measured, no identity erased by a switch, and the way back.

Item 3: a numerics record is written only from a measurement issued by the capture that computed the bytes
(kvstore/format/measured.py): every put refuses a `numerics:` tag, and a record built by hand, copied, read from
another store or attached to bytes changed after capture is not written. Item 2: an environment record is read by its
format: an empty one, or one missing a binding field, is a difference on every backend. Item 1: vLLM's own switch
(`batch_invariant` in its settings) does not leave the CPU/GPU names out of the comparison: only a numerics
fingerprint measured on both sides does. Item 4: `kvstore reverify` recomputes with the artifact's own model and
recorded settings (the batch-invariant mode included), and refuses a flag or a model that contradicts the record.
Each test fails at 7180e3a (said per test)."""

from __future__ import annotations

import copy
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from kvstore import (
    Determinism,
    Facts,
    KVStoreError,
    LocalStore,
    MemoryStore,
    NumericsRecord,
    admission_differences,
    both_invariant,
    environment_differences,
    load_backend,
    to_bytes,
)
from kvstore.backends.fake import FakeBackend
from kvstore.backends.transformers import TransformersBackend

IDS = [2] + [4 + (7 * i) % 200 for i in range(23)]
REPO = Path(__file__).resolve().parents[2]
FORGED = "numerics:" + "f" * 64


@pytest.fixture(params=["memory", "local"])
def store(request, tmp_path):
    return MemoryStore() if request.param == "memory" else LocalStore(tmp_path / "store")


# ------------------------------------------------------------------------------------------------ item 3
def test_no_put_writes_a_numerics_tag_given_as_a_string(tiny_gemma3, store):
    """At 7180e3a put_bytes / put / put_many recorded the tag as given (the acceptance's 'forged-tag recorded')."""
    snap = TransformersBackend.of(tiny_gemma3).deposit(IDS)
    data = to_bytes(snap)
    for put in (lambda: store.put_bytes(data, tags=[FORGED]), lambda: store.put(snap, tags=[FORGED]),
                lambda: store.put_many([data], tags=[FORGED]), lambda: store.put_many([snap], tags=["x", FORGED])):
        with pytest.raises(KVStoreError, match="is a numerics record, not a free tag"):
            put()
    assert len(store) == 0  # refused before anything was written
    aid = store.put_bytes(data)
    with pytest.raises(KVStoreError, match="not a measurement this process issued"):
        store.record_numerics(aid, "f" * 64)  # a fingerprint string is a claim
    assert store.numerics_record(aid).fingerprints == ()


def test_a_record_not_issued_for_these_bytes_is_not_written(tiny_gemma3, store):
    """At 7180e3a a NumericsRecord(measured=True) built by hand, and a capture edited after the fact (+0.05 on every
    key and value: the issue's fabricated KV), were recorded with this machine's fingerprint."""
    fp = tiny_gemma3.numerics_sha256
    captured = TransformersBackend.of(tiny_gemma3).deposit(IDS)
    forged = TransformersBackend.of(tiny_gemma3).deposit(IDS)
    for layer in forged.layers:  # the capture's own record, on bytes it did not compute
        layer.keys += 0.05
        layer.values += 0.05
    copied = dataclasses.replace(captured, extra={"copy": 1})
    copied.numerics = copy.copy(captured.numerics)  # a copy of the issued measurement is not the issued one
    hand = dataclasses.replace(captured, extra={"hand": 1})
    hand.numerics = NumericsRecord((fp,), "made by hand")
    for snap in (forged, copied, hand):
        aid = store.put(snap)
        assert store.numerics_record(aid).fingerprints == (), snap.extra
    aid = store.put(captured)  # the capture that measured it: recorded
    assert store.numerics_record(aid).fingerprints == (fp,)
    other = MemoryStore()  # read from one store, put into another: a claim there
    assert other.numerics_record(other.put(store.get(aid))).fingerprints == ()
    again = copy.deepcopy(captured)  # as a worker's capture pickled back to its parent: not issued in this process
    assert other.numerics_record(other.put(again)).fingerprints == ()


# ------------------------------------------------------------------------------------------------ item 2
def test_an_empty_environment_record_is_a_difference_on_the_fake_backend():
    """At 7180e3a `environment={}` was read as a legacy record and admitted with no difference (the acceptance's
    'empty-env differences 0')."""
    be = FakeBackend({"x": "y"})
    ids = be.encode("Problem: hello there\n")
    st, _ = be.prefill(ids)
    snap = be.capture(st, ids)
    s = MemoryStore()
    intact = s.get(s.put(snap))
    assert admission_differences(intact, Facts.of(be), ids) == []  # its own record: admitted
    emptied = s.get(s.put(dataclasses.replace(snap, environment={})))
    [d] = admission_differences(emptied, Facts.of(be), ids)
    assert d.fact == "environment" and "environment.format: artifact <empty record>" in d.message


@pytest.mark.parametrize("backend", ["transformers", "llamacpp", "vllm"])
def test_a_record_missing_a_binding_field_of_its_format_is_a_difference(backend):
    """The kvgraft-env/1 record (transformers, llama.cpp and vLLM's connector record it): each field removed is
    named. At 7180e3a a record without `format` skipped every fact it lacked."""
    from kvstore.environment import ENVIRONMENT_FIELDS, ENVIRONMENT_FORMAT, current_environment

    now = current_environment().to_dict()
    assert now["format"] == ENVIRONMENT_FORMAT
    for key in ENVIRONMENT_FIELDS[ENVIRONMENT_FORMAT]:
        partial = {k: v for k, v in now.items() if k != key}
        assert environment_differences(partial, now) == [
            f"environment.{key}: artifact '<not recorded>', this process {now[key]!r}"], (backend, key)
    no_format = {k: v for k, v in now.items() if k != "format"}  # read as the record of before kvgraft-env/1
    assert "environment.cpu_vendor" not in str(environment_differences(no_format, now))  # it holds them all...
    stripped = {k: v for k, v in no_format.items() if k not in ("cpu_vendor", "torch_threads")}
    diffs = environment_differences(stripped, now)  # ...and one that lacks what that format never held is refused
    assert [d.split(":")[0] for d in diffs] == ["environment.cpu_vendor", "environment.torch_threads"]
    assert environment_differences({**now, "format": "kvgraft-env/9"}, now)[0].startswith(
        "environment.format: artifact 'kvgraft-env/9'")


# ------------------------------------------------------------------------------------------------ item 1
BASE = dict(format="kvgraft-env/1", device_kind="cuda", machine="x86_64", cpu_vendor="GenuineIntel",
            cpu_model="Intel Xeon", aten_cpu_capability="AVX512", mkl_cbwr=None, onednn_max_cpu_isa=None,
            torch="2.9.0", transformers="5.0", torch_threads=16, python="3.11", profile="native",
            gpu_capability="9.0", cuda="12.8", cudnn=None, cublas=None, driver="570.1",
            device_name="NVIDIA H100 80GB HBM3")
OTHER = dict(BASE, cpu_vendor="AuthenticAMD", cpu_model="AMD EPYC", device_name="NVIDIA H200")


def test_vllms_own_switch_does_not_erase_the_machines_identity():
    """At 7180e3a both_invariant of two vLLM records with batch_invariant True dropped CPU vendor, model and GPU name:
    no difference (the acceptance's 'vllm-switch differences 0')."""
    rec = {"backend": "vllm", "batch_invariant": True}
    assert not both_invariant(rec, dict(rec))
    assert len(environment_differences(BASE, OTHER, both_invariant(rec, dict(rec)))) == 3
    # the same through the admission: vLLM's Facts measure no numerics
    mode = {"batch_invariant": True, "backend": "transformers"}
    fp = "a" * 64
    assert not both_invariant(mode, mode, (None, fp)) and not both_invariant(mode, mode, (fp, None))
    assert not both_invariant(mode, mode, (fp, "b" * 64))
    assert both_invariant(mode, mode, (fp, fp))  # the mode's fingerprint measured on both sides: the evidence
    assert environment_differences(BASE, OTHER, both_invariant(mode, mode, (fp, fp))) == []


def test_vllm_facts_with_the_switch_on_compare_every_identity_field():
    be = FakeBackend({"x": "y"})
    ids = be.encode("Problem: hello there\n")
    st, _ = be.prefill(ids)
    snap = be.capture(st, ids)
    snap = dataclasses.replace(snap, determinism={**snap.determinism, "batch_invariant": True}, environment=BASE)
    snap.numerics = NumericsRecord((), "a store")
    me = dataclasses.replace(Facts.of(be), settings={**be.settings(), "batch_invariant": True}, environment=OTHER)
    [d] = admission_differences(snap, me, ids)
    assert d.fact == "environment" and "cpu_vendor" in d.message and "device_name" in d.message


# ------------------------------------------------------------------------------------------------ item 4
def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvstore.cli", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=600)


def test_reverify_takes_the_model_and_the_mode_from_the_record(tmp_path):
    """At 7180e3a reverify recomputed with the 270M (no --model) or outside the mode: DIFFERS, blaming the bytes."""
    be = load_backend("transformers", source="tiny-gemma3", determinism=Determinism(batch_invariant=True))
    store = LocalStore(tmp_path / "store")
    aid = store.put_bytes(to_bytes(TransformersBackend.of(be.fm).deposit(IDS)))  # bytes only: no record
    assert store.numerics_record(aid).fingerprints == ()
    r = _cli("--store", str(store.root), "reverify", aid)  # no --model, no mode flag: the record's
    assert r.returncode == 0 and f"SAME    {aid}: reproduced byte for byte here" in r.stdout, r.stdout + r.stderr
    assert LocalStore(store.root).numerics_record(aid).fingerprints == (be.numerics(),)
    r = _cli("--store", str(store.root), "reverify", aid, "--threads", "1")
    assert r.returncode == 2 and "--threads 1 contradicts its recorded determinism.threads 2" in r.stderr, r.stderr
    r = _cli("--store", str(store.root), "--model", "tiny-llama", "reverify", aid)
    assert r.returncode == 2 and "nothing recomputed: give --model with the artifact's own model" in r.stderr
    assert "DIFFERS" not in r.stdout


def test_the_measurement_is_issued_in_one_place():
    """The capability is held by the measuring code: only the transformers capture imports `issue` (a new caller
    is a new door, and must be argued for here)."""
    import re

    callers = sorted(str(p.relative_to(REPO)) for top in ("kvstore", "harness", "scripts")
                     for p in (REPO / top).rglob("*.py")
                     if re.search(r"from kvstore\.format\.measured import[^\n]*\bissue\b|measured\.issue\(",
                                  p.read_text(encoding="utf-8")))
    assert callers == ["kvstore/backends/transformers/capture.py"]
