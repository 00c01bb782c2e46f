"""Replicas on one S3 store (issue 53; docs/vllm.md "Replicas"): two `make serve` servers, one SeaweedFS bucket. A
deposit through replica A grafts on replica B, verified there, B's 16 tokens, logprobs and top-5 equal to A's own
graft; one byte of the object flipped on S3: both refuse it (kvgraft_refused, IntegrityError first) and both still
serve. Runs tests/kvstore/vllm_replica_cases.py in .venv-vllm (two servers at once: ~3-8 min here)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VLLM_PY = REPO / ".venv-vllm" / "bin" / "python"
S3_LIB = REPO / "build" / "vllm-s3"


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> dict:
    if not VLLM_PY.exists():
        pytest.skip("no .venv-vllm (make setup-vllm): the replicas are vLLM servers")
    if not (S3_LIB / "boto3").is_dir():
        pytest.skip("no S3 client for .venv-vllm: make setup-vllm-s3")
    pytest.importorskip("boto3", reason="the S3 server's client: make setup-s3")
    from kvstore.testing.local_s3 import LocalS3, weed_binary

    try:
        weed_binary()
    except Exception as e:  # noqa: BLE001 - the one-line reason
        pytest.skip(f"no SeaweedFS: {e}")
    tmp = tmp_path_factory.mktemp("replicas")
    with LocalS3(tmp / "s3") as s3:
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("AWS_")}, **s3.env,
               "PYTHONPATH": f"{REPO}:{S3_LIB}", "AWS_DEFAULT_REGION": "us-east-1"}
        r = subprocess.run([str(VLLM_PY), str(REPO / "tests" / "kvstore" / "vllm_replica_cases.py"),
                            str(tmp / "out.json")], capture_output=True, text=True, cwd=REPO, env=env, timeout=1500)
        assert r.returncode == 0, r.stderr[-4000:]
    return json.loads((tmp / "out.json").read_text())


@pytest.mark.integration
def test_a_deposit_on_replica_a_grafts_on_replica_b_equal_to_as_own_graft(replicas: dict) -> None:
    a, b = replicas["graft_a"], replicas["graft_b"]
    ga, gb = a["kv_transfer_params"]["kvgraft_grafted"], b["kv_transfer_params"]["kvgraft_grafted"]
    assert ga == gb and ga["tokens"] >= 128
    assert len(b["tokens"]) == 16 and (b["tokens"], b["logprobs"], b["top"]) == (a["tokens"], a["logprobs"], a["top"])


@pytest.mark.integration
def test_a_tampered_object_is_refused_by_both_replicas_which_still_serve(replicas: dict) -> None:
    for side in ("a", "b"):
        refused = replicas[f"refused_{side}"]["kv_transfer_params"]["kvgraft_refused"]
        assert refused[0]["first_difference"].startswith("IntegrityError"), refused
        assert "kvgraft_grafted" not in replicas[f"refused_{side}"]["kv_transfer_params"]
        assert replicas[f"after_{side}"]["finish"] in ("length", "stop")
