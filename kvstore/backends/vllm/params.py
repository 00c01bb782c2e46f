"""The per-request keys of KvgraftConnector (`kv_transfer_params`): client input, checked before anything acts on it.

vLLM hands a request's `kv_transfer_params` to the connector as the client sent it (vllm PR #47843 sanitises only
`remote_host` / `remote_port`), so every key is untrusted. `check_params` is the one rule, applied twice:

- in vLLM's API server, by `ParamsMiddleware` (`vllm serve ... --middleware
  kvstore.backends.vllm.params.ParamsMiddleware`; `python -m kvstore.backends.vllm.serve` adds it): a request whose
  `kv_transfer_params` break the rule is answered `400 BadRequestError` naming the key, and never reaches the engine;
- in the connector (scheduler side), for every request, whatever entry point it came through (an offline `LLM`, a
  server started without the middleware): a request that breaks it is served as if it carried no kvgraft key (no
  deposit, no graft) and its response's `kv_transfer_params` say why (`{"kvgraft_invalid": MESSAGE}`).

The keys (nothing else is accepted; the whole dict at most MAX_PARAMS_BYTES as JSON):

    kvgraft_deposit   true | false | "prompt"   deposit this prompt's whole blocks (deposit="marked"); "prompt": the
                                                whole prompt, its partial last block included
    kvgraft_graft     artifact id (64 lowercase hex digits): graft only this artifact (admitted like every graft)
    kvgraft_tokens    int, 1..MAX_TOKENS: how many of its tokens (with kvgraft_graft only; default: all it holds)

This module imports neither vLLM nor torch: the API server process loads it.
"""

from __future__ import annotations

import json
import string
from typing import Any

from kvstore.errors import TransferParamsError

MARK = "kvgraft_deposit"
PROMPT = "prompt"  # MARK's value that deposits the whole prompt (partial last block included)
GRAFT_MARK = "kvgraft_graft"  # the artifact a request grafts
GRAFT_TOKENS = "kvgraft_tokens"  # ... and how many of its tokens
KEYS = (MARK, GRAFT_MARK, GRAFT_TOKENS)
# the connector's answers, in a response's kv_transfer_params
REFUSED = "kvgraft_refused"  # the artifacts refused at admission, each with why
GRAFTED = "kvgraft_grafted"  # the artifact grafted and its tokens
INVALID = "kvgraft_invalid"  # why the request's own kvgraft keys were refused (check_params)
CACHED = "kvgraft_cached"  # a named artifact not read: the engine's prefix cache already held its blocks
MAX_PARAMS_BYTES = 1024
MAX_TOKENS = 1 << 20
PATHS = ("/v1/completions", "/v1/chat/completions")  # the routes whose JSON body ParamsMiddleware checks
_HEX = frozenset(string.hexdigits.lower())


def check_params(params: object) -> dict[str, Any]:
    """The kvgraft keys of a request's kv_transfer_params, checked ({} for None); TransferParamsError names the first
    key that breaks the rule (an unknown key, a wrong type, a value or a dict too large)."""
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise TransferParamsError(f"kv_transfer_params is a {type(params).__name__}; give a JSON object with the keys "
                                  f"{list(KEYS)}")
    try:
        size = len(json.dumps(params, separators=(",", ":")).encode())
    except RecursionError:
        raise TransferParamsError(f"kv_transfer_params is nested too deeply to be plain JSON; give "
                                  f"{list(KEYS)}") from None
    except (TypeError, ValueError) as e:
        raise TransferParamsError(f"kv_transfer_params is not plain JSON ({e}); give {list(KEYS)}") from e
    if size > MAX_PARAMS_BYTES:
        raise TransferParamsError(f"kv_transfer_params is {size} bytes of JSON, more than {MAX_PARAMS_BYTES}; "
                                  f"give only {list(KEYS)}")
    unknown = sorted(str(k)[:64] for k in params if k not in KEYS)
    if unknown:
        raise TransferParamsError(f"kv_transfer_params has the key {unknown[0]!r}, which KvgraftConnector does not "
                                  f"read; it reads only {list(KEYS)} (docs/vllm.md, 'Per-request keys')")
    mark = params.get(MARK, False)
    if not (isinstance(mark, bool) or mark == PROMPT):
        raise TransferParamsError(f"kv_transfer_params.{MARK} is {mark!r:.80}; give true, false or {PROMPT!r}")
    aid = params.get(GRAFT_MARK)
    if aid is not None and not (isinstance(aid, str) and len(aid) == 64 and set(aid) <= _HEX):
        raise TransferParamsError(f"kv_transfer_params.{GRAFT_MARK} is {aid!r:.80}; give an artifact id (64 lowercase "
                                  "hex digits, `kvstore ls`)")
    held = params.get(GRAFT_TOKENS)
    if held is not None:
        if aid is None:
            raise TransferParamsError(f"kv_transfer_params.{GRAFT_TOKENS} without {GRAFT_MARK}; name the artifact too")
        if isinstance(held, bool) or not isinstance(held, int) or not 0 < held <= MAX_TOKENS:
            raise TransferParamsError(f"kv_transfer_params.{GRAFT_TOKENS} is {held!r:.80}; give an integer from 1 to "
                                      f"{MAX_TOKENS}")
    return dict(params)


async def read_body(receive: Any) -> tuple[list[dict], bytes]:
    """An ASGI request's body: (the messages received, to replay them to the app; the body's bytes), read up to the
    last `http.request` message (or the first message of another type, a disconnect)."""
    messages, body = [], bytearray()
    while True:
        message = await receive()
        messages.append(message)
        if message.get("type") != "http.request":
            break
        body += message.get("body", b"")
        if not message.get("more_body", False):
            break
    return messages, bytes(body)


def error_body(message: str) -> bytes:
    """An OpenAI-style error body, as vLLM's server writes its own (`{"error": {...}}`)."""
    return json.dumps({"error": {"message": message, "type": "BadRequestError", "param": "kv_transfer_params",
                                 "code": 400}}).encode()


class ParamsMiddleware:
    """ASGI middleware for vLLM's API server (`--middleware kvstore.backends.vllm.params.ParamsMiddleware`): a POST
    to a completions route whose JSON body's `kv_transfer_params` break `check_params` is answered 400 with the
    reason; every other request passes through untouched (a body that is not JSON is left to vLLM to refuse)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope.get("type") != "http" or scope.get("method") != "POST" or scope.get("path") not in PATHS:
            await self.app(scope, receive, send)
            return
        messages, body = await read_body(receive)
        problem = None
        try:
            data = json.loads(body)
        except ValueError:
            data = None  # not JSON: vLLM's own parser answers it (a 400)
        except RecursionError:  # nested past the parser's depth: vLLM's parser would fail the same way, as a 500
            data, problem = None, ("the request body is JSON nested too deeply to be read; kv_transfer_params is a "
                                   f"flat object of {list(KEYS)}")
        if isinstance(data, dict) and "kv_transfer_params" in data:
            try:
                check_params(data["kv_transfer_params"])
            except TransferParamsError as e:
                problem = str(e)
        if problem is not None:
            payload = error_body(problem)
            await send({"type": "http.response.start", "status": 400,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(payload)).encode())]})
            await send({"type": "http.response.body", "body": payload})
            return

        async def replay() -> dict:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)
