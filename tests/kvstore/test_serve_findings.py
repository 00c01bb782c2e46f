"""Issue 51, item 9 (the `make serve` findings) and items 4/5 where they need no engine: each test fails on the code
before the fix. The classes closed:

- a client body the API server's middleware cannot parse (nested past the parser's depth, anywhere in the body) is a
  400 naming why, never an exception out of the middleware (a 500 with an ASGI traceback);
- every refusal of `python -m kvstore.backends.vllm.serve` before vLLM starts (no vLLM in this Python, a store path
  that is a file or under one, a store folder that does not exist) is one line and exit status 2, and nothing is
  created before every check passed; a store is created only when asked (--new-store: `make serve`'s default);
- the digest reader never reads lines written before it was opened (another engine's, a reused scratch folder).

The connector's and the vLLM backend's parts (a named artifact whose blocks vLLM already caches, the in-flight
in-context wave, sync scheduling, a greedy request without a token) run in .venv-vllm:
tests/kvstore/vllm_findings_cases.py, through test_findings_in_vllm below.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvstore.backends.vllm.params import ParamsMiddleware, check_params
from kvstore.errors import SettingsError, TransferParamsError

REPO = Path(__file__).resolve().parents[2]
VLLM_PY = REPO / ".venv-vllm" / "bin" / "python"


def post(body: bytes, path: str = "/v1/completions") -> tuple[list[dict], list[dict]]:
    reached: list[dict] = []

    async def app(scope, receive, send) -> None:  # noqa: ANN001
        reached.append(await receive())
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    chunks = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict] = []

    async def receive() -> dict:
        return chunks.pop(0)

    async def send(m: dict) -> None:
        sent.append(m)

    asyncio.run(ParamsMiddleware(app)({"type": "http", "method": "POST", "path": path}, receive, send))
    return sent, reached


DEEP = 100_000


@pytest.mark.parametrize("body", [
    b'{"model": "m", "prompt": "hi", "kv_transfer_params": ' + b'{"a": ' * DEEP + b"1" + b"}" * DEEP + b"}",
    b'{"model": "m", "prompt": "hi", "kv_transfer_params": ' + b"[" * DEEP + b"]" * DEEP + b"}",
    b'{"model": "m", "prompt": ' + b"[" * DEEP + b"]" * DEEP + b"}",
    b'{"model": "m", "messages": [{"role": "user", "content": ' + b"[" * DEEP + b"]" * DEEP + b"}]}",
])
def test_a_body_nested_past_the_parsers_depth_is_a_400_naming_why(body: bytes) -> None:
    sent, reached = post(body)
    assert sent[0]["status"] == 400 and reached == []
    assert "nested too deeply" in json.loads(sent[1]["body"])["error"]["message"]


@pytest.mark.parametrize("body", [b"{", b"\xff\xfe", b'{"prompt": 1e999999}', b'{"n": ' + b"9" * 5000 + b"}",
                                  b"[]", b'"x"', b"", b'{"kv_transfer_params": NaN}'])
def test_any_other_unreadable_body_passes_to_vllm_without_an_exception(body: bytes) -> None:
    sent, _ = post(body)
    assert sent[0]["status"] in (200, 400)


def test_check_params_refuses_an_object_nested_too_deeply() -> None:
    deep: dict = {}
    cur = deep
    for _ in range(DEEP // 10):
        cur["a"] = {}
        cur = cur["a"]
    with pytest.raises(TransferParamsError, match="nested too deeply"):
        check_params({"kvgraft_deposit": deep})


# ------------------------------------------------------------------ the command line
def serve(*args: str, python: str = sys.executable) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-m", "kvstore.backends.vllm.serve", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=300)


def test_without_vllm_the_server_is_one_line_and_creates_nothing(tmp_path: Path) -> None:
    pytest.importorskip("torch")  # this venv: the main one, which has no vLLM
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("this Python has vLLM: the case is a Python without it")
    store = tmp_path / "new" / "store"
    r = serve("--store", str(store), "--new-store")
    assert r.returncode == 2 and not store.exists() and not store.parent.exists()
    assert r.stderr.strip().count("\n") == 0 and "vLLM is not installed" in r.stderr and "make setup-vllm" in r.stderr


def test_store_paths_that_cannot_be_served_are_refused_in_one_line(tmp_path: Path) -> None:
    from kvstore.backends.vllm.serve import check_store

    afile = tmp_path / "a-file"
    afile.write_text("x")
    with pytest.raises(SettingsError, match="a file, not a store folder"):
        check_store(str(afile), create=True)
    with pytest.raises(SettingsError, match="is a file, not a folder"):
        check_store(str(afile / "store"), create=True)
    typo = tmp_path / "sotre"
    with pytest.raises(SettingsError, match="no such folder.*--new-store"):
        check_store(str(typo), create=False)
    assert not typo.exists()
    check_store(str(typo), create=True)  # asked for: allowed (the server creates it when it starts)
    check_store(str(tmp_path), create=False)
    check_store("s3://bucket/prefix", create=False)


def test_make_serve_creates_only_its_default_store() -> None:
    out = subprocess.run(["make", "-n", "-o", ".venv-vllm/.setup-done", "serve"], capture_output=True, text=True,
                         cwd=REPO).stdout
    assert "--store runs/store --new-store" in out
    out = subprocess.run(["make", "-n", "-o", ".venv-vllm/.setup-done", "serve", "STORE=/tmp/mine"],
                         capture_output=True, text=True, cwd=REPO).stdout
    assert "--store /tmp/mine" in out and "--new-store" not in out


def test_the_digest_reader_never_reads_lines_written_before_it_opened(tmp_path: Path) -> None:
    from kvstore.backends.vllm.digest import DigestReader
    from kvstore.errors import KVStoreError

    path = tmp_path / "digests.jsonl"
    path.write_text(json.dumps({"key": "r0", "sha256": "stale", "argmax": 1, "at": 0.0}) + "\n")
    reader = DigestReader(str(path))
    with pytest.raises(KVStoreError, match="wrote no first-logits digest"):
        reader.take(["r0"])  # before the fix: the stale line was taken as this engine's
    with open(path, "a") as f:
        f.write(json.dumps({"key": "r0", "sha256": "fresh", "argmax": 2, "at": 1.0}) + "\n")
    assert reader.take(["r0"]) == {"r0": ("fresh", 2, 1.0)}


# ------------------------------------------------------------------ in .venv-vllm
@pytest.fixture(scope="module")
def vllm_findings() -> dict:
    if not VLLM_PY.exists():
        pytest.skip("no .venv-vllm (make setup-vllm): the connector and backend cases need vLLM")
    r = subprocess.run([str(VLLM_PY), str(REPO / "tests" / "kvstore" / "vllm_findings_cases.py")], capture_output=True,
                       text=True, cwd=REPO, timeout=600, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", ["named_artifact_already_cached_is_reported",
                                  "backend_refuses_a_named_graft_without_an_outcome",
                                  "inflight_incontext_entries_are_cached_when_the_wave_runs",
                                  "single_job_incontext_prefills_once",
                                  "digest_engine_runs_with_sync_scheduling",
                                  "engine_with_async_scheduling_is_refused",
                                  "greedy_request_without_a_token_is_refused",
                                  "digest_keys_are_unique_per_backend"])
def test_findings_in_vllm(vllm_findings: dict, case: str) -> None:
    assert vllm_findings[case] == "ok", vllm_findings[case]
