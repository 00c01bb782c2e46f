"""Generation backends behind kvstore.backend.Backend, one module each, and `load_backend` to pick one by name.

    transformers  kvstore.backends.transformers.TransformersBackend (a kvstore.FrozenModel; the default)
    llamacpp      kvstore.backends.llamacpp.LlamaCppBackend (llama-cpp-python on a GGUF file)
    fake          kvstore.backends.fake.FakeBackend (scripted continuations, for harness unit tests)
"""

from __future__ import annotations

from typing import Any

from kvstore.backend import Backend
from kvstore.errors import ModelLoadError

BACKENDS = ("transformers", "llamacpp", "fake")


def load_backend(name: str = "transformers", **kwargs: Any) -> Backend:
    """The backend `name` with its model loaded: transformers takes load_frozen_model's arguments (source,
    determinism, device, seed), llamacpp LlamaCppSettings' fields (gguf, n_ctx, ...), fake FakeBackend's."""
    if name == "transformers":
        from kvstore.backend import as_backend
        from kvstore.model import load_frozen_model

        return as_backend(load_frozen_model(**kwargs))
    if name == "llamacpp":
        from kvstore.backends.llamacpp import LlamaCppBackend, LlamaCppSettings

        return LlamaCppBackend(LlamaCppSettings(**kwargs))
    if name == "fake":
        from kvstore.backends.fake import FakeBackend

        return FakeBackend(**kwargs)
    raise ModelLoadError(f"backend {name!r} is not one of {list(BACKENDS)}; set model.backend to one of them")
