"""The `kvstore` command line, run in-process through main() with the tiny Gemma 3 model and a temp store."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvstore import InvalidIdError, LocalStore, NotFoundError
from kvstore.cli import main, resolve_id
from kvstore.store.base import ArtifactInfo

TEXT = "Two plus two is four."


@pytest.fixture
def kvstore(tmp_path, capsys):
    """kvstore(*args) -> (exit status, stdout, stderr), with --model tiny-gemma3 --store <tmp>."""
    root = tmp_path / "store"

    def run(*args: str) -> tuple[int, str, str]:
        rc = main(["--model", "tiny-gemma3", "--store", str(root), *args])
        out, err = capsys.readouterr()
        return rc, out, err

    run.root = root
    return run


def _deposit(kvstore, *args: str) -> str:
    rc, out, err = kvstore("deposit", *args)
    assert rc == 0, err
    aid = out.strip().splitlines()[-1]
    assert len(aid) == 64 and set(aid) <= set("0123456789abcdef")
    return aid


def test_deposit_prints_the_id_and_ls_lists_it(kvstore):
    aid = _deposit(kvstore, "--text", TEXT, "--tag", "demo", "--tag", "math")
    rc, out, _ = kvstore("ls")
    assert rc == 0 and aid[:12] in out and "demo" in out
    rc, out, _ = kvstore("ls", "--json")
    [row] = json.loads(out)
    assert row["id"] == aid and row["token_count"] == len(TEXT) + 1
    numerics = [t for t in row["tags"] if t.startswith("numerics:")]  # measured at deposit, recorded (issue 51)
    assert [t for t in row["tags"] if t not in numerics] == ["demo", "math"] and len(numerics) == 1
    assert json.loads(kvstore("ls", "--tag", "other", "--json")[1]) == []


def test_show_prints_the_token_count_and_layout_for_an_id_prefix(kvstore):
    aid = _deposit(kvstore, "--text", TEXT)
    rc, out, _ = kvstore("show", aid[:10])
    assert rc == 0
    lines = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in out.splitlines())
    assert lines["id"] == aid
    assert lines["tokens"] == str(len(TEXT) + 1)  # BOS + one byte token per character
    assert lines["format"] == "kvgraft-kv/2"
    assert lines["start position"] == "0"
    assert "SSFSSF" in lines["layers"] and "window 16" in lines["layers"]
    rc, out, _ = kvstore("show", aid, "--json")
    shown = json.loads(out)
    assert shown["id"] == aid and shown["metadata"]["token_count"] == len(TEXT) + 1
    assert shown["metadata"]["extra"]["text_sha256"]


def test_token_ids_can_be_given_inline_or_in_a_json_file(kvstore, tmp_path):
    inline = _deposit(kvstore, "--token-ids", "2,50,51,52")
    path = tmp_path / "ids.json"
    path.write_text("[2, 50, 51, 52]")
    assert _deposit(kvstore, "--token-ids-file", str(path)) == inline  # same tokens, same bytes, same id
    rc, _, err = kvstore("deposit", "--token-ids", "2,5000")
    assert rc == 2 and err.startswith("kvstore: error:") and "vocabulary" in err


def test_verify_says_ok_then_failed_after_the_object_is_corrupted(kvstore):
    aid = _deposit(kvstore, "--text", TEXT)
    rc, out, _ = kvstore("verify")
    assert rc == 0 and out.split() == ["OK", aid]
    path = LocalStore(kvstore.root).path(aid)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))
    rc, out, err = kvstore("verify", aid[:8])
    assert rc == 1 and out.startswith(f"FAILED  {aid}") and "kvstore rm" in err


def test_rm_removes_and_gc_reports(kvstore):
    aid = _deposit(kvstore, "--text", TEXT)
    rc, out, _ = kvstore("rm", aid[:12])
    assert rc == 0 and aid in out
    assert json.loads(kvstore("ls", "--json")[1]) == []
    rc, out, _ = kvstore("gc")
    assert rc == 0 and "index rows dropped  0" in out and "objects indexed     0" in out


def test_errors_are_one_line_on_stderr_with_exit_status_2(kvstore):
    for args in (["show", "0123abcd"], ["show", "abc"], ["rm", "0" * 64], ["show", "z" * 64]):
        rc, out, err = kvstore(*args)
        assert rc == 2 and out == "" and err.startswith("kvstore: error:"), args
        assert len(err.strip().splitlines()) == 1


def test_global_options_may_follow_the_subcommand(tmp_path, capsys):
    root = tmp_path / "late"
    assert main(["deposit", "--store", str(root), "--model", "tiny-gemma3", "--token-ids", "2,9"]) == 0
    capsys.readouterr()
    assert len(LocalStore(root).list()) == 1


def test_the_store_defaults_to_the_environment_variable(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KVGRAFT_STORE", str(tmp_path / "env"))
    assert main(["--model", "tiny-gemma3", "deposit", "--token-ids", "2,9"]) == 0
    aid = capsys.readouterr().out.strip()
    assert [i.id for i in LocalStore(tmp_path / "env").list()] == [aid]


class _FakeStore:
    root = Path("/fake")

    def __init__(self, ids):
        self._ids = ids

    def list(self, tag=None):
        return [ArtifactInfo(i, 1, 1, "", "", "", 0.0, ()) for i in self._ids]


def test_an_id_prefix_must_be_unique_and_at_least_8_hex_digits():
    a, b = "abcdef01" + "0" * 56, "abcdef01" + "1" * 56
    store = _FakeStore([a, b])
    assert resolve_id(store, "ABCDEF010") == a
    assert resolve_id(store, b) == b
    with pytest.raises(InvalidIdError, match="ambiguous"):
        resolve_id(store, "abcdef01")
    with pytest.raises(InvalidIdError, match="at least 8"):
        resolve_id(store, "abcdef0")
    with pytest.raises(NotFoundError, match="no artifact id starts with 12345678"):
        resolve_id(store, "12345678")


def test_the_console_script_is_installed():
    script = Path(sys.executable).parent / "kvstore"
    out = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0
    assert "deposit" in out.stdout and "verify" in out.stdout


def test_verify_and_gc_report_an_object_whose_tokens_sha256_lies(kvstore, hand_built):
    from kvstore import to_bytes, tokens_sha256
    from kvstore.atomic import atomic_write
    from kvstore.format.ids import ArtifactId

    data = to_bytes(hand_built())
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    meta = json.loads(header["__metadata__"]["kvgraft"])
    meta["tokens_sha256"] = meta["tensor_sha256"]["token_ids"] = tokens_sha256([2, 3])  # claims other tokens
    header["__metadata__"]["kvgraft"] = json.dumps(meta, sort_keys=True, separators=(",", ":"))
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)
    forged = len(text).to_bytes(8, "little") + text + data[8 + n :]
    store = LocalStore(kvstore.root)
    aid = ArtifactId.of(forged)
    atomic_write(store.path(aid), forged)  # planted behind the store's back: it hashes to its name
    rc, out, _ = kvstore("verify", aid)
    assert rc == 1 and out.startswith(f"FAILED  {aid}") and "token_ids" in out
    rc, out, _ = kvstore("gc")
    assert rc == 1 and "objects indexed     0" in out and aid in out and "temp files kept     0" in out
    assert store.find_tokens(tokens_sha256([2, 3])) == []


# ---- architectures (issue 20): one line and exit 2 for a refusal, the attention implementation settable


@pytest.fixture(scope="module")
def arch_folders(tmp_path_factory) -> dict[str, str]:
    from kvstore.backends.transformers.tiny import save_architecture

    root = tmp_path_factory.mktemp("arch")
    return {n: str(save_architecture(n, root / n)) for n in ("gemma2", "qwen3-next", "deepseek-v3", "t5")}


def _run_model(tmp_path, capsys, model: str, *args: str) -> tuple[int, str, str]:
    rc = main(["--model", model, "--store", str(tmp_path / "store"), *args])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize(("name", "words"), [
    ("qwen3-next", ["cannot capture layer 0 (linear, LinearAttentionLayer)", "conv_states[0]"]),
    ("deepseek-v3", ["cannot capture layer 0 (latent, DynamicLayer)", "keys (1, 1, 5, 16) and values (1, 1, 5, 8)"]),
    ("t5", ["kvgraft supports causal LMs (decoder-only, attention KV caches", "not encoder-decoder"]),
])
def test_deposit_of_a_refused_architecture_prints_one_line_and_exits_2(arch_folders, tmp_path, capsys, name, words):
    rc, out, err = _run_model(tmp_path, capsys, arch_folders[name], "deposit", "--token-ids", "2,50,51,52,53")
    assert rc == 2 and out == ""
    [line] = err.strip().splitlines()
    assert line.startswith("kvstore: error: ") and "Traceback" not in err
    for w in words:
        assert w in line
    assert not (tmp_path / "store").exists() or not LocalStore(tmp_path / "store").list()  # nothing stored


def test_deposit_sets_the_attention_implementation_an_error_asks_for(arch_folders, tmp_path, capsys):
    rc, _, err = _run_model(tmp_path, capsys, arch_folders["gemma2"], "deposit", "--token-ids", "2,50,51,52")
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert "set determinism.attn_implementation=eager" in err and "--attn-implementation eager" in err
    rc, out, err = _run_model(tmp_path, capsys, arch_folders["gemma2"], "deposit", "--token-ids", "2,50,51,52",
                              "--attn-implementation", "eager", "--prefill-chunk", "2")
    assert rc == 0, err
    aid = out.strip()
    meta = LocalStore(tmp_path / "store").get(aid).determinism
    assert meta["attn_implementation"] == "eager" and meta["prefill_chunk"] == 2


def test_an_unexpected_failure_is_one_line_and_the_traceback_needs_kvgraft_debug(kvstore, monkeypatch):
    from kvstore import Backend

    def broken(*args, **kwargs):
        raise AttributeError("'Widget' object has no attribute 'get_seq_length'")

    monkeypatch.setattr(Backend, "deposit", broken)  # the one deposit, every backend's
    monkeypatch.delenv("KVGRAFT_DEBUG", raising=False)
    rc, _, err = kvstore("deposit", "--text", TEXT)
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith("kvstore: error: AttributeError: 'Widget' object") and "KVGRAFT_DEBUG=1" in err
    monkeypatch.setenv("KVGRAFT_DEBUG", "1")
    rc, _, err = kvstore("deposit", "--text", TEXT)
    assert rc == 2 and "Traceback (most recent call last)" in err
    assert err.strip().splitlines()[-1].startswith("kvstore: error: AttributeError")


def test_deposit_runs_on_any_registered_backend(kvstore, tmp_path):
    """--backend picks the engine from the registry, --setting fills its Settings; the artifact is that backend's own
    deposit (the same bytes as its `deposit`), refused by name on a setting it does not have."""
    from kvstore import load_backend

    aid = _deposit(kvstore, "--backend", "fake", "--setting", 'script={"a": "b"}', "--token-ids", "1,107,104")
    be = load_backend("fake", script={"a": "b"})
    assert aid == LocalStore(tmp_path / "store").put(be.deposit([1, 107, 104]))
    assert LocalStore(tmp_path / "store").get(aid).determinism["backend"] == "fake"
    rc, _, err = kvstore("deposit", "--backend", "fake", "--setting", "bogus=1", "--text", "x")
    assert rc != 0 and "backend 'fake': no setting named bogus" in err
    rc, _, err = kvstore("deposit", "--setting", "n_ctx=8", "--text", "x")
    assert rc != 0 and "backend 'transformers': it takes no setting by name (n_ctx)" in err
