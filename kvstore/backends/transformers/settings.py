"""The transformers backend's settings: what a caller chooses (a light module, no torch or transformers import)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvstore.backends.settings import BackendSettings, ModelChoice
from kvstore.backends.transformers.gguf import BUNDLED
from kvstore.determinism import Determinism
from kvstore.errors import SettingsError


@dataclass(frozen=True)
class TransformersSettings(BackendSettings):
    """source: the bundled model's name, "tiny-gemma3" (and the other tiny test models), a local checkpoint folder
    or a hub id already in the local cache; determinism: the pinned settings (torch threads, dtype, prefill chunk,
    ...); device: a torch device; seed: the weights of the tiny models (ignored for checkpoints)."""

    source: str = BUNDLED
    determinism: Determinism = field(default_factory=Determinism)
    device: str = "cpu"
    seed: int = 0

    @classmethod
    def from_config(cls, choice: ModelChoice) -> TransformersSettings:
        """The choice's source (the bundled model when it names none), determinism and device; settings by name are
        not this backend's (its settings are those three)."""
        if choice.named:
            raise SettingsError(f"it takes no setting by name ({', '.join(sorted(choice.named))}); its settings are "
                                "the model source, the device and the determinism settings: give those")
        return cls(source=choice.source or BUNDLED, determinism=choice.determinism, device=choice.device)

    @classmethod
    def takes_device(cls) -> bool:
        return True

    @classmethod
    def pins_determinism(cls) -> bool:
        return True

    def pinned_determinism(self) -> Determinism:
        return self.determinism
