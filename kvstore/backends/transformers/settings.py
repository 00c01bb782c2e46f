"""The transformers backend's settings: what a caller chooses (a light module, no torch or transformers import)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvstore.backends.transformers.gguf import BUNDLED
from kvstore.determinism import Determinism


@dataclass(frozen=True)
class TransformersSettings:
    """source: the bundled model's name, "tiny-gemma3" (and the other tiny test models), a local checkpoint folder
    or a hub id already in the local cache; determinism: the pinned settings (torch threads, dtype, prefill chunk,
    ...); device: a torch device; seed: the weights of the tiny models (ignored for checkpoints)."""

    source: str = BUNDLED
    determinism: Determinism = field(default_factory=Determinism)
    device: str = "cpu"
    seed: int = 0
