"""Two replicas of `make serve` on one S3 store (the project's SeaweedFS, kvstore.testing.local_s3), for
tests/kvstore/test_replicas.py (inside .venv-vllm, boto3 from build/vllm-s3: `make setup-vllm-s3`; the S3 server and
its endpoint and keys in the environment, started by the test):

    PYTHONPATH=.:build/vllm-s3 AWS_ENDPOINT_URL=... .venv-vllm/bin/python tests/kvstore/vllm_replica_cases.py OUT.json

Replica A and replica B, both up at once, one store `s3://kvgraft/replicas`:
  A   deposits P (a marked request), then grafts P + S from the store (a fresh cache_salt: no prefix-cache hit);
  B   grafts P + S from the store (deposited through A), 16 tokens, logprobs and top-5 compared with A's own graft;
  (between) one byte of P's object flipped on S3 (its key unchanged);
  A, B  P + S again (fresh salts): each refuses the artifact (kvgraft_refused, IntegrityError) and answers;
        then one more request each: both still serve.
"""

from __future__ import annotations

import json
import sys
import tempfile
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vllm_serve_cases import P, S, completion, free_port  # noqa: E402

STORE = "s3://kvgraft/replicas"


def main(out_path: str) -> int:
    import boto3
    from openai import OpenAI

    from kvstore.backends.vllm.serve import Server

    tmp = Path(tempfile.mkdtemp(prefix="vllm-replicas-"))
    result: dict = {}
    salted = {"max_tokens": 16, "logprobs": 5}
    with Server(["--port", str(free_port()), "--store", STORE, "--journal", str(tmp / "a.jsonl")], tmp / "a.log") as a, \
            Server(["--port", str(free_port()), "--store", STORE, "--journal", str(tmp / "b.jsonl")], tmp / "b.log") as b:
        result["start_s"] = [a.started_s, b.started_s]
        ca = OpenAI(base_url=a.url, api_key="none", max_retries=0, timeout=600)
        cb = OpenAI(base_url=b.url, api_key="none", max_retries=0, timeout=600)
        result["deposit_a"] = completion(ca, P, max_tokens=1, extra_body={"kv_transfer_params": {"kvgraft_deposit": True}})
        result["graft_a"] = completion(ca, P + S, extra_body={"cache_salt": uuid.uuid4().hex}, **salted)
        result["graft_b"] = completion(cb, P + S, extra_body={"cache_salt": uuid.uuid4().hex}, **salted)
        s3 = boto3.client("s3")
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket="kvgraft", Prefix="replicas/objects/").get("Contents", [])]
        aid = result["graft_b"]["kv_transfer_params"]["kvgraft_grafted"]["artifact"]
        key = next(k for k in keys if k.replace("/", "").endswith(aid))
        data = bytearray(s3.get_object(Bucket="kvgraft", Key=key)["Body"].read())
        data[len(data) // 2] ^= 0xFF
        s3.put_object(Bucket="kvgraft", Key=key, Body=bytes(data))
        result["tampered_key"] = key
        result["refused_a"] = completion(ca, P + S, extra_body={"cache_salt": uuid.uuid4().hex}, **salted)
        result["refused_b"] = completion(cb, P + S, extra_body={"cache_salt": uuid.uuid4().hex}, **salted)
        result["after_a"] = completion(ca, "The sky is", max_tokens=4)
        result["after_b"] = completion(cb, "The sky is", max_tokens=4)
    Path(out_path).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
