"""The llama.cpp backend: llama-cpp-python on a GGUF file (backend.py: the engine; settings.py: what a caller
chooses; state.py: llama.cpp's sequence state bytes <-> kvgraft layers). docs/backends.md."""

from kvstore.engine.protocol import Registered

REGISTERED = Registered("llamacpp", settings="kvstore.backends.llamacpp.settings:LlamaCppSettings",
                        loader="kvstore.backends.llamacpp.backend:load",
                        backend="kvstore.backends.llamacpp.backend:LlamaCppBackend",
                        batch_invariant="llama.cpp has no batch-invariant mode: its CPU matrix products and attention "
                                        "pick their kernels and split their reductions by the batch's token count "
                                        "(n_batch/n_ubatch), and nothing pins them")
