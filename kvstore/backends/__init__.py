"""Generation backends behind kvstore.backend.Backend, one module each, and `load_backend` to pick one by name.

    transformers  kvstore.backends.transformers.TransformersBackend (a kvstore.FrozenModel; the default)
    llamacpp      kvstore.backends.llamacpp.LlamaCppBackend (llama-cpp-python on a GGUF file)
    fake          kvstore.backends.fake.FakeBackend (scripted continuations, for harness unit tests)
"""

from __future__ import annotations

from typing import Any

from kvstore.backend import Backend
from kvstore.errors import IncompatibleError, ModelLoadError

BACKENDS = ("transformers", "llamacpp", "fake")


def load_backend(name: str = "transformers", **kwargs: Any) -> Backend:
    """The backend `name` with its model loaded: transformers takes load_frozen_model's arguments (source,
    determinism, device, seed), llamacpp LlamaCppSettings' fields (gguf, n_ctx, ...), fake FakeBackend's."""
    if name == "transformers":
        from kvstore.model import load_frozen_model

        return as_backend(load_frozen_model(**kwargs))
    if name == "llamacpp":
        from kvstore.backends.llamacpp import LlamaCppBackend, LlamaCppSettings

        return LlamaCppBackend(LlamaCppSettings(**kwargs))
    if name == "fake":
        from kvstore.backends.fake import FakeBackend

        return FakeBackend(**kwargs)
    raise ModelLoadError(f"backend {name!r} is not one of {list(BACKENDS)}; set model.backend to one of them")


def as_backend(model: Any) -> Backend:
    """`model` as a Backend: a backend is returned as it is, a kvstore.FrozenModel becomes its transformers
    backend (one per FrozenModel, so repeated calls share it)."""
    if isinstance(model, Backend):
        return model
    from kvstore.model import FrozenModel

    if isinstance(model, FrozenModel):
        from kvstore.backends.transformers import TransformersBackend

        be = model.__dict__.get("_backend")
        if be is None:
            be = model.__dict__["_backend"] = TransformersBackend(model)
        return be
    raise IncompatibleError(f"{type(model).__name__} is neither a kvstore backend nor a FrozenModel; load one with "
                            "kvstore.load_frozen_model() or kvstore.backends.load_backend()")
