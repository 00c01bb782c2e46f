"""harness/replay.py (run as scripts/replay.py): the comparison of a registered profile with a recomputation (pure, on hand-made
entries), and the script end to end on a tiny registry of the tiny random-weight model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import replay
from kvstore import Determinism, environment_fingerprint

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "replay.py"




def _entry(env: dict, hashes=("a1", "b2"), first="c3", tokens=(5, 6)) -> dict:
    return {
        "model_fingerprint": "m" * 64, "tokenizer_fingerprint": "t" * 64, "environment": env,
        "samples": [{"index": i, "prefix_tokens": 10, "suffix_tokens": 4, "tokens_sha256": f"in{i}",
                     "logits_sha256": h, "graft_equal": True} for i, h in enumerate(hashes)],
        "decode": [{"problem_id": "p-1", "prompt_tokens": 9, "prompt_sha256": "pp", "first_logits_sha256": first,
                    "token_ids": list(tokens)}],
    }


ENV = environment_fingerprint()
# another machine than this one (the tests run on Intel and AMD machines alike)
OTHER = {**ENV, **({"cpu_vendor": "AuthenticAMD", "cpu_model": "AMD EPYC"} if ENV["cpu_vendor"] == "GenuineIntel"
                   else {"cpu_vendor": "GenuineIntel", "cpu_model": "Intel(R) Xeon(R)"})}


def test_same_environment_and_every_hash_reproduced_passes():
    out = replay.compare(_entry(ENV), _entry(ENV), "native")
    assert out.passed and out.reproduced == 3 and not out.environment_differences
    assert out.verdict() == "profile native: 3/3 reproduced; environment matches the registered one -> PASS"


def test_one_hash_not_reproduced_fails_and_is_named():
    out = replay.compare(_entry(ENV), _entry(ENV, hashes=("a1", "XX")), "native")
    assert not out.passed and out.reproduced == 2
    assert [r["name"] for r in out.rows if not r["reproduced"]] == ["sample 1 (10+4)"]
    bad_decode = replay.compare(_entry(ENV), _entry(ENV, tokens=(5, 7)), "native")
    assert not bad_decode.passed and not bad_decode.rows[-1]["reproduced"]


def test_a_graft_that_is_not_exact_is_not_reproduced_even_when_the_reference_is():
    now = _entry(ENV)
    now["samples"][0]["graft_equal"] = False
    assert not replay.compare(_entry(ENV), now, "native").passed


@pytest.mark.parametrize("profile, passes", [("native", False), ("portable", True)])
def test_another_environment_passes_only_under_a_portable_profile_that_reproduced_all(profile, passes):
    out = replay.compare(_entry(OTHER), _entry(ENV), profile)
    assert out.reproduced == 3 and out.passed is passes
    assert {d.split(":")[0] for d in out.environment_differences} == {"environment.cpu_model",
                                                                      "environment.cpu_vendor"}
    assert "3/3 reproduced in a different environment (2 facts differ" in out.verdict()
    differing = [key for key, _, _, same in out.environment if not same]
    assert differing == ["cpu_model", "cpu_vendor"]  # shown side by side, marked
    one_off = replay.compare(_entry(OTHER), _entry(ENV, first="zz"), profile)
    assert not one_off.passed  # portability promised but not kept


def test_other_inputs_are_not_comparable():
    now = _entry(ENV)
    now["model_fingerprint"] = "n" * 64
    out = replay.compare(_entry(ENV), now, "native")
    assert not out.passed and "NOT COMPARABLE: model_fingerprint" in out.verdict()
    moved = _entry(ENV)
    moved["samples"][1]["tokens_sha256"] = "other"
    assert "sample 1: its tokens differ" in replay.compare(_entry(ENV), moved, "native").verdict()


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=REPO, env=env,
                          timeout=600)


def test_register_then_replay_on_the_tiny_model(tmp_path):
    reg = tmp_path / "registry.json"
    small = ["--registry", str(reg), "--model", "tiny-gemma3", "--samples", "3", "--decode-problems", "2",
             "--decode-tokens", "3"]
    r = _run("--profile", "native", "--register", *small)
    assert r.returncode == 0, r.stderr
    registry = json.loads(reg.read_text())
    entry = registry["profiles"]["native"]
    assert registry["params"]["samples"] == 3 and len(entry["samples"]) == 3 and len(entry["decode"]) == 2
    # the subprocess ran under the default pinned settings; earlier tests may have changed this process's threads
    Determinism().apply()
    assert entry["environment"] == environment_fingerprint() and entry["determinism"]["profile"] == "native"

    r = _run("--profile", "native", "--registry", str(reg))  # the parameters come from the registry
    assert r.returncode == 0, r.stdout + r.stderr
    assert "profile native: 5/5 reproduced; environment matches the registered one -> PASS" in r.stdout

    entry["samples"][1]["logits_sha256"] = "0" * 64
    entry["environment"]["cpu_model"] = OTHER["cpu_model"]
    reg.write_text(json.dumps(registry))
    r = _run("--registry", str(reg))  # every registered profile, each in its own process
    assert r.returncode == 1
    assert "4/5 reproduced in a different environment (1 facts differ; the profile does not promise" in r.stdout
    assert "DIFFERS" in r.stdout and "replay: native FAIL" in r.stdout
