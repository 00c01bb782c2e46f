"""The transformers backend, the whole engine: model.py (load a frozen model, fingerprint it), gguf.py (the bundled
GGUF dequantized once), capture.py (prefill under the pinned schedule, snapshot a cache), graft.py (rebuild a cache
from a snapshot), cache_state.py, lm_head.py, tiny.py (tiny random-weight models), backend.py (the Backend),
settings.py (what a caller chooses)."""

from kvstore.engine.protocol import Registered

REGISTERED = Registered("transformers", settings="kvstore.backends.transformers.settings:TransformersSettings",
                        loader="kvstore.backends.transformers.backend:load")
