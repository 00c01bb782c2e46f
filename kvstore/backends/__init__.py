"""The backend registry: every generation engine kvgraft grafts into, one folder (or module) each, found by what it
declares. A backend's face holds `REGISTERED = kvstore.engine.protocol.Registered(name, "module:Class")`, a name and
its Backend class, and every question below is the class's (its Settings dataclass, the module it needs, its
refusals, its loader: kvstore.engine.protocol.Backend's class-level members). `load_backend(name, **settings)`
builds its Settings dataclass from the keywords (an unknown keyword is a SettingsError naming it) and calls its
class's `load`. Adding a backend is its folder, its config file
(configs/model/<name>.yaml) and its test: nothing here changes (docs/extending.md).

    transformers/  the default: Hugging Face transformers (its FrozenModel owned by its Backend), the whole engine
                   in its folder, its own functions its face (kvstore.backends.transformers)
    llamacpp/      llama-cpp-python on a GGUF file
    vllm/          an in-process vLLM engine and its KV connector (its own venv, `make setup-vllm`)
    fake.py        scripted continuations, for the harness's unit tests (in_engine=True: the in-engine capability)
    packaged.py    not a backend: model files installed as registry packages, by name -> a verified GGUF (the bundled
                   270M; the 1.5B after `make setup-models`), shared by the GGUF-reading backends
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import pkgutil
from types import ModuleType
from typing import Any

from kvstore.backends.settings import BackendSettings, ModelChoice
from kvstore.engine.protocol import Backend, Registered
from kvstore.errors import ModelLoadError, SettingsError

__all__ = ["backend_class", "backend_missing", "backend_names", "backend_tools", "batch_invariant_refusal",
           "batch_invariant_unavailable", "batched_rows_refusal", "in_flight_refusal", "load_backend",
           "load_text_model", "registered", "settings_class", "settings_for"]

DEFAULT = "transformers"


@functools.cache
def _declared() -> dict[str, tuple[Registered, str]]:
    """Each backend's entry and the module (its folder's face, or its module) that declares it."""
    found: dict[str, tuple[Registered, str]] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        module = f"{__name__}.{info.name}"
        entry = getattr(importlib.import_module(module), "REGISTERED", None)
        if isinstance(entry, Registered):
            found[entry.name] = (entry, module)
    return {name: found[name] for name in sorted(found, key=lambda n: (n != DEFAULT, n))}


def _registry() -> dict[str, Registered]:
    return {name: entry for name, (entry, _) in _declared().items()}


def backend_names() -> tuple[str, ...]:
    """The registered backends' names, the default (transformers) first."""
    return tuple(_registry())


def registered(name: str) -> Registered:
    """The registry entry of backend `name`; a ModelLoadError naming the choices when there is none."""
    entry = _registry().get(name)
    if entry is None:
        raise ModelLoadError(f"backend {name!r} is not one of {list(backend_names())}; load one of them "
                             "(a new backend declares REGISTERED in its folder: docs/extending.md)")
    return entry


def backend_class(name: str) -> type[Backend]:
    """Backend `name`'s class (imported, nothing loaded): the one answer to every question below. A module its
    engine needs that this Python lacks at import is a ModelLoadError naming it (a class that imports its engine
    only in `load`, as every backend here does, answers `missing()` instead)."""
    entry = registered(name)
    try:
        return entry.backend_class()
    except ModuleNotFoundError as exc:
        raise ModelLoadError(f"the {name} backend's class {entry.backend} cannot be imported in this Python "
                             f"({exc}); install what it needs (docs/backends.md)") from exc


def backend_tools(name: str) -> ModuleType:
    """Backend `name`'s own names: the face of its folder (or its module), which declares it; for a script that
    measures that engine itself (vLLM's start_engine, llama.cpp's weight_buffers, each folder's `bare` module: the
    engine alone on a loaded backend). Importing it loads no engine: its names load on first use."""
    registered(name)  # a ModelLoadError naming the choices when there is none
    return importlib.import_module(_declared()[name][1])


def settings_class(name: str) -> type[BackendSettings]:
    """Backend `name`'s Settings dataclass (its class's `settings_class`)."""
    return backend_class(name).settings_class


def settings_for(name: str, choice: ModelChoice) -> BackendSettings:
    """Backend `name`'s settings from a run's choices (kvstore.backends.settings): its Settings class's
    `from_config`; a SettingsError naming the backend when the choice gives it a setting it does not have."""
    try:
        return settings_class(name).from_config(choice)
    except SettingsError as e:
        raise SettingsError(f"backend {name!r}: {e}") from None


def backend_missing(name: str) -> str | None:
    """Why backend `name` cannot load in this Python (a module its engine needs is absent), or None."""
    return backend_class(name).missing()


def batch_invariant_refusal(name: str) -> str | None:
    """The one-line refusal of determinism.batch_invariant=true on backend `name`, or None when it offers it."""
    return backend_class(name).batch_invariant_refusal()


def batch_invariant_unavailable(name: str) -> str | None:
    """Why determinism.batch_invariant, which backend `name` offers, cannot hold on this machine (one line: its
    kernel's own check, e.g. no C compiler or a failed self-check), or None. Asked lazily: it may build or measure."""
    cls = backend_class(name)
    return None if cls.batch_invariant_absent else cls.mode_unavailable()


def in_flight_refusal(name: str, in_flight: int) -> str | None:
    """The one-line refusal of `in_flight` > 1 contexts decoded together on backend `name`, read off its Backend
    class's capabilities (nothing loads), or None when it offers them."""
    return backend_class(name).in_flight_refusal(in_flight)


def batched_rows_refusal(name: str, rows: int) -> str | None:
    """The one-line refusal of `rows` > 1 rows of one context decoded together on backend `name`, read off its Backend
    class's capabilities (nothing loads), or None when it offers them."""
    return backend_class(name).batched_rows_refusal(rows)


def load_backend(name: str = DEFAULT, **settings: Any) -> Backend:
    """The backend `name` with its model loaded under `settings` (its Settings dataclass's fields: transformers
    source, determinism, device, seed; llamacpp gguf, n_ctx, ...; fake script, margin): its class's `load`."""
    backend = backend_class(name)
    det = settings.get("determinism")
    refusal = backend.batch_invariant_refusal()
    if refusal and (getattr(det, "batch_invariant", False) or settings.get("batch_invariant")):
        raise SettingsError(refusal)
    return backend.load(_settings(name, backend, settings))


def _settings(name: str, backend: type[Backend], settings: dict[str, Any]) -> BackendSettings:
    """`backend`'s Settings built from keywords; one it does not have is a SettingsError naming it and its settings."""
    cls = backend.settings_class
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise SettingsError(f"backend {name!r}: no setting named {', '.join(unknown)}; its settings are "
                            f"{sorted(known)} ({cls.__module__}.{cls.__name__})")
    return cls(**settings)


def load_text_model(name: str, **settings: Any) -> Any:
    """Backend `name`'s model without its engine (encode, decode, chat_template, fingerprint, tokenizer_fingerprint,
    model_name): what a front end that composes the engine's prompts in another process needs (the library-aware
    server, harness.serve). Its class's `load_text` (vLLM's; the base's refuses: a ModelLoadError)."""
    backend = backend_class(name)
    return backend.load_text(_settings(name, backend, settings))
