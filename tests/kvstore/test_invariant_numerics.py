"""Issue 52: the mode's numerics fingerprint hashes only kernels the mode runs. Its first battery
(kvgraft-numerics-invariant/1) also hashed torch.softmax, which the mode never runs and whose bits differ between
ATen's AVX2 and AVX-512 builds: an AMD Zen 5 (AVX-512) reproduced 55/55 of a Zen 3's (AVX2) replay hashes in the mode
but got another /1 fingerprint. The current battery (/2) is the same under both of ATen's builds on one machine, and a
record made under /1 on this machine is still admitted (its evidence as it was when recorded); another /1 is not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kvstore import Determinism, EnvironmentMismatchError, LocalStore
from kvstore.backends.transformers import TransformersBackend, deposit_tokens
from kvstore.backends.transformers.invariant import (
    FORMER_NUMERICS_FORMATS,
    NUMERICS_FORMAT,
    former_numerics_fingerprints,
    numerics_fingerprint,
)
from kvstore.backends.transformers.model import load_frozen_model
from kvstore.engine.verify import graft_logits
from kvstore.environment import numerics_battery_dims, numerics_tag

REPO = Path(__file__).resolve().parents[2]
IDS = [2] + [4 + (7 * i) % 200 for i in range(40)]
DIMS = {"hidden": 64, "intermediate": 256, "heads": 4, "kv_heads": 2, "head_dim": 16, "vocab": 512}
_PROBE = ("import json, sys, torch; from kvstore.backends.transformers.invariant import numerics_fingerprint as f; "
          "d = json.loads(sys.argv[1]); print(torch.backends.cpu.get_cpu_capability(), "
          "f(d), f(d, 'kvgraft-numerics-invariant/1'))")


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


def test_the_formats_are_distinct_and_an_unknown_one_is_refused():
    assert NUMERICS_FORMAT not in FORMER_NUMERICS_FORMATS
    current, former = numerics_fingerprint(DIMS), former_numerics_fingerprints(DIMS)
    assert len(former) == len(FORMER_NUMERICS_FORMATS) and current not in former
    assert former == tuple(numerics_fingerprint(DIMS, f) for f in FORMER_NUMERICS_FORMATS)
    with pytest.raises(ValueError, match="kvgraft-numerics-invariant/9"):
        numerics_fingerprint(DIMS, "kvgraft-numerics-invariant/9")


def _mode_artifact(tmp_path, numerics: str):
    fm = load_frozen_model("tiny-gemma3", Determinism(batch_invariant=True, prefill_chunk=0))
    store = LocalStore(tmp_path / "store")
    aid = store.put(deposit_tokens(fm, IDS[:30]))
    db = __import__("sqlite3").connect(store.index_path)  # the record a deposit under the earlier battery wrote
    db.execute("UPDATE tags SET tag = ? WHERE tag LIKE 'numerics:%'", (numerics_tag(numerics),))
    db.commit()
    db.close()
    return TransformersBackend.of(fm), store, aid


def test_an_artifact_recorded_under_the_former_battery_on_this_machine_is_admitted(tmp_path):
    fm = load_frozen_model("tiny-gemma3", Determinism(batch_invariant=True, prefill_chunk=0))
    former = former_numerics_fingerprints(numerics_battery_dims(fm.config))
    be, store, aid = _mode_artifact(tmp_path, former[0])
    assert be.former_numerics() == former and be.numerics() not in former
    assert store.get(aid).numerics.fingerprints == (former[0],)
    graft_logits(be, IDS[:30], IDS[30:], store=store, artifact_id=aid)  # admitted: no error


def test_another_machines_former_fingerprint_is_refused_in_one_line(tmp_path):
    be, store, aid = _mode_artifact(tmp_path, "e" * 64)
    with pytest.raises(EnvironmentMismatchError, match="numerics_sha256") as e:
        graft_logits(be, IDS[:30], IDS[30:], store=store, artifact_id=aid)
    assert "\n" not in str(e.value)


def test_the_default_mode_has_no_former_battery():
    fm = load_frozen_model("tiny-gemma3", Determinism(prefill_chunk=0))
    assert TransformersBackend.of(fm).former_numerics() == ()
