"""The batch-invariant mode's kernel version is part of its recorded determinism (issue 58, item 2): an artifact of the
mode made by another version of its kernel (one recorded before versions ran the MKL-tile kernel, UNVERSIONED_KERNEL)
is refused at admission in one line naming it, never assumed, and records made under the unversioned kernel keep
their bytes (the version is recorded only when it is not that one). And every other variable that moves MKL's,
oneDNN's or ATen's bits is recorded in the environment when set (absent = unset), so the records of a process
without any are byte for byte what they were."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvstore import (
    KERNEL_RECORD,
    UNVERSIONED_KERNEL,
    Determinism,
    IncompatibleError,
    LocalStore,
    recorded_kernel,
)
from kvstore.backends.transformers import TransformersBackend, invariant
from kvstore.backends.transformers.model import load_frozen_model
from kvstore.engine.admission import settings_differences
from kvstore.engine.verify import graft_logits
from kvstore.environment import RECORDED_VARIABLES, environment_differences, environment_id

REPO = Path(__file__).resolve().parents[2]
IDS = [2] + [4 + (7 * i) % 200 for i in range(40)]
NEW = "fixed-dot16/1"


def _mode() -> TransformersBackend:
    return TransformersBackend.of(load_frozen_model("tiny-gemma3", Determinism(batch_invariant=True,
                                                                                  prefill_chunk=0)))


def test_the_unversioned_kernel_records_what_the_mode_recorded_before(monkeypatch):
    monkeypatch.setattr(invariant, "KERNEL", UNVERSIONED_KERNEL)
    be = _mode()
    assert be.settings() == be.fm.determinism.to_dict()  # no kernel key: the bytes, ids and keys made before
    assert recorded_kernel(be.settings()) == UNVERSIONED_KERNEL
    assert recorded_kernel(Determinism().to_dict()) is None  # the default mode has no kernel of the mode


def test_a_new_kernel_is_recorded_with_the_mode_and_its_artifacts(monkeypatch):
    monkeypatch.setattr(invariant, "KERNEL", NEW)
    be = _mode()
    assert be.settings()[KERNEL_RECORD] == NEW
    assert TransformersBackend.of(be.fm).deposit(IDS[:20]).determinism[KERNEL_RECORD] == NEW
    assert Determinism.from_dict(be.settings()) == be.fm.determinism  # a recorded fact, not a setting
    off = TransformersBackend.of(load_frozen_model("tiny-gemma3", Determinism(prefill_chunk=0)))
    assert KERNEL_RECORD not in off.settings()  # the default mode records no kernel of the mode


def test_an_artifact_of_the_unversioned_kernel_is_refused_by_a_new_kernel_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(invariant, "KERNEL", UNVERSIONED_KERNEL)
    old = _mode()
    store = LocalStore(tmp_path / "store")
    aid = store.put(TransformersBackend.of(old.fm).deposit(IDS[:30]))
    assert KERNEL_RECORD not in store.get(aid).determinism
    graft_logits(old, IDS[:30], IDS[30:], store=store, artifact_id=aid)  # the same kernel: admitted
    monkeypatch.setattr(invariant, "KERNEL", NEW)
    new = _mode()
    with pytest.raises(IncompatibleError, match=f"determinism.{KERNEL_RECORD}: artifact '{UNVERSIONED_KERNEL}', "
                                                f"this process '{NEW}'") as e:
        graft_logits(new, IDS[:30], IDS[30:], store=store, artifact_id=aid)
    assert "\n" not in str(e.value)


def test_kernels_are_compared_only_between_records_of_the_mode():
    mode = {"batch_invariant": True, "threads": 2}
    assert settings_differences(mode, {**mode, KERNEL_RECORD: NEW}) == [
        f"determinism.{KERNEL_RECORD}: artifact '{UNVERSIONED_KERNEL}', this process '{NEW}' (another version of "
        "the mode's kernel computes other bits)"]
    assert settings_differences({**mode, KERNEL_RECORD: NEW}, {**mode, KERNEL_RECORD: NEW}) == []
    assert settings_differences(mode, mode) == []
    assert settings_differences({"threads": 2}, {"threads": 2, KERNEL_RECORD: NEW}) == []  # not the mode: no kernel


# --------------------------------------------------------------------------------- variables that move the bits
def test_every_variable_that_moves_mkls_bits_is_pinned_or_recorded():
    from kvstore.environment import KERNEL_VARIABLES

    covered = set(KERNEL_VARIABLES) | set(RECORDED_VARIABLES)
    for name in ("MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA",
                 "DNNL_MAX_CPU_ISA", "MKL_NUM_THREADS", "MKL_DYNAMIC", "ONEDNN_DEFAULT_FPMATH_MODE"):
        assert name in covered, name


def _environment(**variables: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in RECORDED_VARIABLES}
    env.update(variables, PYTHONPATH=str(REPO))
    code = "import json; from kvstore.environment import current_environment; " \
           "print(json.dumps(current_environment().to_dict()))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                         check=True)
    return json.loads(out.stdout)


def test_mkl_enable_instructions_is_recorded_and_binds_and_absent_records_as_before():
    plain, avx2 = _environment(), _environment(MKL_ENABLE_INSTRUCTIONS="AVX2")
    assert "variables" not in plain  # a process without any: the record every environment had before
    assert avx2["variables"] == {"MKL_ENABLE_INSTRUCTIONS": "AVX2"}
    assert environment_id(plain) != environment_id(avx2)
    assert environment_differences(plain, avx2) == [
        "environment.variables.MKL_ENABLE_INSTRUCTIONS: artifact None, this process 'AVX2'"]
    assert environment_differences(avx2, avx2) == []
