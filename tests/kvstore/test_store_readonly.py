"""Storage faults of a LocalStore: a published store on a read-only mount is readable (list, get, verify, graft,
`kvstore ls` / `kvstore verify`), writes to it fail in one line; a full device during a put fails in one line
naming the path and leaves nothing partial behind.

Read-only and full devices are real: a tmpfs (or a read-only bind mount) mounted by the test, which needs root
with CAP_SYS_ADMIN (chmod does not bind root); without it these tests skip, saying why. One test runs the CLI as
the unprivileged user `nobody` against a chmod'ed store, the case of a user who may read but not write a store.
"""

from __future__ import annotations

import dataclasses
import os
import sqlite3
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch

from kvstore import LocalStore, logits_sha256, to_bytes
from kvstore.backends.transformers import TransformersBackend
from kvstore.cli import main as kvstore_main
from kvstore.engine.verify import graft_logits, reference_logits
from kvstore.errors import ReadOnlyStoreError, StoreFullError
from kvstore.format.artifact import LayerKV

REPO = Path(__file__).resolve().parents[2]


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True, text=True)


def _can_mount() -> str | None:
    """None when this process can mount a tmpfs, else why not."""
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root (chmod alone does not make a folder read-only for root)"
    probe = Path(tempfile.mkdtemp(prefix="kvgraft-mount-probe-"))
    try:
        _mount("-t", "tmpfs", "-o", "size=64k", "tmpfs", str(probe))
    except (OSError, subprocess.CalledProcessError) as e:
        return f"cannot mount a tmpfs here ({getattr(e, 'stderr', '') or e}); needs CAP_SYS_ADMIN"
    subprocess.run(["umount", str(probe)], check=False)
    probe.rmdir()
    return None


_NO_MOUNT = _can_mount()
needs_mount = pytest.mark.skipif(_NO_MOUNT is not None, reason=str(_NO_MOUNT))


@pytest.fixture
def tmpfs(tmp_path):
    """mount(size) -> a fresh tmpfs folder of that size; remount_ro(path) makes it read-only. Unmounted after."""
    mounted: list[Path] = []

    def mount(size: str = "16m") -> Path:
        d = tmp_path / f"mnt{len(mounted)}"
        d.mkdir()
        _mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d))
        mounted.append(d)
        return d

    def bind_ro(src: Path) -> Path:
        d = tmp_path / f"ro{len(mounted)}"
        d.mkdir()
        _mount("--bind", str(src), str(d))
        mounted.append(d)
        _mount("-o", "remount,bind,ro", str(d))
        return d

    mount.remount_ro = lambda d: _mount("-o", "remount,ro", str(d))  # type: ignore[attr-defined]
    mount.bind_ro = bind_ro  # type: ignore[attr-defined]
    yield mount
    for d in reversed(mounted):
        subprocess.run(["umount", "-l", str(d)], check=False)


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _three(hand_built):
    return [hand_built({"n": i}) for i in range(3)]


@needs_mount
def test_a_store_on_a_read_only_mount_lists_gets_and_verifies(tmpfs, hand_built, assert_same_snapshot):
    root = tmpfs() / "store"
    snaps = _three(hand_built)
    ids = LocalStore(root).put_many(snaps, tags=["published"])
    tmpfs.remount_ro(root.parent)
    before = _files(root)

    store = LocalStore(root)
    assert store.read_only
    assert [i.id for i in store.list()] == sorted(ids) and len(store) == 3
    assert [i.id for i in store.list("published")] == sorted(ids)
    for aid, snap in zip(ids, snaps):
        assert_same_snapshot(store.get(aid), snap)
        assert_same_snapshot(store.get(aid, private=True), snap)
        store.verify(aid)
        assert store.info(aid).tags == ("published",)
    assert store.find_tokens(store.info(ids[0]).tokens_sha256) == sorted(ids)
    assert _files(root) == before  # nothing was written, not even a -shm file


@needs_mount
@pytest.mark.parametrize("write", ["put", "put_many", "add_tags", "remove", "gc"])
def test_every_write_to_a_read_only_store_is_one_line_naming_the_store(tmpfs, hand_built, write):
    root = tmpfs() / "store"
    aid = LocalStore(root).put(hand_built())
    tmpfs.remount_ro(root.parent)
    store = LocalStore(root)
    calls = {"put": lambda: store.put(hand_built({"new": 1})), "put_many": lambda: store.put_many([hand_built()]),
             "add_tags": lambda: store.add_tags(aid, ["x"]), "remove": lambda: store.remove(aid),
             "gc": lambda: store.gc()}
    with pytest.raises(ReadOnlyStoreError) as e:
        calls[write]()
    msg = str(e.value)
    assert "\n" not in msg and str(root) in msg and "read-only" in msg and "writable store" in msg
    assert store.contains(aid) and [i.id for i in store.list()] == [aid]


@needs_mount
def test_the_cli_lists_and_verifies_a_read_only_store(tmpfs, hand_built, capsys):
    root = tmpfs() / "store"
    ids = LocalStore(root).put_many(_three(hand_built))
    tmpfs.remount_ro(root.parent)
    assert kvstore_main(["--store", str(root), "ls", "--json"]) == 0
    out = capsys.readouterr().out
    assert all(aid in out for aid in ids)
    assert kvstore_main(["--store", str(root), "verify"]) == 0
    assert kvstore_main(["--store", str(root), "rm", ids[0]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kvstore: error:") and "read-only" in err[0]


@needs_mount
def test_rows_still_in_the_write_ahead_log_are_seen_through_a_read_only_view(tmp_path, tmpfs, hand_built):
    """A publisher's store seen read-only while its index's WAL holds rows not yet checkpointed into the file."""
    src = tmp_path / "published"
    LocalStore(src)
    holder = sqlite3.connect(src / "index.sqlite")  # keeps the WAL from being checkpointed away on close
    holder.execute("PRAGMA wal_autocheckpoint=0")
    holder.execute("SELECT COUNT(*) FROM artifacts").fetchall()
    try:
        ids = LocalStore(src).put_many(_three(hand_built))
        assert (src / "index.sqlite-wal").stat().st_size > 0
        view = tmpfs.bind_ro(src)
        store = LocalStore(view)
        assert store.read_only and sorted(i.id for i in store.list()) == sorted(ids)
    finally:
        holder.close()


@needs_mount
def test_a_read_only_store_without_an_index_file_is_indexed_in_memory_from_its_objects(tmpfs, hand_built):
    root = tmpfs() / "store"
    ids = LocalStore(root).put_many(_three(hand_built), tags=["t"])
    for f in root.glob("index.sqlite*"):
        f.unlink()
    tmpfs.remount_ro(root.parent)
    store = LocalStore(root)
    assert sorted(i.id for i in store.list()) == sorted(ids)  # tags lived only in the index: gone with it
    store.verify(ids[0])


@needs_mount
def test_a_graft_from_a_read_only_store_is_byte_identical_to_the_fresh_reference(tmpfs, tiny_gemma3):
    fm = tiny_gemma3
    prefix, suffix = list(range(4, 4 + 24)), [40, 41, 42]  # 24 tokens: past the sliding window of 16
    root = tmpfs() / "store"
    aid = LocalStore(root).put(TransformersBackend.of(fm).deposit(prefix))
    tmpfs.remount_ro(root.parent)
    restored = graft_logits(TransformersBackend.of(fm), prefix, suffix, store=LocalStore(root), artifact_id=aid)
    assert logits_sha256(restored.logits) == logits_sha256(reference_logits(TransformersBackend.of(fm), prefix, suffix))


def _as_nobody(argv: list[str]) -> tuple[int, str, str]:
    """`kvstore ARGV` in a forked child that has dropped to the user nobody: (exit code, stdout, stderr)."""
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: no exec, so the interpreter need not be readable by nobody
        code = 70
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            import contextlib
            import io
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = kvstore_main(argv)
            os.write(out_w, (out.getvalue() + "\0" + err.getvalue()).encode())
        finally:
            os._exit(code)
    os.close(out_w)
    with os.fdopen(out_r, "rb") as f:
        data = f.read().decode()
    _, status = os.waitpid(pid, 0)
    out, _, err = data.partition("\0")
    return os.waitstatus_to_exitcode(status), out, err


def test_a_user_who_may_not_write_the_store_can_list_and_verify_it(hand_built):
    """chmod a-w and the CLI run as `nobody`: the permission case, where the mount is writable but the user not."""
    if os.geteuid() != 0:
        pytest.skip("switching to the user nobody needs root")
    base = Path(tempfile.mkdtemp(prefix="kvgraft-ro-user-"))
    try:
        root = base / "store"
        ids = LocalStore(root).put_many(_three(hand_built))
        for p in [*root.rglob("*"), root, base]:
            p.chmod(0o555 if p.is_dir() else 0o444)
        code, out, err = _as_nobody(["--store", str(root), "ls", "--json"])
        assert code == 0, err
        assert all(aid in out for aid in ids)
        assert _as_nobody(["--store", str(root), "verify"])[0] == 0
        code, _, err = _as_nobody(["--store", str(root), "rm", ids[0]])
        assert code == 2 and err.count("\n") == 1 and "read-only" in err, err
    finally:
        for p in [base, *base.rglob("*")]:
            p.chmod(0o755)
        subprocess.run(["rm", "-rf", str(base)], check=False)


def _big_snapshot(hand_built, tokens: int):
    """A valid snapshot of `tokens` positions (one full layer grows with them): ~32 bytes per token."""
    snap = hand_built()
    k = torch.arange(1 * 2 * tokens * 4, dtype=torch.float32).reshape(1, 2, tokens, 4) / 7  # (batch, heads, seq, dim)
    full, sliding = snap.layers
    return dataclasses.replace(snap, token_ids=[5 + i % 200 for i in range(tokens)], layers=[
        LayerKV("full", None, tokens, k, -k), dataclasses.replace(sliding, cumulative_length=tokens)])


@needs_mount
def test_a_full_device_is_one_line_naming_the_path_and_leaves_nothing_partial(tmpfs, hand_built):
    root = tmpfs("1m") / "store"
    store = LocalStore(root)
    small = store.put(hand_built())
    before = _files(root)
    big = _big_snapshot(hand_built, 40_000)  # ~2.6 MB: cannot fit
    assert len(to_bytes(big)) > 2 << 20
    with pytest.raises(StoreFullError) as e:
        store.put(big)
    msg = str(e.value)
    assert "\n" not in msg and str(root / "objects") in msg and "No space left" in msg and "Free space" in msg
    after = _files(root)
    assert not [f for f in after if f.endswith(".tmp")] and set(after) == set(before)
    assert [i.id for i in store.list()] == [small]
    assert store.put(hand_built({"after": "full"})) in store  # the store still works once the write is undone
