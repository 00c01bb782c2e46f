"""Bundle import streams attachments (issue 31, findings 9 and 11): memory stays bounded whatever the attachments
hold, and a full disk while they are written is one BundleError naming the file.

The large bundle is sparse (holes of zeros: a few KB on disk, 256 MiB of attachments to read): it is imported in a
subprocess, whose peak RSS (VmHWM) is compared with its RSS just before the import."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest

from kvstore import BundleError, MemoryStore, canonical_json, import_bundle

REPO = Path(__file__).resolve().parents[2]
MiB = 1 << 20


def _zeros_sha256(size: int) -> str:
    h, chunk = hashlib.sha256(), bytes(MiB)
    for _ in range(size // MiB):
        h.update(chunk)
    h.update(bytes(size % MiB))
    return h.hexdigest()


def _bundle(path: Path, attachments: dict[str, bytes | int]) -> Path:
    """A bundle with no artifact and these attachments (bytes, or a size: that many zero bytes, left as a hole)."""
    listed = {name: ({"size": len(v), "sha256": hashlib.sha256(v).hexdigest()} if isinstance(v, bytes)
                     else {"size": v, "sha256": _zeros_sha256(v)}) for name, v in sorted(attachments.items())}
    manifest: dict = {"format": "kvgraft-bundle/2", "artifacts": [], "attachments": listed}
    manifest["manifest_sha256"] = hashlib.sha256(canonical_json(manifest, ensure_ascii=True).encode()).hexdigest()
    members: list[tuple[str, bytes | int]] = [("kvgraft-bundle.json",
                                               canonical_json(manifest, ensure_ascii=True).encode("ascii"))]
    members += [(f"attachments/{name}", v) for name, v in sorted(attachments.items())]
    with open(path, "wb") as f:
        for name, v in members:
            ti = tarfile.TarInfo(name)
            ti.size = len(v) if isinstance(v, bytes) else v
            ti.mode, ti.mtime = 0o644, 0
            f.write(ti.tobuf(format=tarfile.USTAR_FORMAT))
            if isinstance(v, bytes):
                f.write(v)
            else:
                f.seek(v, 1)  # a hole: zeros that take no disk
            f.seek(-ti.size % 512, 1)
        f.write(bytes(1024))  # the end-of-archive blocks
    return path


# The peak is this process image's own high-water mark (VmHWM in /proc/self/status), not getrusage's ru_maxrss:
# Linux carries ru_maxrss across execve from the forking process, so a child of a pytest that had grown to 3 GB
# reported a 3 GB "peak" whatever it did.
_IMPORT = """
import sys, psutil
from kvstore import MemoryStore, import_bundle

def vm_hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024

before = psutil.Process().memory_info().rss
info = import_bundle(sys.argv[1], MemoryStore(), attachments_dir=sys.argv[2])
print(before, vm_hwm(), sorted(info.attachments))
"""


def test_importing_a_large_sparse_bundle_keeps_memory_bounded(tmp_path):
    size = 128 * MiB
    bundle = _bundle(tmp_path / "sparse.kvb", {"a.bin": size, "b.bin": size})
    assert bundle.stat().st_blocks * 512 < 1 * MiB  # sparse: almost nothing on disk
    out = subprocess.run([sys.executable, "-c", _IMPORT, str(bundle), str(tmp_path / "files")], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    before, peak, names = out.stdout.split(maxsplit=2)
    grown = int(peak) - int(before)
    assert grown < 32 * MiB, f"peak RSS grew {grown / MiB:.0f} MiB importing {2 * size / MiB:.0f} MiB of attachments"
    assert names.strip() == "['a.bin', 'b.bin']"
    for name in ("a.bin", "b.bin"):  # written whole, and to the byte
        written = tmp_path / "files" / name
        assert written.stat().st_size == size
        with open(written, "rb") as f:
            assert hashlib.file_digest(f, "sha256").hexdigest() == _zeros_sha256(size)


def _can_mount() -> str | None:
    import os

    if os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    probe = Path(tempfile.mkdtemp(prefix="kvgraft-mount-probe-"))
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(probe)], check=True,
                       capture_output=True, text=True)
        subprocess.run(["umount", str(probe)], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as e:
        return f"cannot mount a tmpfs here ({getattr(e, 'stderr', '') or e}); needs CAP_SYS_ADMIN"
    finally:
        probe.rmdir()
    return None


def test_a_full_disk_while_writing_an_attachment_names_the_file_and_keeps_nothing(tmp_path):
    why = _can_mount()
    if why:
        pytest.skip(why)
    bundle = _bundle(tmp_path / "b.kvb", {"index.json": json.dumps({"ok": 1}).encode(),
                                          "weights.bin": bytes(range(256)) * 8192})  # 2 MiB
    full = tmp_path / "full"
    full.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(full)], check=True)
    try:
        with pytest.raises(BundleError) as err:
            import_bundle(bundle, MemoryStore(), attachments_dir=full / "lib")
        message = str(err.value)
        assert str(full / "lib" / "weights.bin") in message and "no space left" in message, message
        assert "\n" not in message
        assert not (full / "lib").exists()  # nothing of the import kept, no temp file left
    finally:
        subprocess.run(["umount", str(full)], check=True)
