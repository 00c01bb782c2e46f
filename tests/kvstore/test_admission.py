"""Admission, graft and gc refuse what the format forbids, each with a KVStoreError that names it (issue 9,
findings 1-4): edited cumulative_length, values stored under another dtype, a recorded determinism that is not
this process's, a tokens_sha256 that lies, hostile JSON, swapped shape dims, orphans and a gc racing a put."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time

import pytest
import torch

from kvstore import (
    Determinism,
    FormatError,
    IncompatibleError,
    IntegrityError,
    KVStoreError,
    LocalStore,
    MemoryStore,
    from_bytes,
    to_bytes,
    tokens_sha256,
)
from kvstore.atomic import atomic_write
from kvstore.backends.transformers import TransformersBackend, forward, load_frozen_model
from kvstore.engine.verify import logits_sha256, reference_logits
from kvstore.errors import IndexDatabaseError, ValidationError
from kvstore.format.artifact import LayerKV, NumericsRecord
from kvstore.format.ids import ArtifactId
from kvstore.store.base import Store

PREFIX = [2] + [4 + (7 * i) % 256 for i in range(39)]  # 40 tokens: across tiny-gemma3's window of 16
SUFFIX = [9, 10, 11]


@pytest.fixture(params=["local", "memory"])
def store(request, tmp_path):
    return LocalStore(tmp_path / "store") if request.param == "local" else MemoryStore()


@pytest.fixture(scope="module")
def gemma_bytes(tiny_gemma3) -> bytes:
    return to_bytes(TransformersBackend.of(tiny_gemma3).deposit(PREFIX))


def _edit(data: bytes, meta_fn=None, header_fn=None) -> bytes:
    """Artifact bytes with the kvgraft metadata and/or the safetensors header edited and re-framed the way the
    writer frames them (canonical JSON, padding, length prefix): only the edit differs from a real artifact."""
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    meta = json.loads(header["__metadata__"]["kvgraft"])
    if meta_fn:
        meta_fn(meta)
    header["__metadata__"]["kvgraft"] = json.dumps(meta, sort_keys=True, separators=(",", ":"))
    if header_fn:
        header_fn(header)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)
    return len(text).to_bytes(8, "little") + text + data[8 + n :]


def _set(path: tuple, value):
    def fn(obj):
        for k in path[:-1]:
            obj = obj[k]
        obj[path[-1]] = value
    return fn


def _here(snap, fm):
    """A snapshot parsed from bytes made by this process, with the numerics record its capture had (from_bytes
    attaches none: admission refuses a snapshot without evidence, issue 51)."""
    snap.numerics = NumericsRecord((fm.numerics_sha256,), "this test process's claim, in memory only")
    return snap


def test_the_edit_helper_reproduces_an_unedited_artifact_byte_for_byte(gemma_bytes, store):
    assert _edit(gemma_bytes) == gemma_bytes
    store.put_bytes(_edit(gemma_bytes))  # admitted: refusals below are due to the edit alone


# ---- finding 1: silent wrong grafts ----
@pytest.mark.parametrize("layer", [0, 2])  # sliding, full
@pytest.mark.parametrize("value", [0, 15, 16, 39, 41, 60, 1000])
def test_an_edited_cumulative_length_is_refused_at_admission(gemma_bytes, store, layer, value):
    bad = _edit(gemma_bytes, _set(("layers", layer, "cumulative_length"), value))
    with pytest.raises(ValidationError, match=rf"layers\[{layer}\]\.cumulative_length"):
        store.put_bytes(bad)
    assert len(store) == 0


def test_an_in_memory_cumulative_length_edit_is_refused_at_graft(tiny_gemma3, gemma_bytes):
    snap = _here(from_bytes(gemma_bytes), tiny_gemma3)
    snap.layers[0] = dataclasses.replace(snap.layers[0], cumulative_length=60)
    with pytest.raises(IncompatibleError, match="cumulative_length 60"):
        TransformersBackend.of(tiny_gemma3).graft(snap)


@pytest.mark.parametrize("with_meta", [False, True])
def test_values_stored_as_int32_under_a_float32_artifact_are_refused(gemma_bytes, store, with_meta):
    def header_fn(h):
        h["layers.1.values"]["dtype"] = "I32"  # same size: the bytes stay untouched

    meta_fn = _set(("layers", 1, "dtype"), "int32") if with_meta else None
    with pytest.raises(ValidationError, match=r"layers\.1\.values|layers\[1\]\.dtype"):
        store.put_bytes(_edit(gemma_bytes, meta_fn, header_fn))


def test_values_of_another_dtype_are_refused_at_graft_before_the_model_sees_them(tiny_gemma3, gemma_bytes):
    snap = _here(from_bytes(gemma_bytes), tiny_gemma3)
    snap.layers[3] = dataclasses.replace(snap.layers[3], values=snap.layers[3].values.view(torch.int32))
    with pytest.raises(IncompatibleError, match="layer 3 values are torch.int32"):
        TransformersBackend.of(tiny_gemma3).graft(snap)


# ---- finding 2: recorded determinism is compared at graft ----
@pytest.mark.parametrize(("setting", "value"), [("prefill_chunk", 7), ("attn_implementation", "eager")])
def test_an_artifact_deposited_under_other_settings_is_refused_naming_the_field(tiny_gemma3, setting, value):
    other = load_frozen_model("tiny-gemma3", Determinism(**{setting: value}))
    snap = TransformersBackend.of(other).deposit(PREFIX)
    Determinism().apply()  # loading `other` applied its settings to the process; restore the default ones
    with pytest.raises(IncompatibleError) as e:
        TransformersBackend.of(tiny_gemma3).graft(snap, token_ids=PREFIX + SUFFIX)
    default = getattr(Determinism(), setting)
    assert f"determinism.{setting}: artifact {value!r}, this process {default!r}" in str(e.value)
    assert "Load the model with the artifact's settings" in str(e.value) and "deposit" in str(e.value)


def test_every_differing_setting_is_named(tiny_gemma3, gemma_bytes):
    snap = _here(from_bytes(gemma_bytes), tiny_gemma3)
    snap.determinism = {**snap.determinism, "threads": 1, "deterministic_algorithms": False}
    with pytest.raises(IncompatibleError, match="determinism.deterministic_algorithms: artifact False, this process "
                       "True; determinism.threads: artifact 1, this process 2"):
        TransformersBackend.of(tiny_gemma3).graft(snap)


def test_a_graft_under_the_recorded_settings_is_exact(tiny_gemma3, gemma_bytes):
    cache = TransformersBackend.of(tiny_gemma3).graft(_here(from_bytes(gemma_bytes), tiny_gemma3), token_ids=PREFIX + SUFFIX)
    got = forward(tiny_gemma3, SUFFIX, cache)
    assert logits_sha256(got) == logits_sha256(reference_logits(TransformersBackend.of(tiny_gemma3), PREFIX, SUFFIX))


# ---- finding 3: the index trusts only validated fields ----
@pytest.mark.parametrize("also_tensor_digest", [False, True])
def test_a_lying_tokens_sha256_is_refused_and_never_indexed(gemma_bytes, store, also_tensor_digest):
    other = tokens_sha256([2, 5, 5, 5])

    def meta_fn(m):
        m["tokens_sha256"] = other
        if also_tensor_digest:
            m["tensor_sha256"]["token_ids"] = other

    with pytest.raises(IntegrityError, match="tokens_sha256|token_ids"):
        store.put_bytes(_edit(gemma_bytes, meta_fn))
    assert store.find_tokens(other) == []


def test_the_index_row_is_computed_from_the_validated_tokens(gemma_bytes, store):
    aid = store.put_bytes(gemma_bytes)
    info = store.info(aid)
    assert (info.token_count, info.tokens_sha256) == (len(PREFIX), tokens_sha256(PREFIX))
    assert store.find_tokens(tokens_sha256(PREFIX)) == [aid]


# ---- finding 4: every failure a KVStoreError; shapes; orphans; gc ----
def _deep_extra(data: bytes, depth: int) -> bytes:
    marker = _edit(data, _set(("extra",), {"d": "@@"}))
    n = int.from_bytes(marker[:8], "little")
    text = marker[8 : 8 + n].rstrip(b" ").replace(b'\\"@@\\"', b"[" * depth + b"1" + b"]" * depth)
    text += b" " * (-(8 + len(text)) % 8)
    return len(text).to_bytes(8, "little") + text + marker[8 + n :]


def _reverse(h: dict) -> None:
    items = list(h.items())
    h.clear()
    h.update(reversed(items))


HOSTILE = {
    "token_count is a list": lambda d: _edit(d, _set(("token_count",), [40])),
    "token_count is a bool": lambda d: _edit(d, _set(("token_count",), True)),
    "token_count overflows int64": lambda d: _edit(d, _set(("token_count",), 2**70)),
    "start_position is negative": lambda d: _edit(d, _set(("start_position",), -1)),
    "model_fingerprint is a number": lambda d: _edit(d, _set(("model_fingerprint",), 7)),
    "determinism is a list": lambda d: _edit(d, _set(("determinism",), [1])),
    "layers is empty": lambda d: _edit(d, _set(("layers",), [])),
    "a layer is a string": lambda d: _edit(d, _set(("layers", 0), "full")),
    "window 1": lambda d: _edit(d, _set(("layers", 0, "window"), 1)),
    "an unknown field": lambda d: _edit(d, _set(("surprise",), 1)),
    "a huge string": lambda d: _edit(d, _set(("model_name",), "x" * 10_000)),
    "nested 10 levels": lambda d: _deep_extra(d, 10),
    "nested 100000 levels": lambda d: _deep_extra(d, 100_000),
    "NaN in the header": lambda d: _edit(d, header_fn=_set(("token_ids", "x"), float("nan"))),
    "data_offsets are strings": lambda d: _edit(d, header_fn=_set(("token_ids", "data_offsets"), ["0", "320"])),
    "a shape entry is null": lambda d: _edit(d, header_fn=_set(("layers.0.keys", "shape"), [1, None, 15, 16])),
    "header length beyond the cap": lambda d: (1 << 40).to_bytes(8, "little") + d[8:],
    "header not UTF-8": lambda d: d[:8] + b"\xff" * (int.from_bytes(d[:8], "little")) + d[8 + int.from_bytes(
        d[:8], "little"):],
    "metadata not canonical": lambda d: _edit(d, header_fn=_set(("__metadata__", "kvgraft"), json.dumps(
        json.loads(json.loads(d[8 : 8 + int.from_bytes(d[:8], "little")])["__metadata__"]["kvgraft"])))),
    "header keys reordered": lambda d: _edit(d, header_fn=_reverse),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_metadata_is_a_kvstore_error_never_a_raw_exception(gemma_bytes, store, case):
    bad = HOSTILE[case](gemma_bytes)
    assert bad != gemma_bytes
    with pytest.raises(KVStoreError):
        store.put_bytes(bad)
    assert len(store) == 0
    if isinstance(store, LocalStore):
        assert not list((store.root / "objects").rglob("*")) if (store.root / "objects").exists() else True


def test_bytes_of_the_wrong_type_and_bad_tags_are_kvstore_errors(gemma_bytes, store):
    with pytest.raises(FormatError):
        store.put_bytes("not bytes")  # type: ignore[arg-type]
    with pytest.raises(KVStoreError, match="tags"):
        store.put_bytes(gemma_bytes, tags=[3])  # type: ignore[list-item]


def test_swapped_head_dims_are_refused_at_graft_before_forward(tiny_gemma3, gemma_bytes, store):
    def swap(h):
        for part in ("keys", "values"):
            h[f"layers.0.{part}"]["shape"] = [1, 16, 15, 1]  # (batch, kv_heads, seq, head_dim) 1 <-> 16

    aid = store.put_bytes(_edit(gemma_bytes, _set(("layers", 0, "shape"), [1, 16, 15, 1]), swap))
    # its numerics are this process's (a claim attached in memory: a store records none, issue 61): the layout is refused
    with pytest.raises(IncompatibleError, match=r"layer 0 keys/values have shape \(1, 16, 15, 1\)"):
        TransformersBackend.of(tiny_gemma3).graft(_here(store.get(aid), tiny_gemma3))


def test_swapped_batch_and_sequence_dims_are_refused_at_admission(gemma_bytes, store):
    def swap(h):
        for part in ("keys", "values"):
            h[f"layers.2.{part}"]["shape"] = [40, 1, 1, 16]

    with pytest.raises(ValidationError, match="shape"):
        store.put_bytes(_edit(gemma_bytes, _set(("layers", 2, "shape"), [40, 1, 1, 16]), swap))


def _plant(store: LocalStore, data: bytes) -> str:
    """An object file written behind the index's back (as after a crash between write and index)."""
    aid = ArtifactId.of(data)  # the hash the bytes' format names them by (kvstore.format.artifact.content_id)
    atomic_write(store.path(aid), data)
    return aid


def test_gc_indexes_a_valid_orphan_and_reports_an_invalid_one_without_crashing(tmp_path, gemma_bytes):
    store = LocalStore(tmp_path / "s")
    good = _plant(store, gemma_bytes)
    bad = _plant(store, _edit(gemma_bytes, _set(("token_count",), [40])))  # hashes to its name, but invalid
    junk = store.root / "objects" / "zz"
    junk.mkdir()
    (junk / "not-an-object").write_bytes(b"x")
    report = store.gc()
    assert report["objects_indexed"] == 1 and [i.id for i in store.list()] == [good]
    assert any(d.startswith(bad) and "token_count" in d for d in report["damaged"])
    assert any("not-an-object" in d for d in report["damaged"])
    assert store.path(bad).exists()  # reported, never deleted
    assert store.gc()["objects_indexed"] == 0  # and the next gc still runs


def test_a_put_whose_indexing_fails_leaves_no_orphan(tmp_path, gemma_bytes, monkeypatch):
    store = LocalStore(tmp_path / "s")

    real = store._db

    def failing_db(doing):
        if doing.startswith("index"):
            raise IndexDatabaseError(f"could not {doing}: database or disk is full")
        return real(doing)

    monkeypatch.setattr(store, "_db", failing_db)
    with pytest.raises(IndexDatabaseError, match="disk is full"):
        store.put_bytes(gemma_bytes)
    assert not [p for p in (store.root / "objects").rglob("*") if p.is_file()]
    monkeypatch.undo()
    assert store.gc() == {"temp_removed": 0, "temp_kept": 0, "rows_dropped": 0, "rows_repaired": [], "objects_indexed": 0, "damaged": []}


def test_sqlite_failures_are_index_database_errors(tmp_path, gemma_bytes):
    store = LocalStore(tmp_path / "s")
    store.index_path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(IndexDatabaseError, match="kvstore gc"):
        store.put_bytes(gemma_bytes)
    with pytest.raises(IndexDatabaseError):
        store.list()


_HOLDER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
fcntl.flock(fd, fcntl.LOCK_EX)
old = time.time() - 7200
os.utime(sys.argv[1], (old, old))
print("locked", flush=True)
sys.stdin.readline()
"""


def test_gc_keeps_the_temp_file_of_a_live_writer_in_another_process(tmp_path, gemma_bytes):
    store = LocalStore(tmp_path / "s")
    aid = ArtifactId.of(gemma_bytes)
    store.path(aid).parent.mkdir(parents=True)
    temp = store.path(aid).parent / f".{aid[2:]}.0123456789abcdef.tmp"
    writer = subprocess.Popen([sys.executable, "-c", _HOLDER, str(temp)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "locked"
        report = store.gc(grace_s=0)  # past any grace period: only the writer's lock protects the file
        assert (report["temp_removed"], report["temp_kept"]) == (0, 1) and temp.exists()
    finally:
        writer.communicate("done\n", timeout=30)
    assert store.gc(grace_s=0)["temp_removed"] == 1 and not temp.exists()  # the writer is gone: a leftover


def test_gc_keeps_a_young_unlocked_temp_file(tmp_path):
    store = LocalStore(tmp_path / "s")
    temp = store.root / "objects" / "ab" / f".{'c' * 62}.0011223344556677.tmp"
    temp.parent.mkdir(parents=True)
    temp.write_bytes(b"partial")
    assert store.gc()["temp_kept"] == 1 and temp.exists()
    old = time.time() - 2 * 3600
    os.utime(temp, (old, old))
    assert store.gc()["temp_removed"] == 1 and not temp.exists()


def _big_snapshot(tokens: int) -> object:
    """A valid snapshot of a few MiB (one full layer), so that a put takes long enough to race."""
    from kvstore import Snapshot

    g = torch.Generator().manual_seed(0)
    k = torch.randn(1, 4, tokens, 64, generator=g)  # (batch, kv_heads, seq, head_dim)
    return Snapshot(token_ids=[2] * tokens, start_position=0, layers=[LayerKV("full", None, tokens, k, -k)],
                    model_fingerprint="e" * 64, tokenizer_fingerprint="f" * 64, dtype="float32",
                    determinism=Determinism().to_dict(), environment={}, model_name="race")


def test_gc_racing_puts_never_breaks_a_put(tmp_path):
    store = LocalStore(tmp_path / "s")
    snaps = [_big_snapshot(2048 + i) for i in range(4)]  # ~4 MiB each
    errors: list[BaseException] = []
    ids: list[str] = []

    def writer():
        try:
            ids.extend(store.put(s) for s in snaps)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    t = threading.Thread(target=writer)
    t.start()
    reports = []
    while t.is_alive():
        reports.append(store.gc(grace_s=0))
    t.join()
    assert not errors, errors
    assert sorted(i.id for i in store.list()) == sorted(ids) and len(ids) == 4
    for aid in ids:
        store.verify(aid)
    assert all(not r["damaged"] for r in reports)


# ---- the store interface ----
def test_store_is_an_abstract_interface():
    with pytest.raises(TypeError):
        Store()  # type: ignore[abstract]

    class Partial(Store):
        def put_bytes(self, data, tags=()):
            return None

    with pytest.raises(TypeError, match="abstract"):
        Partial()  # type: ignore[abstract]


def test_published_objects_get_the_umask_mode_and_import_changes_no_umask(tmp_path, gemma_bytes):
    probe = ("import os; before = os.umask(0o027); import kvstore.store.local; after = os.umask(0o027); "
             "print(oct(before), oct(after))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert out[1] == "0o27"  # importing the store did not touch the umask
    old = os.umask(0o027)
    try:
        store = LocalStore(tmp_path / "s")
        aid = store.put_bytes(gemma_bytes)
    finally:
        os.umask(old)
    assert store.path(aid).stat().st_mode & 0o777 == 0o640
