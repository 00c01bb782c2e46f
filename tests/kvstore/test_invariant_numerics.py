"""Issue 52, then 58: the mode's numerics fingerprint hashes only kernels the mode runs, and names the mode's kernel
version (KERNEL). Its first battery (kvgraft-numerics-invariant/1) also hashed torch.softmax, whose bits differ
between ATen's AVX2 and AVX-512 builds; /2 measured the MKL sgemm tiles the mode ran until issue 58. The current
battery (/3) measures the mode's own fixed-order kernel: the same under both of ATen's builds on one machine; a record
made under /1 or /2 (other kernels) is refused, never assumed to be this machine's; another machine's is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kvstore import Determinism, EnvironmentMismatchError, LocalStore
from kvstore.backends.transformers import TransformersBackend
from kvstore.backends.transformers.invariant import (
    FORMER_NUMERICS_FORMATS,
    NUMERICS_FORMAT,
    former_numerics_fingerprints,
    numerics_fingerprint,
)
from kvstore.backends.transformers.model import load_frozen_model
from kvstore.engine.verify import graft_logits
from kvstore.environment import numerics_tag

REPO = Path(__file__).resolve().parents[2]
IDS = [2] + [4 + (7 * i) % 200 for i in range(40)]
DIMS = {"hidden": 64, "intermediate": 256, "heads": 4, "kv_heads": 2, "head_dim": 16, "vocab": 512}
_PROBE = ("import json, sys, torch; from kvstore.backends.transformers.invariant import numerics_fingerprint as f; "
          "d = json.loads(sys.argv[1]); print(torch.backends.cpu.get_cpu_capability(), "
          "f(d))")


def _probe(capability: str | None) -> list[str]:
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}
    env.pop("ATEN_CPU_CAPABILITY", None)
    if capability:
        env["ATEN_CPU_CAPABILITY"] = capability
    out = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(DIMS)], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=300, check=True)
    return out.stdout.split()


@pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() != "AVX512",
                    reason="this CPU has no AVX-512: ATen's AVX2 and AVX-512 builds cannot both run here")
def test_the_battery_is_the_same_under_atens_avx2_and_avx512_builds():
    wide, narrow = _probe(None), _probe("avx2")
    assert (wide[0], narrow[0]) == ("AVX512", "AVX2"), "the second process did not run ATen's AVX2 build"
    assert wide[1] == narrow[1], "the mode's battery hashes a kernel whose bits depend on ATen's vector width"


def test_the_battery_names_the_kernel_and_former_formats_are_refused(monkeypatch):
    """/1 and /2 measured kernels the mode no longer runs: not computable any more (an unknown format), so nothing
    recorded under them passes as a measurement of this code; a new KERNEL version is a new fingerprint."""
    from kvstore.backends.transformers import invariant

    assert NUMERICS_FORMAT == "kvgraft-numerics-invariant/3" and FORMER_NUMERICS_FORMATS == ()
    assert former_numerics_fingerprints(DIMS) == ()
    current = numerics_fingerprint(DIMS)
    monkeypatch.setattr(invariant, "KERNEL", "fixed-dot16/2")
    assert numerics_fingerprint(DIMS) != current
    for old in ("kvgraft-numerics-invariant/1", "kvgraft-numerics-invariant/2", "kvgraft-numerics-invariant/9"):
        with pytest.raises(ValueError, match=old):
            numerics_fingerprint(DIMS, old)


def _mode_artifact(tmp_path, numerics: str):
    fm = load_frozen_model("tiny-gemma3", Determinism(batch_invariant=True, prefill_chunk=0))
    store = LocalStore(tmp_path / "store")
    aid = store.put(TransformersBackend.of(fm).deposit(IDS[:30]))
    db = __import__("sqlite3").connect(store.index_path)  # the record a deposit under the earlier battery wrote
    db.execute("UPDATE tags SET tag = ? WHERE tag LIKE 'numerics:%'", (numerics_tag(numerics),))
    db.commit()
    db.close()
    return TransformersBackend.of(fm), store, aid


# The tiny Gemma 3's /2 and /1 fingerprints on this kind of machine (AMD EPYC Zen 4, 2 threads), measured at
# 7180e3a, the commit before issue 58, under the MKL tiles that code ran.
FORMER_HERE = {"/2": "4a0267abe72d6fd47694b7b401f519f93e1a36119900b689fc302a2d19ca7ad7",
               "/1": "8415b11a890a276d5463771ac907920ae5d9dd5ba0e87cc268d594b99d4fd801"}


@pytest.mark.parametrize("fmt", sorted(FORMER_HERE))
def test_an_artifact_recorded_under_the_former_kernels_is_refused(tmp_path, fmt):
    """Issue 58: a deposit made before KERNEL (MKL tiles, battery /1 or /2) computed other bits than the mode does
    now; its recorded fingerprint is neither this machine's /3 nor a former one, so a graft is refused in one line."""
    be, store, aid = _mode_artifact(tmp_path, FORMER_HERE[fmt])
    assert be.former_numerics() == () and be.numerics() not in FORMER_HERE.values()
    with pytest.raises(EnvironmentMismatchError, match="numerics_sha256") as e:
        graft_logits(be, IDS[:30], IDS[30:], store=store, artifact_id=aid)
    assert "\n" not in str(e.value)


def test_another_machines_former_fingerprint_is_refused_in_one_line(tmp_path):
    be, store, aid = _mode_artifact(tmp_path, "e" * 64)
    with pytest.raises(EnvironmentMismatchError, match="numerics_sha256") as e:
        graft_logits(be, IDS[:30], IDS[30:], store=store, artifact_id=aid)
    assert "\n" not in str(e.value)


def test_the_default_mode_has_no_former_battery():
    fm = load_frozen_model("tiny-gemma3", Determinism(prefill_chunk=0))
    assert TransformersBackend.of(fm).former_numerics() == ()
