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

from kvstore import LocalStore, deposit_tokens, forward, load_frozen_model, logits_sha256, prefill

pytestmark = pytest.mark.integration

TEXT = ("Problem: A farmer has 17 sheep. All but 9 run away. How many sheep are left? "
        "Solution: 'All but 9' means 9 sheep stay behind, so the farmer has 9 sheep left. "
        "Answer: 9. Problem: What is the sum of the first five positive odd integers?")
SUFFIX_TEXT = " Solution: 1 + 3 + 5 + 7 + 9 = 25."

# Runs in a fresh interpreter: restore from the store by id, graft at own position, run the suffix.
RESTORE = textwrap.dedent("""
    import json, sys
    from kvstore import LocalStore, forward, graft_snapshot, load_frozen_model, logits_sha256
    root, aid, prefix, suffix = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
    fm = load_frozen_model()
    snapshot = LocalStore(root).get(aid)
    cache = graft_snapshot(snapshot, fm, prefix + suffix, position=0)
    print(json.dumps({"fingerprint": fm.fingerprint, "logits_sha256": logits_sha256(forward(fm, suffix, cache))}))
""")


@pytest.fixture(scope="module")
def bundled():
    return load_frozen_model()


def test_an_artifact_grafted_in_another_process_gives_the_fresh_reference_logits(bundled, tmp_path):
    prefix = bundled.encode(TEXT)[:60]
    suffix = bundled.encode(SUFFIX_TEXT, add_bos=False)
    assert len(prefix) == 60 and len(suffix) >= 8

    cache, _ = prefill(bundled, prefix)
    reference = logits_sha256(forward(bundled, suffix, cache))

    store = LocalStore(tmp_path / "store")
    snapshot = deposit_tokens(bundled, prefix)
    aid = store.put(snapshot, tags=["integration"])
    assert [lyr["kind"] for lyr in snapshot.layout].count("full") == 3  # 18 layers, every 6th full attention
    assert all(lyr.keys.shape[-2] == 60 for lyr in snapshot.layers)  # 60 < window 512: every position kept

    out = subprocess.run(
        [sys.executable, "-c", RESTORE, str(store.root), aid, json.dumps(prefix), json.dumps(suffix)],
        capture_output=True, text=True, timeout=900,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    restored = json.loads(out.stdout.strip().splitlines()[-1])
    assert restored["fingerprint"] == bundled.fingerprint
    assert restored["logits_sha256"] == reference
