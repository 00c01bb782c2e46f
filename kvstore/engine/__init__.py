"""The engine above every backend: protocol.py (the Backend base class, its capabilities, and Registered, how a
backend plugs in), text.py (the Tokenizer a backend's text verbs are derived from),
admission.py (the one graft admission: every recorded fact compared before a byte reaches an engine), verify.py
(check_graft: graft vs fresh reference, SHA-256 of the logits), restore_worker.py (the graft half in another
process), weights.py (a loaded model's weight files pinned: changed under it is an error, not wrong rows)."""
