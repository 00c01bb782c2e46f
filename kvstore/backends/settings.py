"""From a run's choices to a backend's settings, in one place per backend: `ModelChoice` is what a caller chose about
its model in no engine's words (the harness's config, kvstore's CLI flags, a script's flags all fill one), and
each backend's Settings dataclass inherits `BackendSettings` and builds itself from a choice with one classmethod,
`from_config` (the shape of lighteval's one config class per backend). Nobody above the registry reads a Settings
class's fields to guess which backend it is: the class answers (`takes_device()`, `pins_determinism()`).

    settings = kvstore.settings_for("llamacpp", kvstore.ModelChoice(source="gemma3-270m"))
    be = kvstore.load_backend("llamacpp", **settings.keywords())
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvstore.determinism import Determinism
from kvstore.errors import SettingsError


@dataclass(frozen=True)
class ModelChoice:
    """What a run chose about its model, in no engine's words; each backend's `from_config` takes what it uses.

    source: the model (a packaged model's name, a checkpoint folder, a hub id, a GGUF file); "" = the backend's
        default (the bundled model). name: the name the model is recorded under ("" = the backend's default).
    device: a torch device (a backend that does not take one runs on the CPU). determinism: the pinned settings.
    named: the backend's own settings by name (the harness's `model.<backend>` section, the CLI's --setting): one it
        does not have is a SettingsError naming it.
    offered: settings a script offers whichever backend it runs (its flags): each taken by a backend that has it."""

    source: str = ""
    name: str = ""
    device: str = "cpu"
    determinism: Determinism = field(default_factory=Determinism)
    named: Mapping[str, Any] = field(default_factory=dict)
    offered: Mapping[str, Any] = field(default_factory=dict)


class BackendSettings:
    """The base of every backend's Settings dataclass: built from a `ModelChoice` by `from_config` (the default: the
    offered settings it has, then its named ones, then `model_name` from the choice's name), and asked its facts."""

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]

    @classmethod
    def from_config(cls, choice: ModelChoice) -> Any:
        """This backend's settings from a run's choices (module docstring); override what the backend reads else."""
        return cls(**cls.chosen(choice))

    @classmethod
    def chosen(cls, choice: ModelChoice) -> dict[str, Any]:
        """The keywords the default `from_config` builds: offered settings this class has, its named settings (an
        unknown one refused), and the choice's name as `model_name` when it gives one."""
        known = cls.field_names()
        unknown = sorted(set(choice.named) - known)
        if unknown:
            raise SettingsError(f"no setting named {', '.join(unknown)}; its settings are {sorted(known)} "
                                f"({cls.__module__}.{cls.__name__})")
        out = {k: v for k, v in choice.offered.items() if k in known} | dict(choice.named)
        if choice.name and "model_name" in known:
            out["model_name"] = choice.name
        return out

    @classmethod
    def takes_device(cls) -> bool:
        """Whether this backend runs on a chosen torch device (False: on the CPU only)."""
        return False

    @classmethod
    def pins_determinism(cls) -> bool:
        """Whether these settings pin the determinism group (an artifact then records it as its settings)."""
        return False

    def pinned_determinism(self) -> Determinism | None:
        """The determinism group these settings pin (a backend that takes it), or None."""
        return None

    def resolved(self) -> Any:
        """These settings with every named model file resolved to its file (a packaged model assembled once, here):
        what a second process loads without assembling it again. Default: themselves."""
        return self

    def keywords(self) -> dict[str, Any]:
        """Every field by name: `kvstore.load_backend(name, **settings.keywords())` loads these settings."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]

    def json_keywords(self) -> dict[str, Any]:
        """`keywords()` as JSON values (a Determinism as its dict): what the restore worker is handed."""
        return {k: v.to_dict() if isinstance(v, Determinism) else v for k, v in self.keywords().items()}
