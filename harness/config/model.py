"""Loading the model a config names: the backend `model.backend` picks from kvstore's registry, under its settings
(`model.<backend>`; transformers: model.source, model.device and the determinism group). The config module only
describes; this is where a model is loaded."""

from __future__ import annotations

import dataclasses
from enum import Enum

from harness.config.schema import Config
from harness.errors import ConfigError
from kvstore import Backend, BackendSettings, Determinism, ModelChoice, load_backend, settings_class, settings_for


def check_device(spec: str) -> None:
    """A ConfigError naming model.device when this machine has no such device (cuda without a GPU, cuda:3 on a
    one-GPU machine), before torch is asked to put a model there."""
    import torch

    try:
        dev = torch.device(spec)
    except (RuntimeError, TypeError):
        raise ConfigError(f"model.device={spec!r}: not a torch device; use cpu, cuda or cuda:N") from None
    if dev.type == "cpu":
        return
    accelerator = getattr(torch, dev.type, None)  # torch.cuda, torch.xpu, torch.mps: the device's torch module
    available = bool(getattr(accelerator, "is_available", lambda: False)())
    if not available:
        raise ConfigError(f"model.device={spec!r}: this machine has no {dev.type} device (torch {torch.__version__} "
                          "sees none); use model.device=cpu")
    count = int(getattr(accelerator, "device_count", lambda: 1)())
    if dev.index is not None and dev.index >= count:
        raise ConfigError(f"model.device={spec!r}: this machine has {count} {dev.type} device(s) "
                          f"({dev.type}:0..{count - 1})")


def model_settings(c: Config) -> BackendSettings:
    """The settings of the backend `model.backend` names, built by its own Settings class from the run's choices
    (`from_config`: no backend is named here and none is guessed from its fields): the model's source, name and
    device, the determinism group, and the backend's section `model.<backend>` when it has one (defaults when the
    config gives none)."""
    m = c.model
    name = str(m.backend)
    section = getattr(m, name, None)
    named = dataclasses.asdict(section) if section is not None else {}
    named = {k: v.value if isinstance(v, Enum) else v for k, v in named.items()}  # closed choices as plain strings
    choice = ModelChoice(source=m.source, name=m.name, device=m.device,
                         determinism=Determinism(**dataclasses.asdict(c.determinism)), named=named)
    return settings_for(name, choice)


def load_model(c: Config) -> Backend:
    """The backend the config names with its frozen model loaded (a backend that takes a device: the device checked
    first). Every harness function that takes a model takes this Backend, the one object of a loaded model."""
    if settings_class(str(c.model.backend)).takes_device():
        check_device(c.model.device)  # before anything loads
    return load_backend(str(c.model.backend), **model_settings(c).keywords())


def check_given_backend(c: Config, be: Backend) -> None:
    """A ConfigError, in one line, when a backend handed to a run (the compare job's, a Ray actor's, a caller's
    `be=`) computes under other settings than the config the run records: its manifest, comparable and resume keys
    would then name a computation that did not happen. Compared: the batch-invariant mode
    (determinism.batch_invariant, every backend), and for a backend whose settings take the determinism group
    (transformers) every pinned setting its `settings()` records. (The backend's own name and settings are what the
    manifest's `inputs.determinism` and the keys record, from the backend itself.)"""
    problems = []
    if be.batch_invariant() != bool(c.determinism.batch_invariant):
        problems.append(f"determinism.batch_invariant={str(c.determinism.batch_invariant).lower()}, the backend given "
                        f"runs {'the mode' if be.batch_invariant() else 'without the mode'}")
    det = model_settings(c).pinned_determinism()
    if det is not None:  # the backend records its settings as a Determinism does (transformers)
        given = Determinism.from_dict(be.settings())
        for f in dataclasses.fields(Determinism):
            want, have = getattr(det, f.name), getattr(given, f.name)
            # the mode is compared above for every backend; allow_environment_mismatch is a policy, not recorded
            if f.name not in ("batch_invariant", "allow_environment_mismatch") and want != have:
                problems.append(f"determinism.{f.name}={want!r}, the backend given has {have!r}")
    if problems:
        raise ConfigError(f"the model handed to this run was loaded under other settings than its config records "
                          f"({'; '.join(problems)}); load it from this config (harness.config.load_model) or set "
                          "the config to the model's settings")
