"""Weights pinned for a run: the files a model was loaded from, as they were when it was fingerprinted.

    pinned = PinnedWeights.of([gguf_path])   # before the engine reads the file
    ...load, fingerprint...
    pinned.check()                           # after: the file did not change while it was read and hashed
    check_weights(backend)                   # between rows of a run: still the same files (a few stat calls)

A file is identified by (device, inode, size, mtime_ns, ctime_ns): rewriting it in place (even to the same size, even
with its mtime set back: the ctime cannot be) or replacing it changes one of them. The model fingerprint is read
once at load; a file changed under a running model would make every later row come from other weights than the
fingerprint the run records (and a resume, a rescore by re-decoding or a Ray worker would load other weights), so a
run checks its model's files before it writes each row (kvstore.ModelChangedError, one line naming the file). Both
backends also copy the weights into memory of their own at load (llama.cpp: no mmap; transformers: the tensors mapped
from the safetensors file are copied once): a file changed or cut short later cannot change the weights in use, nor
kill the process with SIGBUS.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvstore.errors import ModelChangedError

__all__ = ["PinnedWeights", "check_weights", "weight_files"]

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth")


@dataclass(frozen=True)
class _Identity:
    path: str
    dev: int
    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, path: Path) -> _Identity:
        st = os.stat(path)
        return cls(str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def change(self) -> str | None:
        """What differs now, in words; None when nothing does."""
        try:
            now = _Identity.of(Path(self.path))
        except OSError as e:
            return f"it is gone ({e.strerror})"
        if (now.dev, now.ino) != (self.dev, self.ino):
            return "it was replaced by another file"
        if now.size != self.size:
            return f"its size changed from {self.size} to {now.size} bytes"
        if (now.mtime_ns, now.ctime_ns) != (self.mtime_ns, self.ctime_ns):
            return "it was rewritten in place"
        return None


@dataclass(frozen=True)
class PinnedWeights:
    """The weight files of one loaded model, identified as they were before the engine read them."""

    files: tuple[_Identity, ...]

    @classmethod
    def of(cls, paths: Iterable[str | Path]) -> PinnedWeights:
        return cls(tuple(_Identity.of(Path(p)) for p in paths))

    def check(self, while_: str = "while the model was running") -> None:
        """ModelChangedError when any file changed since it was pinned."""
        for f in self.files:
            why = f.change()
            if why is not None:
                raise ModelChangedError(
                    f"{f.path}: the model file changed {while_} ({why}): it no longer holds the weights the "
                    "fingerprint taken at load names, so nothing more is recorded under that fingerprint. Leave "
                    "model files alone while they are in use; to use the new file, start again")


def weight_files(folder: str | Path) -> list[Path]:
    """The weight files of a checkpoint folder (what a loader reads as weights), sorted; [] for anything else."""
    path = Path(folder)
    if not path.is_dir():
        return []
    return sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES))


def check_weights(model: Any) -> None:
    """ModelChangedError when a weight file of `model` (a backend: its `weights`) changed since it was loaded; nothing
    for a model that has no files (a tiny random model, the fake backend)."""
    pinned = getattr(model, "weights", None)
    if isinstance(pinned, PinnedWeights):
        pinned.check()
