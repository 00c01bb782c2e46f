"""The one atomic write (kvstore/atomic.py) in its three shapes: a crash or an error leaves the old file or
nothing, never a part; and kvstore's light modules import without torch (the package imports lazily)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kvstore.atomic import atomic_directory, atomic_file, atomic_write, publish, temp_path
from kvstore.format.canonical import canonical_json

REPO = Path(__file__).resolve().parents[2]


def test_atomic_write_replaces_the_whole_file_and_leaves_no_temp(tmp_path):
    target = tmp_path / "sub" / "f.bin"
    atomic_write(target, b"old")
    atomic_write(target, b"new bytes")
    assert target.read_bytes() == b"new bytes"
    assert sorted(p.name for p in target.parent.iterdir()) == ["f.bin"]


def test_a_gc_that_removes_the_temp_before_the_writer_locks_it_does_not_break_the_write(tmp_path, monkeypatch):
    """The window between creating the temp file and locking it: a gc with grace 0 may lock and remove it there
    (tests/kvstore/test_admission.py races the two for real). The writer notices and takes a new name."""
    import kvstore.atomic as atomic

    target = tmp_path / "f.bin"
    real_lock, removed = atomic.try_lock, []

    def gc_first(fd: int, blocking: bool) -> bool:
        if not removed:  # the first temp file: a gc removes it before the writer's lock
            removed.extend(p for p in tmp_path.iterdir() if p.name.endswith(".tmp"))
            for p in removed:
                p.unlink()
        return real_lock(fd, blocking)

    monkeypatch.setattr(atomic, "try_lock", gc_first)
    atomic_write(target, b"whole bytes")
    assert len(removed) == 1 and target.read_bytes() == b"whole bytes"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.bin"]


def test_a_failing_streamed_write_keeps_the_old_file_and_removes_its_temp(tmp_path):
    target = tmp_path / "bundle.tar"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="disk full"):
        with atomic_file(target) as f:
            f.write(b"half of the new")
            raise RuntimeError("disk full")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["bundle.tar"]


def test_a_streamed_write_can_read_back_what_it_wrote_before_publishing(tmp_path):
    target = tmp_path / "x"
    with atomic_file(target) as f:
        f.write(b"abc")
        f.flush()
        f.seek(0)
        assert f.read() == b"abc"
        assert not target.exists()  # not published until the block ends
    assert target.read_bytes() == b"abc"


def test_atomic_directory_publishes_once_and_keeps_the_first_publisher(tmp_path):
    target = tmp_path / "models" / "key"
    with atomic_directory(target) as tmp:
        (tmp / "config.json").write_text("first")
    with atomic_directory(target) as tmp:  # a second process finishing after the first: theirs stays
        (tmp / "config.json").write_text("second")
    assert (target / "config.json").read_text() == "first"
    assert [p.name for p in target.parent.iterdir()] == ["key"]


def test_atomic_directory_leaves_nothing_when_filling_it_fails(tmp_path):
    target = tmp_path / "key"
    with pytest.raises(OSError):
        with atomic_directory(target) as tmp:
            (tmp / "part").write_text("x")
            raise OSError("conversion died")
    assert list(tmp_path.iterdir()) == []


def test_publish_renames_a_file_a_third_party_wrote_at_the_temp_name(tmp_path):
    target = tmp_path / "mlflow.db"
    tmp = temp_path(target)
    assert tmp.parent == tmp_path and tmp.name.startswith(".mlflow.db.") and tmp.name.endswith(".tmp")
    tmp.write_bytes(b"sqlite")
    publish(tmp, target)
    assert target.read_bytes() == b"sqlite" and not tmp.exists()


def test_canonical_json_names_the_two_stored_rules():
    obj = {"b": 1, "a": ["é", None]}
    assert canonical_json(obj, ensure_ascii=True) == '{"a":["\\u00e9",null],"b":1}'  # FORMAT.md S4, bundles
    assert canonical_json(obj, ensure_ascii=False) == '{"a":["é",null],"b":1}'  # RUN_FORMAT.md


def test_the_light_modules_and_the_package_import_without_torch():
    code = ("import sys\nfor m in ('torch', 'transformers'):\n    sys.modules[m] = None\n"
            "import kvstore, kvstore.atomic, kvstore.format.canonical, kvstore.errors, harness.record.hashing\n"
            "assert 'atomic_write' in dir(kvstore)\nprint('ok')\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin"},
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0 and proc.stdout == "ok\n", proc.stderr


def test_a_public_name_resolves_lazily_and_an_unknown_one_says_where_to_look():
    import kvstore

    assert kvstore.atomic_write is atomic_write
    with pytest.raises(AttributeError, match="kvstore.__all__"):
        kvstore.no_such_name  # noqa: B018
