"""Integration: on the real bundled Gemma 3 270M, an artifact deposited in this process and grafted in a
separate process gives suffix logits byte-identical to the fresh reference computed here.

Slow: one model load per process (the first ever load converts the GGUF into ~/.cache/kvgraft, ~1-2 min).
Run with `pytest -m integration tests/kvstore/test_bundled_model.py`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from safetensors.torch import load_file

from kvstore import LocalStore, check_graft, load_frozen_model, logits_sha256
from kvstore.verify import Restored

pytestmark = pytest.mark.integration

TEXT = ("Problem: A farmer has 17 sheep. All but 9 run away. How many sheep are left? "
        "Solution: 'All but 9' means 9 sheep stay behind, so the farmer has 9 sheep left. "
        "Answer: 9. Problem: What is the sum of the first five positive odd integers?")
SUFFIX_TEXT = " Solution: 1 + 3 + 5 + 7 + 9 = 25."

# Runs in a fresh interpreter: the graft half of check_graft (get by id, graft at own position, the suffix).
RESTORE = textwrap.dedent("""
    import json, sys
    from safetensors.torch import save_file
    from kvstore import LocalStore, load_frozen_model
    from kvstore.verify import graft_logits
    root, aid, prefix, suffix, out = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4]), sys.argv[5]
    fm = load_frozen_model()
    restored = graft_logits(fm, prefix, suffix, store=LocalStore(root), artifact_id=aid)
    save_file({"logits": restored.logits.contiguous()}, out)
    print(json.dumps({"fingerprint": fm.fingerprint, "timing_s": restored.timing_s}))
""")


@pytest.fixture(scope="module")
def bundled():
    return load_frozen_model()


def test_an_artifact_grafted_in_another_process_gives_the_fresh_reference_logits(bundled, tmp_path):
    prefix = bundled.encode(TEXT)[:60]
    suffix = bundled.encode(SUFFIX_TEXT, add_bos=False)
    assert len(prefix) == 60 and len(suffix) >= 8
    store = LocalStore(tmp_path / "store")
    other_process: dict = {}

    def restore(aid: str) -> Restored:
        out = tmp_path / "logits.safetensors"
        proc = subprocess.run(
            [sys.executable, "-c", RESTORE, str(store.root), aid, json.dumps(prefix), json.dumps(suffix), str(out)],
            capture_output=True, text=True, timeout=900,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        other_process.update(json.loads(proc.stdout.strip().splitlines()[-1]))
        return Restored(load_file(str(out))["logits"], other_process["timing_s"])

    check = check_graft(bundled, prefix, suffix, store, restore=restore, tags=["integration"], keep_logits=True)

    assert other_process["fingerprint"] == bundled.fingerprint
    assert check.equal and logits_sha256(check.graft_logits) == check.sha256_reference
    snapshot = store.get(check.artifact_id)
    assert [lyr["kind"] for lyr in snapshot.layout].count("full") == 3  # 18 layers, every 6th full attention
    assert all(lyr.keys.shape[-2] == 60 for lyr in snapshot.layers)  # 60 < window 512: every position kept
