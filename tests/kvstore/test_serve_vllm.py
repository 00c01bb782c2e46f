"""kvgraft on `vllm serve` (kvstore/backends/vllm/serve.py, params.py; docs/vllm.md "vllm serve").

The per-request keys' rule and the API server's middleware run here, in the main venv (no vLLM). The server tests
read tests/kvstore/vllm_serve_cases.py's results: two servers of the project's command, driven by the openai client
(deposit; restart; graft equal to the reference in tokens, logprobs and top-5; a tampered artifact refused, the
client told which and why; the server still serving). tests/conftest.py starts that script in the background once
the suite is collected; without .venv-vllm the server tests skip in one line.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from kvstore.backends.vllm.params import MAX_PARAMS_BYTES, ParamsMiddleware, check_params
from kvstore.errors import TransferParamsError

AID = "ab" * 32


@pytest.mark.parametrize("params", [None, {}, {"kvgraft_deposit": True}, {"kvgraft_deposit": "prompt"},
                                    {"kvgraft_graft": AID}, {"kvgraft_graft": AID, "kvgraft_tokens": 256}])
def test_check_params_accepts_the_documented_keys(params) -> None:  # noqa: ANN001
    assert check_params(params) == (params or {})


@pytest.mark.parametrize(("params", "named"), [
    ([1], "is a list"),
    ({"kvgraft_bogus": 1}, "'kvgraft_bogus'"),
    ({"do_remote_prefill": True}, "'do_remote_prefill'"),
    ({"kvgraft_deposit": "yes"}, "kvgraft_deposit is 'yes'"),
    ({"kvgraft_deposit": 1}, "kvgraft_deposit is 1"),
    ({"kvgraft_graft": "AB" * 32}, "kvgraft_graft is"),
    ({"kvgraft_graft": "../../etc/passwd"}, "kvgraft_graft is"),
    ({"kvgraft_tokens": 5}, "without kvgraft_graft"),
    ({"kvgraft_graft": AID, "kvgraft_tokens": True}, "kvgraft_tokens is True"),
    ({"kvgraft_graft": AID, "kvgraft_tokens": 0}, "kvgraft_tokens is 0"),
    ({"kvgraft_deposit": True, "kvgraft_graft": AID, "x" * MAX_PARAMS_BYTES: 1}, f"more than {MAX_PARAMS_BYTES}"),
])
def test_check_params_refuses_naming_the_key(params, named: str) -> None:  # noqa: ANN001
    with pytest.raises(TransferParamsError) as e:
        check_params(params)
    assert named in str(e.value) and "\n" not in str(e.value)


def asgi(path: str, body: bytes) -> tuple[list[dict], list[dict]]:
    """Run ParamsMiddleware over one POST; (what it sent back, what reached the app behind it)."""
    reached: list[dict] = []

    async def app(scope, receive, send) -> None:  # noqa: ANN001
        while True:
            m = await receive()
            reached.append(m)
            if not m.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    chunks = [{"type": "http.request", "body": body[:10], "more_body": True},
              {"type": "http.request", "body": body[10:], "more_body": False}]
    sent: list[dict] = []

    async def receive() -> dict:
        return chunks.pop(0)

    async def send(m: dict) -> None:
        sent.append(m)

    scope = {"type": "http", "method": "POST", "path": path}
    asyncio.run(ParamsMiddleware(app)(scope, receive, send))
    return sent, reached


def test_middleware_answers_400_naming_the_key_and_the_engine_never_sees_the_request() -> None:
    body = json.dumps({"model": "m", "prompt": "hi", "kv_transfer_params": {"kvgraft_bogus": 1}}).encode()
    sent, reached = asgi("/v1/completions", body)
    assert sent[0]["status"] == 400 and reached == []
    err = json.loads(sent[1]["body"])["error"]
    assert err["type"] == "BadRequestError" and err["param"] == "kv_transfer_params" and "'kvgraft_bogus'" in err["message"]


@pytest.mark.parametrize(("path", "params"), [("/v1/completions", {"kvgraft_deposit": True}),
                                              ("/v1/chat/completions", None),
                                              ("/v1/models", {"kvgraft_bogus": 1})])
def test_middleware_passes_a_valid_request_through_byte_for_byte(path: str, params) -> None:  # noqa: ANN001
    body = json.dumps({"model": "m", "prompt": "hi", **({"kv_transfer_params": params} if params else {})}).encode()
    sent, reached = asgi(path, body)
    assert sent[0]["status"] == 200 and b"".join(m["body"] for m in reached) == body


# ------------------------------------------------------------------ the servers (tests/kvstore/vllm_serve_cases.py)
@pytest.fixture(scope="module")
def serve_cases(vllm_engine_cases) -> dict:  # noqa: ANN001
    return vllm_engine_cases.result("kvstore/vllm_serve_cases.py")


@pytest.mark.integration
def test_server_deposits_each_marked_prompt_through_the_openai_client(serve_cases: dict) -> None:
    deposits = serve_cases["deposits_a"]
    assert [e["tokens"] for e in deposits[:2]] == [256, 128]  # P (269 tokens) and Q (243): their whole blocks
    assert len(deposits) == 3 and deposits[2]["tokens"] == 128  # the chat request, through the chat template
    assert serve_cases["chat"]["finish"] in ("length", "stop") and serve_cases["chat"]["prompt_tokens"] > 128


@pytest.mark.integration
def test_graft_after_a_restart_equals_the_reference_in_tokens_logprobs_and_top5(serve_cases: dict) -> None:
    ref, graft = serve_cases["reference"], serve_cases["graft"]
    assert graft["kv_transfer_params"] == {"kvgraft_grafted": {"artifact": serve_cases["deposits_a"][0]["artifact"],
                                                               "tokens": 256}}
    assert ref["kv_transfer_params"] is None  # A's own prefix-cache hit: nothing from the store
    assert len(graft["tokens"]) == 8 and graft["tokens"] == ref["tokens"]
    assert graft["logprobs"] == ref["logprobs"] and graft["top"] == ref["top"]  # bit for bit, as JSON floats
    grafts = [e for e in serve_cases["events_b"] if e["request"].startswith(graft["id"] + "-")]
    assert [(e["event"], e["artifact"], e["tokens"]) for e in grafts] == [
        ("graft", serve_cases["deposits_a"][0]["artifact"], 256)]


@pytest.mark.integration
def test_tampered_artifact_is_refused_and_the_client_is_told_which_and_why(serve_cases: dict) -> None:
    r = serve_cases["refused"]
    refused = r["kv_transfer_params"]["kvgraft_refused"]
    assert len(refused) == 1 and refused[0]["artifact"] == serve_cases["tampered"] and refused[0]["tokens"] == 128
    assert refused[0]["first_difference"].startswith("IntegrityError: artifact " + serve_cases["tampered"])
    assert r["finish"] == "length" and len(r["tokens"]) == 8  # computed, as a server without the artifact would
    events = [e for e in serve_cases["events_b"] if e["request"].startswith(r["id"] + "-")]
    assert [(e["event"], e["at"]) for e in events] == [("refused", "admission")]  # never offered to the worker
    request = events[0]["request"]
    assert sum(f"request {request}: no artifact admitted" in ln for ln in serve_cases["server_log"].splitlines()) == 1


@pytest.mark.integration
def test_server_still_serves_after_a_refusal(serve_cases: dict) -> None:
    after = serve_cases["after"]
    assert after["finish"] == "length" and after["text"]


@pytest.mark.integration
def test_a_named_artifact_the_store_lacks_is_refused_naming_it(serve_cases: dict) -> None:
    r = serve_cases["named_missing"]
    refused = r["kv_transfer_params"]["kvgraft_refused"]
    assert [x["artifact"] for x in refused] == ["0" * 64] and refused[0]["first_difference"].startswith("NotFoundError")
    assert r["finish"] == "length"
    events = [e for e in serve_cases["events_b"] if e["request"].startswith(r["id"] + "-")]
    assert [(e["event"], e["at"]) for e in events] == [("refused", "admission")]


@pytest.mark.integration
@pytest.mark.parametrize(("case", "named"), [("unknown_key", "'kvgraft_bogus'"), ("wrong_type", "kvgraft_deposit")])
def test_server_answers_400_naming_a_bad_kvgraft_key(serve_cases: dict, case: str, named: str) -> None:
    r = serve_cases[case]
    assert r["status"] == 400 and named in r["body"]["message"]
