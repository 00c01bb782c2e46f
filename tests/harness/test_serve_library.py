"""The graft condition behind an OpenAI endpoint (harness/serve, issue 53), without an engine: the server's
retrieval and composition are the graft condition's own (the same context ids, the same entry, per problem), the
library is audited at start (edited, another model's, an artifact missing: one line), the problem rule, and
LibraryMiddleware's rewriting of requests and answers against a scripted ASGI app (graft, in-context, no problem, a
request with its own kvgraft keys, an entry whose artifact was removed while serving, chat, a body nested too deep).
The libraries are built as `make library` builds them (FakeBackend). The server on vLLM, end to end:
tests/harness/test_lmeval_serve.py."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from harness.config.schema import DecodingConfig, PromptConfig, compose_config
from harness.errors import ConfigError, LibraryError
from harness.library.build import build_library
from harness.record.hashing import write_jsonl
from harness.run.conditions import Graft
from harness.serve.library import ServedLibrary
from harness.serve.middleware import INCONTEXT_SUFFIX, LibraryMiddleware
from harness.task.problems import load_problems
from kvstore.backends.fake import FakeBackend

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = PromptConfig().template


@pytest.fixture(scope="module")
def problems():
    return load_problems(str(REPO / "problems/kvgraft_original.jsonl"))[:4]


def build(be, problems, root: Path) -> Path:
    """The library `make library` builds from `problems` (written to a problem file under `root`, each with its
    worked solution) on the backend `be`, into root/lib and root/store: the folder the server opens."""
    source = root / "problems.jsonl"
    write_jsonl(source, [p.to_row() for p in problems])
    cfg = compose_config(["library=kvgraft_original", f"library.dataset.path={source}", f"library.root={root / 'lib'}",
                          f"library.store={root / 'store'}"])
    return build_library(cfg.library, be, REPO, progress=False)


@pytest.fixture()
def fake():
    return FakeBackend({"Final answer:": " 7\n\nmore"})


@pytest.fixture()
def lib(fake, problems, tmp_path):
    return build(fake, problems, tmp_path)


@pytest.mark.parametrize("mode", ["recurring", "held-out", "random"])
def test_the_server_composes_what_the_graft_condition_composes(fake, problems, lib, tmp_path, mode):
    served = ServedLibrary(lib, str(tmp_path / "store"), mode, fake, TEMPLATE)
    served.audit()
    graft = Graft(fake, PromptConfig(), DecodingConfig(max_new_tokens=2), served.library)
    for p in problems:
        mine = served.compose(served.problem(served.query(p)))
        ctx = graft.context(p)
        assert mine.context_ids == ctx.context_ids and mine.match.entry == ctx.match.entry and mine.prompt == ctx.prompt
        assert (mine.match.entry.problem_id == p.id) == (mode == "recurring")


def test_the_problem_rule(fake, problems, lib, tmp_path):
    served = ServedLibrary(lib, str(tmp_path / "store"), "recurring", fake, TEMPLATE)
    p = problems[1]
    for text in (served.query(p), p.problem, f"  {p.problem}\n"):
        got = served.problem(text)
        assert (got.id, got.problem, got.answer) == (p.id, p.problem, p.answer)
    assert served.problem("  \n") is None and served.problem("What is 2+2?").id.startswith("request-")


def test_the_audit_refuses_an_edited_library_another_models_and_a_missing_artifact(fake, lib, tmp_path):
    store = str(tmp_path / "store")
    with pytest.raises(ConfigError, match="RETRIEVAL='sideways' is not one of"):
        ServedLibrary(lib, store, "sideways", fake, TEMPLATE)
    with pytest.raises(LibraryError, match="built for another model"):
        ServedLibrary(lib, store, "recurring", FakeBackend({"x": "y"}), TEMPLATE).audit()
    row = json.loads((lib / "index.jsonl").read_text().splitlines()[0])
    aid = row["artifact_id"]
    obj = next((tmp_path / "store" / "objects").rglob(aid[2:]))
    obj.rename(obj.with_name("gone"))
    with pytest.raises(LibraryError, match=f"entry {row['entry_id']} .*artifact {aid[:16]}"):
        ServedLibrary(lib, store, "recurring", fake, TEMPLATE).audit()
    obj.with_name("gone").rename(obj)
    text = (lib / "index.jsonl").read_text().replace(row["answer"], "999", 1)
    (lib / "index.jsonl").write_text(text)
    with pytest.raises(LibraryError, match="modified"):
        ServedLibrary(lib, store, "recurring", fake, TEMPLATE)


# ------------------------------------------------------------------ the middleware against a scripted app
class App:
    """vLLM's API server as far as the middleware sees it: records each request body, answers a completion whose
    kv_transfer_params say what a connector would (grafted when the request named an artifact)."""

    def __init__(self) -> None:
        self.bodies: list[tuple[str, dict | bytes]] = []

    async def __call__(self, scope, receive, send) -> None:  # noqa: ANN001
        raw = b""
        while True:
            m = await receive()
            raw += m.get("body", b"")
            if not m.get("more_body"):
                break
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):
            self.bodies.append((scope["path"], raw))
            await send({"type": "http.response.start", "status": 400, "headers": []})
            await send({"type": "http.response.body", "body": b'{"error": "bad body"}'})
            return
        self.bodies.append((scope["path"], body))
        asked = body.get("kv_transfer_params") or {}
        told = {"kvgraft_grafted": {"artifact": asked["kvgraft_graft"], "tokens": 128}} if "kvgraft_graft" in asked \
            else None
        out = json.dumps({"id": "cmpl-1", "object": "text_completion", "model": body.get("model"),
                          "choices": [{"index": 0, "text": " 7", "finish_reason": "stop"}], "usage": {},
                          "kv_transfer_params": told}).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", b"1")]})
        await send({"type": "http.response.body", "body": out})


def call(mw: LibraryMiddleware, path: str, body: bytes) -> tuple[int, dict | bytes]:
    sent: list[dict] = []
    chunks = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict:
        return chunks.pop(0)

    async def send(m: dict) -> None:
        sent.append(m)

    asyncio.run(mw({"type": "http", "method": "POST", "path": path, "headers": []}, receive, send))
    raw = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    heads = dict(sent[0].get("headers", []))
    if b"content-length" in heads:
        assert int(heads[b"content-length"]) == len(raw)
    try:
        return sent[0]["status"], json.loads(raw)
    except ValueError:
        return sent[0]["status"], raw


@pytest.fixture()
def mw(fake, lib, tmp_path):
    served = ServedLibrary(lib, str(tmp_path / "store"), "held-out", fake, TEMPLATE)
    settings = {"retrieval": "held-out", "model_name": "m", "journal": str(tmp_path / "journal.jsonl"),
                "backend": "vllm"}  # the connector whose keys the middleware writes
    return LibraryMiddleware(App(), settings=settings, served=served)


def test_a_graft_request_names_the_entry_its_artifact_and_tokens(mw, problems, tmp_path):
    p = problems[0]
    status, out = call(mw, "/v1/completions", json.dumps({"model": "m", "prompt": p.problem, "max_tokens": 4}).encode())
    composed = mw.served.compose(mw.served.problem(p.problem), prompt=p.problem)
    path, sent = mw.app.bodies[0]
    assert path == "/v1/completions" and sent["prompt"] == composed.context_ids and sent["max_tokens"] == 4
    assert sent["kv_transfer_params"] == {"kvgraft_graft": composed.match.entry.artifact_id,
                                          "kvgraft_tokens": composed.entry_tokens}
    assert len(sent["cache_salt"]) == 32
    told = out["kv_transfer_params"]
    assert status == 200 and told["kvgraft_grafted"]["artifact"] == composed.match.entry.artifact_id
    assert told["kvgraft_library"]["entry"]["problem_id"] != p.id  # held-out: never its own entry
    assert told["kvgraft_library"]["entry"] == composed.describe()
    line = json.loads((tmp_path / "journal.jsonl").read_text().splitlines()[-1])
    assert line["event"] == "library" and line["response"] == "cmpl-1" and line["entry"] == composed.describe()
    call(mw, "/v1/completions", json.dumps({"model": "m", "prompt": p.problem}).encode())
    assert mw.app.bodies[1][1]["cache_salt"] != sent["cache_salt"]  # no request reuses another's blocks


def test_the_incontext_control_computes_the_entry_alone_then_the_context(mw, problems):
    p = problems[2]
    status, out = call(mw, "/v1/completions", json.dumps({"model": "m" + INCONTEXT_SUFFIX, "prompt": p.problem,
                                                          "max_tokens": 4}).encode())
    composed = mw.served.compose(mw.served.problem(p.problem), prompt=p.problem)
    (_, first), (_, second) = mw.app.bodies
    assert first["prompt"] == composed.context_ids[: composed.entry_tokens] and first["max_tokens"] == 1
    assert second["prompt"] == composed.context_ids and "kv_transfer_params" not in second
    assert first["cache_salt"] == second["cache_salt"] and second["model"] == "m"
    assert status == 200 and out["kv_transfer_params"]["kvgraft_library"]["condition"] == "incontext"
    assert "kvgraft_grafted" not in out["kv_transfer_params"]


@pytest.mark.parametrize("body", [{"model": "m", "prompt": [1, 2, 3]}, {"model": "m", "prompt": ["a", "b"]}])
def test_a_request_without_a_problem_is_served_as_sent_and_says_so(mw, body):
    status, out = call(mw, "/v1/completions", json.dumps(body).encode())
    assert status == 200 and mw.app.bodies == [("/v1/completions", body)]
    note = out["kv_transfer_params"]["kvgraft_library"]
    assert note["entry"] is None and note["why"]


def test_an_entry_whose_artifact_was_removed_is_refused_for_that_request_only(mw, problems, tmp_path):
    p = problems[0]
    aid = mw.served.compose(mw.served.problem(p.problem), prompt=p.problem).match.entry.artifact_id
    obj = next((tmp_path / "store" / "objects").rglob(aid[2:]))
    obj.rename(obj.with_name("gone"))
    status, out = call(mw, "/v1/completions", json.dumps({"model": "m", "prompt": p.problem}).encode())
    assert status == 200 and mw.app.bodies[0][1]["prompt"] == p.problem  # the client's text alone
    told = out["kv_transfer_params"]
    assert told["kvgraft_refused"][0]["artifact"] == aid and "NotFoundError" in told["kvgraft_refused"][0][
        "first_difference"]
    assert told["kvgraft_library"]["entry"]["artifact"] == aid
    obj.with_name("gone").rename(obj)
    status, out = call(mw, "/v1/completions", json.dumps({"model": "m", "prompt": p.problem}).encode())
    assert "kvgraft_grafted" in out["kv_transfer_params"]  # the next request grafts again


def test_a_chat_request_is_answered_as_a_chat_completion_on_the_composed_context(mw, problems):
    p = problems[3]
    body = {"model": "m", "messages": [{"role": "user", "content": p.problem}], "max_completion_tokens": 5}
    status, out = call(mw, "/v1/chat/completions", json.dumps(body).encode())
    path, sent = mw.app.bodies[0]
    assert path == "/v1/completions" and sent["prompt"] == mw.served.compose(mw.served.problem(p.problem),
                                                                             prompt=p.problem).context_ids
    assert sent["max_tokens"] == 5
    assert status == 200 and out["object"] == "chat.completion" and out["choices"][0]["message"]["content"] == " 7"
    assert "kvgraft_grafted" in out["kv_transfer_params"]
    status, out = call(mw, "/v1/chat/completions", json.dumps({**body, "stream": True}).encode())
    assert status == 400 and "stream" in out["error"]["message"]


def test_a_body_nested_too_deeply_reaches_the_app_untouched(mw):
    body = b'{"kv_transfer_params": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    status, _ = call(mw, "/v1/completions", body)
    assert status == 400 and mw.app.bodies == [("/v1/completions", body)]


def test_vllm_sees_the_client_connected_while_it_computes(mw, problems):
    """vLLM's handlers cancel a request whose client disconnected (they read `receive` for http.disconnect): the
    rewritten request's receive must report the client's own state, not a disconnect of its own making (which made
    every library request answer `null`)."""
    import asyncio

    seen: list[str] = []

    async def app(scope, receive, send) -> None:  # noqa: ANN001
        while (await receive()).get("more_body", False):
            pass
        try:
            await asyncio.wait_for(receive(), 0.2)
            seen.append("disconnected")
        except TimeoutError:
            seen.append("connected")
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    mw.app = app
    body = json.dumps({"model": "m", "prompt": problems[0].problem}).encode()
    chunks = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict:
        if chunks:
            return chunks.pop(0)
        await asyncio.Event().wait()  # the client stays connected
        return {"type": "http.disconnect"}

    async def send(m: dict) -> None:
        pass

    asyncio.run(mw({"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}, receive, send))
    assert seen == ["connected"]


# ------------------------------------------------------------------ issue 60: any wording
def wordings(p, template=TEMPLATE) -> list[str]:
    """The same problem as other harnesses' users write it."""
    latex = p.problem.replace("$", "\\(", 1).replace("$", "\\)", 1) if p.problem.count("$") >= 2 else p.problem
    return [template.replace("{problem}", p.problem), f"Question: {p.problem}\nAnswer:",
            template.replace("{problem}", p.problem) + " ", p.problem + ".", f"Problem: {latex}\nAnswer:",
            "  " + p.problem.upper().replace(" ", "\n  ") + "\n\nGive only the integer answer.",
            "Ｑ: " + p.problem.replace("1", "１")]


def test_the_problem_is_found_by_content_whatever_the_wording(fake, problems, lib, tmp_path):
    """Item 1: every wording of a library problem (another template, a space more, a full stop, a LaTeX delimiter,
    case and line breaks, full-width forms; a system message; few-shot examples before it) finds that problem."""
    served = ServedLibrary(lib, str(tmp_path / "store"), "held-out", fake, TEMPLATE)
    for p in problems:
        shots = "".join(f"Question: {q.problem}\nAnswer: {q.answer}\n\n" for q in problems if q.id != p.id)
        for text in [*wordings(p), shots + f"Question: {p.problem}\nAnswer:"]:
            found = served.find(text)
            assert (found.problem.id, found.how) == (p.id, "library"), text
        found = served.find(f"Solve it.\n\n{p.problem}", ["You are a careful mathematician."])  # chat
        assert found.problem.id == p.id
    # few-shot library examples before a problem the library does not hold: the asked one is the new text
    shots = "".join(f"Question: {q.problem}\nAnswer: {q.answer}\n\n" for q in problems)
    found = served.find(shots + "Question: What is the sum of 2 and 3?\nAnswer:")
    assert found.how == "text" and found.problem.problem.startswith("What is the sum of 2 and 3?")
    assert set(found.describe()["in_request"]) == {q.id for q in problems}


def _note(out):
    return out["kv_transfer_params"]["kvgraft_library"]


def test_held_out_never_grafts_a_problem_in_the_request_whatever_the_wording(mw, problems, tmp_path):
    """Item 2: under held-out no response names the own entry, nor an entry whose problem is elsewhere in the
    request (few-shot examples, a system message), nor a near duplicate; the note names the problem found."""
    for p in problems:
        for text in wordings(p):
            mw.app.bodies.clear()
            status, out = call(mw, "/v1/completions", json.dumps({"model": "m", "prompt": text}).encode())
            note = _note(out)
            assert status == 200 and note["problem"]["problem_id"] == p.id and note["entry"]["problem_id"] != p.id
            assert note["outcome"] == "grafted"
    a, b, c, d = problems
    shots = f"Question: {a.problem}\nAnswer: {a.answer}\n\nQuestion: {b.problem}\nAnswer: {b.answer}\n\n"
    status, out = call(mw, "/v1/completions", json.dumps({"model": "m", "prompt": shots + f"Question: {c.problem}"
                                                                                          "\nAnswer:"}).encode())
    assert _note(out)["entry"]["problem_id"] == d.id  # a, b (examples) and c (asked) all excluded
    body = {"model": "m", "messages": [{"role": "system", "content": f"Example: {a.problem}"},
                                       {"role": "user", "content": f"{b.problem}\n\nAnd now: {c.problem}"}]}
    status, out = call(mw, "/v1/chat/completions", json.dumps(body).encode())
    assert _note(out)["problem"]["problem_id"] == c.id and _note(out)["entry"]["problem_id"] == d.id
    near = d.problem.replace(d.problem.split()[3], "seven", 1)  # one word changed: a near duplicate of d
    status, out = call(mw, "/v1/completions", json.dumps({"model": "m", "prompt": f"{near}\n{a.problem}"}).encode())
    assert d.id in _note(out)["problem"]["in_request"] and _note(out)["entry"]["problem_id"] not in (a.id, d.id)


def test_held_out_fails_closed_when_the_problem_cannot_be_told(mw):
    """Item 2: token ids (or several prompts) under held-out: nothing grafted, and the note says why."""
    status, out = call(mw, "/v1/completions", json.dumps({"model": "m", "prompt": [5, 6, 7]}).encode())
    note = _note(out)
    assert status == 200 and note["entry"] is None and "fail closed" in note["why"]
    assert "kv_transfer_params" not in mw.app.bodies[0][1]
    line = json.loads(Path(mw.journal).read_text().splitlines()[-1])
    assert "fail closed" in line["why"] and line["outcome"] == "not grafted"


def test_the_clients_text_is_sent_after_the_entry_and_the_harness_prompt_equals_the_harness_row(
        fake, problems, lib, tmp_path, mw):
    """Item 3: the context is the entry's tokens then the client's text as sent (no kvgraft prompt around it); the
    harness's own prompt gives the harness's own context; the in-context control reads the same text; a chat request
    is its conversation as the chat template renders it."""
    p = problems[1]
    graft = Graft(fake, PromptConfig(), DecodingConfig(max_new_tokens=2), mw.served.library)
    harness = graft.context(p)
    for model in ("m", "m" + INCONTEXT_SUFFIX):
        for text in (f"Question: {p.problem}\nAnswer:", TEMPLATE.replace("{problem}", p.problem)):
            mw.app.bodies.clear()
            call(mw, "/v1/completions", json.dumps({"model": model, "prompt": text}).encode())
            sent = mw.app.bodies[-1][1]["prompt"]
            entry = mw.served.library.store.get(_note_entry(mw, text)).token_ids
            assert sent == list(entry) + fake.encode(text, add_bos=False)
            if text.startswith("Problem:"):
                assert sent == harness.context_ids
    mw.chat_template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}<assistant>"
    body = {"model": "m", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": p.problem}]}
    mw.app.bodies.clear()
    call(mw, "/v1/chat/completions", json.dumps(body).encode())
    assert fake.decode(mw.app.bodies[-1][1]["prompt"]).endswith(f"<system>Be brief.\n<user>{p.problem}\n<assistant>")


def _note_entry(mw, text: str) -> str:
    found = mw.served.find(text)
    return mw.served.retrieve(found).entry.artifact_id


@pytest.mark.parametrize("model", ["m", "m" + INCONTEXT_SUFFIX])
@pytest.mark.parametrize("keys", [{"kvgraft_graft": "0" * 64}, {"kvgraft_deposit": True, "kvgraft_tokens": 3}])
def test_a_clients_own_kvgraft_keys_on_a_library_request_are_a_400_naming_them(mw, problems, model, keys):
    """Item 5: the client cannot steer a library request, on either model name."""
    status, out = call(mw, "/v1/completions", json.dumps({"model": model, "prompt": problems[0].problem,
                                                          "kv_transfer_params": keys}).encode())
    assert status == 400 and all(k in out["error"]["message"] for k in keys) and mw.app.bodies == []


@pytest.mark.parametrize("extra,why", [({"echo": True, "logprobs": 1}, "echo"), ({"prompt_logprobs": 1}, "prompt_logprobs"),
                                       ({"truncate_prompt_tokens": 10}, "truncat")])
def test_every_response_says_what_happened_to_the_entry(mw, problems, extra, why):
    """Item 6: a request vLLM would answer without the connector is not grafted and says why; a graft the
    connector did not report is `unconfirmed`, never silence."""
    status, out = call(mw, "/v1/completions", json.dumps({"model": "m", "prompt": problems[0].problem,
                                                          **extra}).encode())
    note = _note(out)
    assert note["outcome"] == "not grafted" and why in note["why"] and "kv_transfer_params" not in mw.app.bodies[0][1]

    async def silent(scope, receive, send) -> None:  # noqa: ANN001 - a connector that said nothing (a stop string)
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": json.dumps({"id": "cmpl-2", "choices": []}).encode()})

    mw.app = silent
    status, out = call(mw, "/v1/completions", json.dumps({"model": "m", "prompt": problems[0].problem}).encode())
    assert _note(out)["outcome"] == "unconfirmed" and _note(out)["entry"] is not None


@pytest.mark.parametrize("prompt,say", [('"\\ud800 x"', "lone surrogate"), ('"  \\n "', "empty")])
def test_bad_text_is_a_400_in_one_line(mw, prompt, say):
    """Item 7: a lone surrogate (JSON escape) and an empty text are a 400, not a 500 or a silent pass."""
    status, out = call(mw, "/v1/completions", b'{"model": "m", "prompt": ' + prompt.encode() + b"}")
    assert status == 400 and say in out["error"]["message"] and "\n" not in out["error"]["message"]
    assert mw.app.bodies == []


def test_a_context_past_the_models_is_a_400(mw, problems):
    mw.context = 64
    status, out = call(mw, "/v1/completions", json.dumps({"model": "m", "prompt": problems[0].problem}).encode())
    assert status == 400 and "context of 64" in out["error"]["message"] and mw.app.bodies == []


def test_retrieval_runs_off_the_event_loop(mw, problems, monkeypatch):
    """Item 7: a slow retrieval does not hold the event loop (another coroutine runs meanwhile)."""
    import threading
    import time

    loop_threads = []
    real = mw.served.find

    def slow(*a, **k):
        loop_threads.append(threading.current_thread() is threading.main_thread())
        time.sleep(0.3)
        return real(*a, **k)

    monkeypatch.setattr(mw.served, "find", slow)
    ticks = []

    async def both():
        async def tick():
            for _ in range(5):
                ticks.append(time.perf_counter())
                await asyncio.sleep(0.02)

        body = json.dumps({"model": "m", "prompt": problems[0].problem}).encode()
        chunks = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive():
            return chunks.pop(0)

        async def send(m):
            pass

        await asyncio.gather(mw({"type": "http", "method": "POST", "path": "/v1/completions", "headers": []},
                                receive, send), tick())

    asyncio.run(both())
    assert loop_threads == [False] and ticks[-1] - ticks[0] < 0.25


def test_the_near_duplicate_threshold_joins_no_two_bundled_problems():
    """Item 2: the threshold's cost measured on the bundled problems: no two distinct problems are one (the 975
    AIME problems: docs/vllm.md)."""
    from itertools import combinations

    from harness.library.content import MIN_SHINGLES, NEAR_DUPLICATE, containment, normal, shingles

    ps = load_problems(str(REPO / "problems/kvgraft_original.jsonl"))
    joined = [(a.id, b.id) for a, b in combinations(ps, 2)
              if normal(a.problem) in normal(b.problem) or normal(b.problem) in normal(a.problem)
              or max(containment(shingles(a.problem), shingles(b.problem)),
                     containment(shingles(b.problem), shingles(a.problem))) >= NEAR_DUPLICATE]
    assert all(len(shingles(p.problem)) >= MIN_SHINGLES for p in ps) and joined == []


def test_the_twin_check_counts_grafted_rows_and_is_not_ok_on_none():
    """Item 7: two runs with nothing grafted (or no rows at all) are not a passed twin check."""
    from harness.compare.pairing import pair

    assert pair([], []).ok is False and pair([], []).grafted == 0


def test_a_library_folder_changed_after_start_is_refused_per_request(mw, problems, lib):
    """Item 4: the bytes served are the bytes audited: an index edited while serving grafts nothing, in one line."""
    call(mw, "/v1/completions", json.dumps({"model": "m", "prompt": problems[0].problem}).encode())
    assert "kv_transfer_params" in mw.app.bodies[-1][1]
    (lib / "index.jsonl").write_text((lib / "index.jsonl").read_text() + "\n")
    status, out = call(mw, "/v1/completions", json.dumps({"model": "m", "prompt": problems[0].problem}).encode())
    note = _note(out)
    assert status == 200 and note["outcome"] == "refused" and "changed since the server" in note["why"]
    assert "kv_transfer_params" not in mw.app.bodies[-1][1]


def test_lmeval_compare_refuses_two_samples_files_and_a_journal_of_another_retrieval(tmp_path):
    """Item 7: the samples file is the one run's (never the newest of several), and the server's journal must be of
    the run's retrieval and library."""
    from harness.errors import HarnessError
    from scripts.lmeval_compare import journal_entries, lmeval_samples

    for name in ("a", "b"):
        d = tmp_path / name
        d.mkdir()
        (d / "samples_kvgraft_original_x.jsonl").write_text(json.dumps(
            {"doc": {"id": "kvg-001"}, "resps": [["7"]], "correct": 1.0}) + "\n")
    assert lmeval_samples(tmp_path / "a") == {"kvg-001": ("7", 1.0)}
    with pytest.raises(HarnessError, match="2 samples files"):
        lmeval_samples(tmp_path)
    j = tmp_path / "journal.jsonl"
    j.write_text(json.dumps({"event": "library", "retrieval": "recurring", "library": "ab" * 32,
                             "problem": {"problem_id": "kvg-001"}, "entry": {"entry": "e1"}}) + "\n")
    assert journal_entries(j, "recurring", "ab" * 32) == {"kvg-001": {"e1"}}
    with pytest.raises(HarnessError, match="RETRIEVAL=recurring"):
        journal_entries(j, "held-out", "ab" * 32)
    with pytest.raises(HarnessError, match="served library"):
        journal_entries(j, "recurring", "cd" * 32)


# ------------------------------------------------------------------ issue 60 (s60b): the harness's rule is the server's
EXTRA = (" Before you answer, note that the committee that wrote this question also asked eleven other questions "
         "about the same figure, none of which you need here, and that every quantity above is a positive integer.")


def _with_near_duplicate(problems, extended: bool):
    """The problems plus a near duplicate of the first (one word changed: another id and fingerprint; `extended`:
    and a sentence added, so the first's shingles lie in it but not the other way round)."""
    from harness.library.content import NEAR_DUPLICATE, containment, shingles
    from harness.task.problems import Problem

    a = problems[0]
    text = a.problem.replace(a.problem.split()[3], "seven", 1) + (EXTRA if extended else "")
    near = Problem(id="near-a", problem=text, answer=a.answer, solution=a.solution)
    assert near.fingerprint != a.fingerprint
    if extended:  # the case a one-way containment misses: the longer one in the shorter's request
        assert containment(shingles(near.problem), shingles(a.problem)) < NEAR_DUPLICATE
    return [*problems, near]


@pytest.mark.parametrize("extended", [False, True], ids=["edited", "edited and extended"])
@pytest.mark.parametrize("mode", ["held-out", "random"])
def test_the_harness_held_out_and_random_exclude_near_duplicates_as_the_server_does(fake, problems, tmp_path, mode,
                                                                                     extended):
    """Item 2, the harness's side: with a near-duplicate pair in the library (one word changed; and a sentence
    added: a near duplicate one way only), the harness's own held-out (BM25: the pair is each other's nearest) and
    random retrieval never give one for the other, and the server retrieves exactly the entry the harness's graft
    condition does for kvgraft's prompt."""
    ps = _with_near_duplicate(problems, extended)
    served = ServedLibrary(build(fake, ps, tmp_path), str(tmp_path / "store"), mode, fake, TEMPLATE)
    graft = Graft(fake, PromptConfig(), DecodingConfig(max_new_tokens=2), served.library)
    pair = {ps[0].id, ps[-1].id}
    for p in ps:
        harness = graft.context(p).match.entry
        assert harness.problem_id != p.id and not (p.id in pair and harness.problem_id in pair), (p.id, harness)
        assert served.retrieve(served.find(served.query(p))).entry == harness


def test_the_content_rule_leaves_the_bundled_held_out_and_random_retrieval_as_it_was():
    """Item 2, the harness's side: over the 40 bundled problems the content rule excludes, for each, its own entry
    only (what the fingerprint and id excluded before), so the bundled held-out and random rows keep their entries."""
    from harness.library.content import ContentIndex

    ps = load_problems(str(REPO / "problems/kvgraft_original.jsonl"))
    index = ContentIndex((p.id, p.problem) for p in ps)
    assert len(ps) == 40 and all(index.present([p.problem], asked=p.problem) == {p.id: 1.0} for p in ps)


def _reseal(lib: Path, edit) -> None:
    """Edit the library's index rows, then recompute every hash of the folder (entries, index, manifest): a re-seal,
    which the hashes alone cannot tell from a build."""
    from harness.record.hashing import jsonl_bytes, sha256_hex, sha256_json, write_json

    rows = [json.loads(x) for x in (lib / "index.jsonl").read_text().splitlines()]
    edit(rows)
    m = json.loads((lib / "manifest.json").read_text())
    m.pop("manifest_sha256")
    m.update(entries={r["entry_id"]: sha256_json(r) for r in rows}, index_sha256=sha256_hex(jsonl_bytes(rows)))
    m["manifest_sha256"] = sha256_json(m)
    write_jsonl(lib / "index.jsonl", rows)
    write_json(lib / "manifest.json", m)


def _swap_artifact(rows) -> None:
    for k in ("artifact_id", "tokens", "tokens_sha256"):
        rows[0][k] = rows[1][k]


def _edit_answer(rows) -> None:
    rows[0]["answer"] = "999"


@pytest.mark.parametrize(("edit", "said"), [(_swap_artifact, "not the encoding of the entry's own text"),
                                            (_edit_answer, "the library's source says")],
                         ids=["another problems artifact", "answer edited"])
def test_the_served_library_is_opened_with_the_graft_conditions_checks_in_the_serving_process(
        fake, lib, tmp_path, monkeypatch, edit, said):
    """Item 4: a library re-sealed after its build (an entry pointed at another problem's artifact; an answer
    edited) is refused by the start audit and by the middleware in the process that serves it (open_library's
    source, identity and entry-token checks), in one line; the intact library serves."""
    import kvstore

    monkeypatch.setattr(kvstore, "load_text_model", lambda *a, **k: fake)
    settings = {"library": str(lib), "store": str(tmp_path / "store"), "retrieval": "held-out", "backend": "fake",
                "model_name": "m", "template": TEMPLATE, "project_root": str(REPO)}
    assert LibraryMiddleware(App(), settings=settings).served.library.path == lib
    _reseal(lib, edit)
    with pytest.raises(LibraryError, match=said) as e:
        ServedLibrary(lib, str(tmp_path / "store"), "held-out", fake, TEMPLATE).audit()
    assert "\n" not in str(e.value)
    with pytest.raises(LibraryError, match=said):
        LibraryMiddleware(App(), settings=settings)


def test_a_folder_whose_content_is_another_librarys_is_refused(fake, lib, tmp_path):
    """Item 4: the folder must be the one its own config builds: a library renamed (copied under another folder
    name) is refused naming where its content belongs."""
    import shutil

    other = lib.parent / "kvgraft_original-v2-000000000000-000000000000"
    shutil.copytree(lib, other)
    with pytest.raises(LibraryError, match="not of this folder"):
        ServedLibrary(other, str(tmp_path / "store"), "recurring", fake, TEMPLATE)
