"""LibraryMiddleware: the graft condition on every completion and chat request of vLLM's API server (`make serve
LIBRARY=... RETRIEVAL=...`, which `python -m harness.serve` starts with `--middleware
harness.serve.middleware.LibraryMiddleware`; its settings come in the environment variable ENV, as JSON).

For a POST to /v1/completions or /v1/chat/completions (one with `kv_transfer_params` of its own is a 400 naming
them: the library decides what grafts; a lone surrogate, an empty text, a context past the model's: a 400):

- the problem is found by harness.serve.library's rule, by content (ServedLibrary.find); the entry is chosen and
  the context composed by the graft condition's own code (ServedLibrary.retrieve / compose, in a worker thread):
  the entry's tokens, then the client's text as sent (a chat request's messages through the server's chat
  template);
- graft (the served model name): the prompt becomes the context's token ids and `kv_transfer_params` name the entry's
  artifact and its tokens (`kvgraft_graft`, `kvgraft_tokens`): the connector admits it (bytes re-hashed, every
  binding checked) and loads its whole blocks, as it does for the harness's own vLLM backend;
- incontext (the served model name + INCONTEXT_SUFFIX): the entry's tokens are computed alone first (one internal
  request of max_tokens 1), then the whole context, which hits those blocks: the harness's in-context schedule;
  nothing is grafted;
- every such request gets a fresh `cache_salt`, so no request reuses blocks another one computed or grafted (as the
  harness starts every row from an empty prefix cache): its output is the harness's row for the same context;
- the non-streamed response's `kv_transfer_params` gain `kvgraft_library` (the retrieval, the condition, the
  problem found, the entry: its id, its problem's id, its artifact, its tokens, how it matched; the `outcome`:
  grafted, in context, refused, not grafted, unconfirmed; and `why`), next to the connector's own
  `kvgraft_grafted` / `kvgraft_refused`; the server's journal (--journal) gets one `library` line per request with
  the response id;
- a chat request is answered through the completions route on the composed token ids (the harness composes no chat
  turn for a base model) and its answer returned as a chat completion; a streamed chat request is refused (400).

A request with no problem the rule can tell is served as sent (without a library graft) and says why (held-out and
random: fail closed). A library entry whose artifact cannot be read (removed, corrupted) while serving is refused for
that request only: the client's text is served alone, the response names the entry and the refusal.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from typing import Any

ENV = "KVGRAFT_SERVE_LIBRARY"
INCONTEXT_SUFFIX = "-incontext"
COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
LIBRARY_KEY = "kvgraft_library"
#: chat request keys carried over to the completions request it becomes
CHAT_KEYS = ("temperature", "top_p", "top_k", "min_p", "seed", "n", "stop", "stop_token_ids", "ignore_eos",
             "presence_penalty", "frequency_penalty", "repetition_penalty", "max_tokens", "user")


def _loads(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth: vLLM answers it
        return None


def request_texts(path: str, data: dict[str, Any]) -> tuple[str, list[str]] | str:
    """(the asked text, the request's other texts) the problem rule reads (harness.serve.library, rule 1), or why
    there are none."""
    if path == COMPLETIONS:
        prompt = data.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            return prompt, []
        return ("the prompt is token ids or several prompts, not one text" if prompt is not None else
                "the request has no prompt")
    messages = data.get("messages")
    if not isinstance(messages, list):
        return "the request has no messages"
    texts: list[tuple[str, str]] = []
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, str):
            texts.append((str(m.get("role")), content))
        elif isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                               and isinstance(p.get("text"), str) for p in content):
            texts.append((str(m.get("role")), "".join(p["text"] for p in content)))
        else:
            return "a message's content is not text"
    users = [i for i, (role, _) in enumerate(texts) if role == "user"]
    if not users:
        return "the conversation has no user message"
    return texts[users[-1]][1], [t for i, (_, t) in enumerate(texts) if i != users[-1]]


def chat_text(template: str, messages: list[dict[str, Any]]) -> str:
    """A chat request's messages as the server's chat template renders them (no BOS text: the entry holds the BOS);
    without a template, the messages' texts joined by blank lines."""
    plain = [{"role": m.get("role"), "content": m["content"] if isinstance(m["content"], str) else
              "".join(p["text"] for p in m["content"])} for m in messages]
    if not template:
        return "\n\n".join(m["content"] for m in plain)
    from harness.task.chat import render_chat

    return render_chat(template, plain)


def bad_text(data: Any, where: str = "body") -> str | None:
    """Where `data` holds a string that is not Unicode text (a lone surrogate, from a JSON escape), or None."""
    if isinstance(data, str):
        try:
            data.encode("utf-8")
        except UnicodeEncodeError as e:
            return f"{where} holds a lone surrogate (U+{ord(data[e.start]):04X}) at character {e.start}"
        return None
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for k, v in items:
        why = bad_text(v, f"{where}.{k}" if isinstance(k, str) else f"{where}[{k}]")
        if why:
            return why
    return None


def not_graftable(data: dict[str, Any]) -> str | None:
    """Why a request with these keys could not have its entry grafted (vLLM computes prompt logprobs without the
    connector; truncation cuts the entry off), or None."""
    if data.get("echo") and data.get("logprobs") is not None:
        return "echo with logprobs: vLLM computes the prompt's logprobs without the connector"
    if data.get("prompt_logprobs") is not None:
        return "prompt_logprobs: vLLM computes them without the connector"
    if data.get("truncate_prompt_tokens") is not None:
        return "truncate_prompt_tokens: truncation would cut the entry off the context"
    return None


class LibraryMiddleware:
    """See the module docstring."""

    def __init__(self, app: Any, settings: dict[str, Any] | None = None, served: Any = None) -> None:
        self.app = app
        cfg = settings if settings is not None else json.loads(os.environ[ENV])
        self.mode, self.model_name, self.journal = cfg["retrieval"], cfg["model_name"], cfg.get("journal") or ""
        self.chat_template = str(cfg.get("chat_template") or "")
        self.context = int(cfg.get("context") or 0)  # the model's context in tokens (0: vLLM's own check only)
        from kvstore import backend_tools

        self.wire = backend_tools(cfg["backend"])  # the connector's request keys, its answers, its body reader
        if served is None:
            from harness.serve.library import ServedLibrary
            from kvstore import load_text_model

            text = load_text_model(cfg["backend"], model=cfg.get("model", ""), model_name=cfg["model_name"])
            served = ServedLibrary(cfg["library"], cfg["store"], cfg["retrieval"], text, cfg["template"],
                                   project_root=cfg.get("project_root") or ".",
                                   overrides=list(cfg.get("library_overrides") or []))
            served.audit()  # in the process that serves it, with open_library's checks: served as audited
        self.served = served

    # ------------------------------------------------------------------ ASGI
    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        path = scope.get("path")
        if scope.get("type") != "http" or scope.get("method") != "POST" or path not in (COMPLETIONS, CHAT):
            await self.app(scope, receive, send)
            return
        messages, body = await self.wire.read_body(receive)
        data = _loads(body)
        if not isinstance(data, dict):
            await self.app(scope, _replay(messages, receive), send)
            return
        await self.handle(scope, path, data, send, receive)

    async def handle(self, scope: dict, path: str, data: dict[str, Any], send: Any, client: Any = None) -> None:
        """Apply the module's rule to one parsed request; `client` is the client's receive (after the body: its
        disconnect, which vLLM's handlers watch to cancel a request)."""
        client = client if client is not None else _never
        condition = "graft"
        model = data.get("model")
        if isinstance(model, str) and model == self.model_name + INCONTEXT_SUFFIX:
            condition, data["model"] = "incontext", self.model_name
        note: dict[str, Any] = {"retrieval": self.mode, "condition": condition, "problem": None, "entry": None}
        extra: dict[str, Any] = {}
        asked = data.pop("kv_transfer_params", None)
        if asked not in (None, {}):
            keys = sorted(map(str, asked)) if isinstance(asked, dict) else [type(asked).__name__]
            await _error(send, 400, f"a library request carries no kv_transfer_params of its own (the library decides "
                                    f"what is grafted; found {', '.join(keys)}): drop them, or ask a server without "
                                    "LIBRARY")
            return
        why = bad_text(data)
        if why:
            await _error(send, 400, f"the request's {why}: send UTF-8 text")
            return
        if path == CHAT and data.get("stream"):
            await _error(send, 400, "a chat request to the library-aware server is answered unstreamed (its answer is "
                                    "computed on the composed token ids): set stream=false, or stream a completion")
            return
        refused = self.refusal()
        texts = request_texts(path, data)
        if isinstance(texts, tuple) and not texts[0].strip():
            await _error(send, 400, "the prompt is empty (a completion's prompt, or a chat request's last user "
                                    "message): send the problem's text")
            return
        if refused:
            note["outcome"], note["why"] = "refused", refused
            await self._forward(scope, path, data, send, note, extra, chat=False, client=client)
            return
        if isinstance(texts, str):
            note["outcome"] = "not grafted"
            note["why"] = self.untold(texts)
            await self._forward(scope, path, data, send, note, extra, chat=False, client=client)
            return
        found = await asyncio.to_thread(self.served.find, texts[0], texts[1])
        note["problem"] = found.describe()
        if found.problem is None:
            note["outcome"] = "not grafted"
            note["why"] = self.untold(found.why)
            await self._forward(scope, path, data, send, note, extra, chat=False, client=client)
            return
        nograft = not_graftable(data)
        if nograft:
            note["outcome"], note["why"] = "not grafted", f"{nograft}: served as sent, no library entry"
            await self._forward(scope, path, data, send, note, extra, chat=False, client=client)
            return
        prompt = texts[0] if path == COMPLETIONS else chat_text(self.chat_template, data["messages"])
        out = _as_completion(data) if path == CHAT else dict(data)
        salt = uuid.uuid4().hex  # this request's blocks only: nothing computed or grafted by another request is reused
        out["cache_salt"] = salt
        match = None
        try:
            match = await asyncio.to_thread(self.served.retrieve, found)
            composed = (await asyncio.to_thread(self.served.compose, found.problem, match, prompt)
                        if match is not None else None)
        except Exception as e:  # noqa: BLE001 - an entry that cannot be read costs this request its graft only
            why = f"{type(e).__name__}: {e}"
            if match is not None:
                note["entry"] = {"entry": match.entry.entry_id, "problem_id": match.entry.problem_id,
                                 "artifact": match.entry.artifact_id, "tokens": match.entry.tokens}
                extra[self.wire.REFUSED] = [{"artifact": match.entry.artifact_id, "tokens": match.entry.tokens,
                                   "first_difference": why, "differences": [why]}]
            note["outcome"] = "refused"
            note["why"] = f"the library entry was refused for this request ({why}); the client's text served alone"
            out["prompt"] = prompt
            await self._forward(scope, COMPLETIONS, out, send, note, extra, chat=path == CHAT, client=client)
            return
        if composed is None:
            note["outcome"] = "not grafted"
            note["why"] = "retrieval found no entry for this problem; the client's text served alone"
            out["prompt"] = prompt
            await self._forward(scope, COMPLETIONS, out, send, note, extra, chat=path == CHAT, client=client)
            return
        note["entry"] = composed.describe()
        too_long = self._over_context(len(composed.context_ids), out)
        if too_long:
            await _error(send, 400, too_long)
            return
        out["prompt"] = composed.context_ids
        if condition == "graft":
            out["kv_transfer_params"] = {self.wire.GRAFT_MARK: composed.match.entry.artifact_id,
                                         self.wire.GRAFT_TOKENS: composed.entry_tokens}
        else:  # the entry alone first, from a clean cache (this salt), then the whole context hits its blocks
            status = await self._internal(scope, {"model": self.model_name, "cache_salt": salt, "max_tokens": 1,
                                                  "temperature": 0.0, "prompt": composed.context_ids[
                                                      : composed.entry_tokens]}, client)
            if status != 200:
                await _error(send, 500, f"the in-context control's entry prefill answered {status}; see the "
                                        "server log")
                return
        await self._forward(scope, COMPLETIONS, out, send, note, extra, chat=path == CHAT, client=client)

    def _over_context(self, tokens: int, out: dict[str, Any]) -> str | None:
        """Why a composed context of `tokens` (and the request's max_tokens) does not fit the model's context."""
        if not self.context:
            return None
        wanted = out.get("max_tokens") if isinstance(out.get("max_tokens"), int) else 16
        if tokens + wanted <= self.context:
            return None
        return (f"the library entry and the request's text are {tokens} tokens, with max_tokens {wanted} past the "
                f"model's context of {self.context}: send a shorter text or fewer max_tokens")

    def refusal(self) -> str | None:
        """Why the served library cannot be used now (its folder changed since the server started), or None."""
        check = getattr(self.served, "changed", None)
        return check() if check is not None else None

    async def _internal(self, scope: dict, data: dict[str, Any], client: Any) -> int:
        """One request to the app itself (COMPLETIONS); its status."""
        body = json.dumps(data).encode()
        sub = {**scope, "path": COMPLETIONS, "raw_path": COMPLETIONS.encode(),
               "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]}
        sent = [{"type": "http.request", "body": body, "more_body": False}]
        status = 0

        async def receive() -> dict:
            return sent.pop(0) if sent else await client()  # then the client's own: its disconnect

        async def sink(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])

        await self.app(sub, receive, sink)
        return status

    def untold(self, why: str) -> str:
        """Why a request whose problem cannot be told is served without a graft (fail closed where the retrieval
        excludes the request's problem)."""
        return f"no problem can be told: {why}" + (
            f"; {self.mode} cannot exclude a problem it cannot tell, so nothing is grafted (fail closed)"
            if self.served.excludes else "; served as sent, nothing grafted")

    async def _forward(self, scope: dict, path: str, data: dict[str, Any], send: Any, note: dict[str, Any],
                       extra: dict[str, Any], chat: bool, client: Any) -> None:
        """Send `data` to the app at `path`; a non-streamed JSON answer gains `note` (and `extra`) in its
        kv_transfer_params (as a chat completion when `chat`), and the journal a line; `client` is the client's
        receive."""
        body = json.dumps(data).encode()
        headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() not in (b"content-length",)]
        sub = {**scope, "path": path, "raw_path": path.encode(), "headers": headers + [
            (b"content-length", str(len(body)).encode())]}
        sent = [{"type": "http.request", "body": body, "more_body": False}]
        start: dict[str, Any] = {}
        chunks: list[bytes] = []
        streaming = bool(data.get("stream"))

        async def receive() -> dict:
            return sent.pop(0) if sent else await client()  # then the client's own: its disconnect

        async def capture(message: dict) -> None:
            if streaming:
                await send(message)
                return
            if message["type"] == "http.response.start":
                start.update(message)
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    await self._answer(send, start, b"".join(chunks), note, extra, chat)
            else:
                await send(message)

        await self.app(sub, receive, capture)
        if streaming:
            self._journal(note, None)

    async def _answer(self, send: Any, start: dict[str, Any], body: bytes, note: dict[str, Any],
                      extra: dict[str, Any], chat: bool) -> None:
        data = _loads(body) if int(start.get("status", 500)) == 200 else None
        if isinstance(data, dict):
            told = data.get("kv_transfer_params") if isinstance(data.get("kv_transfer_params"), dict) else {}
            note = {**note, **outcome(note, told, self.wire)}
            data["kv_transfer_params"] = {**told, **extra, LIBRARY_KEY: note}
            if chat:
                data = _as_chat(data)
            self._journal(note, data)
            body = json.dumps(data).encode()
        headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
        await send({"type": "http.response.start", "status": start.get("status", 500),
                    "headers": headers + [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    def _journal(self, note: dict[str, Any], response: dict[str, Any] | None) -> None:
        if not self.journal:
            return
        told = (response or {}).get("kv_transfer_params") or {}
        line = {"event": "library", "time": round(time.time(), 3), "response": (response or {}).get("id"),
                "library": self.served.library.manifest_sha256,
                **note, "grafted": told.get(self.wire.GRAFTED), "refused": told.get(self.wire.REFUSED)}
        try:
            with open(self.journal, "a", encoding="utf-8") as f:
                f.write(json.dumps(line, sort_keys=True) + "\n")
        except OSError:
            pass  # the connector logs an unwritable journal; the request is answered either way


def outcome(note: dict[str, Any], told: dict[str, Any], wire: Any) -> dict[str, Any]:
    """What happened to the note's entry, from the connector's words in the response (`told`, its keys `wire`'s):
    grafted, refused, read in context, or said nothing (a stop string ends a request before the engine reports to the
    connector)."""
    if "outcome" in note or note.get("entry") is None:
        return {}
    if note.get("condition") == "incontext":
        return {"outcome": "in context"}
    if told.get(wire.REFUSED):
        return {"outcome": "refused", "why": "the connector refused the entry's artifact (kvgraft_refused); the "
                                             "context was computed"}
    if told.get(wire.GRAFTED):
        return {"outcome": "grafted"}
    return {"outcome": "unconfirmed", "why": "the response was answered before the engine reported to the connector "
                                             "(a stop string ended it): the journal's graft line is the record"}


async def _never() -> dict:
    """A receive that never reports a disconnect (no client to watch)."""
    import asyncio

    await asyncio.Event().wait()
    return {"type": "http.disconnect"}


def _replay(messages: list[dict], receive: Any) -> Any:
    async def replay() -> dict:
        return messages.pop(0) if messages else await receive()

    return replay


async def _error(send: Any, status: int, message: str) -> None:
    body = json.dumps({"error": {"message": message, "type": "BadRequestError" if status < 500 else "InternalError",
                                 "param": None, "code": status}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _as_completion(chat: dict[str, Any]) -> dict[str, Any]:
    """The completions request a chat request becomes (its sampling keys; max_completion_tokens as max_tokens)."""
    out = {k: chat[k] for k in CHAT_KEYS if k in chat}
    if "max_completion_tokens" in chat:
        out["max_tokens"] = chat["max_completion_tokens"]
    out["model"] = chat.get("model")
    return out


def _as_chat(completion: dict[str, Any]) -> dict[str, Any]:
    """A completion answer as a chat completion (each choice's text as the assistant's message)."""
    choices = [{"index": c.get("index", i), "message": {"role": "assistant", "content": c.get("text", "")},
                "finish_reason": c.get("finish_reason"), "logprobs": None}
               for i, c in enumerate(completion.get("choices") or [])]
    return {"id": str(completion.get("id", "")).replace("cmpl-", "chatcmpl-", 1), "object": "chat.completion",
            "created": completion.get("created"), "model": completion.get("model"), "choices": choices,
            "usage": completion.get("usage"), "kv_transfer_params": completion.get("kv_transfer_params")}
