"""`vllm serve` with KvgraftConnector, driven by the openai client, for tests/kvstore/test_serve_vllm.py (inside
.venv-vllm; started in the background by tests/conftest.py):

    PYTHONPATH=. .venv-vllm/bin/python tests/kvstore/vllm_serve_cases.py OUT.json

Two servers of the project's command (`python -m kvstore.backends.vllm.serve`, what `make serve` runs), one store:
  server A  P and Q each deposited by a marked request (kv_transfer_params {"kvgraft_deposit": true}); then P + S,
            which hits A's own prefix cache on P's blocks: the reference a graft equals (vLLM's split schedule);
            a request with an unknown kvgraft key and one with a wrong type (the 400s); a chat request on the bundled
            base model with the project's chat template, marked for deposit.
  (between) one byte of Q's artifact flipped in the store (its id unchanged).
  server B  (a restart: an empty prefix cache) P + S, grafted from the store; Q + S, whose artifact is refused;
            then one more request, to show the server still serves, and one naming an artifact the store lacks.
OUT.json holds what the test asserts on: token ids, logprobs and top-5 of each completion, the responses'
kv_transfer_params, the 400s' bodies, the journal and the seconds each step took.
"""

from __future__ import annotations

import json
import socket
import sys
import tempfile
import time
from pathlib import Path

P = "Problem: " + "Find the sum of all positive integers n such that n squared plus twelve is a perfect square. " * 14
Q = "Lemma: " + "Every bounded monotone sequence of real numbers converges to its supremum or infimum. " * 16
S = " Answer:"
CHAT = ("Problem: a train leaves at 9:00 and travels 60 miles per hour for two and a half hours, then 40 miles per "
        "hour for one hour. ") * 5 + "How far did it travel in total?"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def completion(client, prompt: str, **kw) -> dict:  # noqa: ANN001
    t0 = time.monotonic()
    r = client.completions.create(model="gemma3-270m", prompt=prompt, temperature=0.0,
                                  extra_body={"return_tokens_as_token_ids": True, **kw.pop("extra_body", {})}, **kw)
    lp = r.choices[0].logprobs
    return {"id": r.id, "text": r.choices[0].text, "finish": r.choices[0].finish_reason, "seconds": time.monotonic() - t0,
            "tokens": lp.tokens if lp else None, "logprobs": lp.token_logprobs if lp else None,
            "top": lp.top_logprobs if lp else None, "kv_transfer_params": (r.model_extra or {}).get("kv_transfer_params"),
            "prompt_tokens": r.usage.prompt_tokens}


def bad_request(client, params: object) -> dict:  # noqa: ANN001
    import openai

    try:
        client.completions.create(model="gemma3-270m", prompt=P, max_tokens=1,
                                  extra_body={"kv_transfer_params": params})
    except openai.BadRequestError as e:
        return {"status": e.status_code, "body": e.body}
    return {"status": 200, "body": None}


def main(out_path: str) -> int:
    from openai import OpenAI

    from kvstore.backends.vllm.connector import journal
    from kvstore.backends.vllm.serve import Server
    from kvstore.store.local import LocalStore

    tmp = Path(tempfile.mkdtemp(prefix="vllm-serve-cases-"))
    store_dir, jpath, log = tmp / "store", tmp / "journal.jsonl", tmp / "serve.log"
    args = ["--port", str(free_port()), "--store", str(store_dir), "--new-store", "--journal", str(jpath)]
    result: dict = {"log_path": str(log)}
    mark = {"kv_transfer_params": {"kvgraft_deposit": True}}
    with Server(args, log) as a:
        result["start_a_s"] = a.started_s
        client = OpenAI(base_url=a.url, api_key="none", max_retries=0, timeout=300)
        result["deposit_p"] = completion(client, P, max_tokens=1, extra_body=mark)
        result["deposit_q"] = completion(client, Q, max_tokens=1, extra_body=mark)
        result["reference"] = completion(client, P + S, max_tokens=8, logprobs=5)
        result["unknown_key"] = bad_request(client, {"kvgraft_deposit": True, "kvgraft_bogus": 1})
        result["wrong_type"] = bad_request(client, {"kvgraft_deposit": "yes"})
        t0 = time.monotonic()
        chat = client.chat.completions.create(model="gemma3-270m", messages=[{"role": "user", "content": CHAT}],
                                              max_tokens=8, temperature=0.0, extra_body=mark)
        result["chat"] = {"text": chat.choices[0].message.content, "finish": chat.choices[0].finish_reason,
                          "prompt_tokens": chat.usage.prompt_tokens, "seconds": time.monotonic() - t0}
    deposits = [e for e in journal(jpath) if e["event"] == "deposit"]
    result["deposits_a"] = deposits
    q_artifact = deposits[1]["artifact"]
    path = LocalStore(store_dir).path(q_artifact)  # one byte of a tensor flipped in place, the id unchanged
    data = bytearray(path.read_bytes())
    data[-100] ^= 0x01
    path.chmod(0o644)
    path.write_bytes(bytes(data))
    result["tampered"] = q_artifact
    before = len(journal(jpath))
    with Server(args, log) as b:
        result["start_b_s"] = b.started_s
        client = OpenAI(base_url=b.url, api_key="none", max_retries=0, timeout=300)
        result["graft"] = completion(client, P + S, max_tokens=8, logprobs=5)
        result["refused"] = completion(client, Q + S, max_tokens=8, logprobs=5)
        result["after"] = completion(client, P + S + " 7", max_tokens=4)
        result["named_missing"] = completion(client, P + S + " 9", max_tokens=1,
                                             extra_body={"kv_transfer_params": {"kvgraft_graft": "0" * 64}})
    result["events_b"] = journal(jpath)[before:]
    result["server_log"] = log.read_text(errors="replace")[-200_000:]  # "log" is the script's own output
    Path(out_path).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
