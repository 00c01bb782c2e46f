"""The kvstore exception family.

Every error raised by kvstore derives from `KVStoreError`; each subclass says when it is raised and what
the caller should do. Messages name the artifact, file or field that was wrong and the fix.
"""

from __future__ import annotations


class KVStoreError(Exception):
    """Base class of every kvstore error."""


class NotFoundError(KVStoreError, KeyError):
    """An artifact id (or token-prefix hash) is not in the store. List what exists with `kvstore ls`."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "not found"


class InvalidIdError(KVStoreError, ValueError):
    """A string is not a valid artifact id (64 lowercase hex digits) or a path does not map to one."""


class IntegrityError(KVStoreError):
    """Stored bytes do not hash to their id or to a tensor's recorded SHA-256 (corrupted or truncated).

    The artifact must not be used: delete it (`kvstore rm ID`) and deposit it again.
    """


class FormatError(KVStoreError):
    """The bytes are not a kvgraft KV artifact, or declare a format version this code does not read."""


class IncompatibleError(KVStoreError):
    """An artifact does not match the model, tokenizer, dtype, layer layout, tokens or position it is
    grafted into. Deposit it again with the model you are using, or use the model it was made with."""


class EnvironmentMismatchError(IncompatibleError):
    """An artifact was deposited in another compute environment (device, CPU, kernel paths, versions): a graft would
    not be guaranteed exact. Deposit it again here, or graft with allow_environment_mismatch=True."""


class ModelLoadError(KVStoreError):
    """A model source could not be loaded (missing folder, no offline copy, unknown name)."""


class ModelChangedError(ModelLoadError):
    """A weight file of a loaded model changed (rewritten, truncated, replaced) after it was fingerprinted
    (kvstore.engine.weights): what the model computes no longer matches its fingerprint. The caller stops before
    recording anything more; restore the file, or load the model again to use the new one."""


class SettingsError(KVStoreError):
    """A determinism setting (`Determinism`, the `determinism.*` config group) has a value kvstore cannot use:
    an unknown dtype or attention implementation, threads < 1, a negative prefill chunk, an unknown key, or an
    attention implementation the model's architecture does not support. The message names the setting and the
    values it accepts; change that setting."""


class TransferParamsError(KVStoreError):
    """A request's `kv_transfer_params` for KvgraftConnector (client input, untrusted: kvstore.backends.vllm.params)
    has a key the connector does not know, a value of the wrong type, or a value or body over its size limit. An
    HTTP request is answered 400 with this message before it reaches the engine; the message names the key and
    the values it accepts: fix the request."""


class ValidationError(FormatError):
    """Well-formed artifact bytes whose metadata contradicts the tensors or itself (a dtype, shape, window,
    `cumulative_length`, token count, `tokens_sha256` or bound that does not hold; see FORMAT.md section 6).
    Such bytes could graft to wrong logits, so they are refused on admission, on read and at graft.
    Deposit the artifact again with kvgraft; do not edit artifact headers by hand."""


class IndexDatabaseError(KVStoreError):
    """The store's SQLite index could not be read or written (locked past the timeout, disk full, damaged file).
    Object files are unaffected: fix the cause (free space, stop the other writer) and run `kvstore gc`, which
    re-indexes every valid object that lacks a row."""


class BundleError(KVStoreError):
    """A bundle (`kvstore export` / `kvstore import`, FORMAT.md section 7) cannot be written or is refused on
    import: malformed, damaged, truncated or hostile (links, devices, path traversal, unlisted or duplicate
    members, oversized manifest, bytes that do not hash to their id). Nothing was added to the target store.
    The message names the member; export the bundle again from its source store with `kvstore export`."""


class UnsupportedModelError(ModelLoadError):
    """The model is not a kind kvgraft supports: kvgraft captures and grafts causal LMs (decoder-only models with
    attention KV caches, loaded with AutoModelForCausalLM), not encoder-decoder or encoder-only models. Use a
    causal LM."""


class CaptureError(IncompatibleError):
    """Deposit refused: after prefill, the model's cache holds state for the prefix that an artifact cannot hold
    (recurrent or convolution state, a layer without keys/values of its own, keys and values of different shapes,
    or any attribute that a rebuild from the captured tensors does not reproduce bit for bit), so a graft would
    continue from a wrong state (FORMAT.md section 9). The message names the layer index, its kind and class and
    what cannot be captured. Nothing was stored; this model cannot be deposited by this kvgraft version."""


class ReadOnlyStoreError(KVStoreError):
    """A write (put, tag, remove, gc) was asked of a store that is read-only: a published library on a read-only
    mount, a folder this user may not write, or a store opened with read_only=True. Reads, listing, verify and
    graft work. Deposit into a writable store instead, or remount / chmod the store read-write."""


class StoreFullError(KVStoreError):
    """The device holding a store ran out of space (ENOSPC, or a quota: EDQUOT) while an artifact or its index
    row was written. Nothing partial is left: the write was undone. Free space on that device, or point the store
    at another one, and run again (a library build resumes from the entries already stored)."""


class StoreUnavailableError(KVStoreError):
    """A remote store (an S3 endpoint) could not be reached or refused the request (connection refused, timeout,
    access denied, no such bucket). Nothing was changed by the failed call. Start the server or fix the
    endpoint, bucket and credentials the message names, then run again."""


class RestoreWorkerError(KVStoreError):
    """The second process of `kvstore.engine.restore_worker.RestoreWorker` died, never became ready, loaded another
    model
    than the caller's (fingerprints differ) or handed back logits that do not hash to the SHA-256 it reported.
    The message holds the end of the worker's log; fix what it says (usually the model spec) and run again."""


class RemoteGraftError(KVStoreError):
    """The second process could not graft one artifact (the error it raised is named in the message); it keeps
    serving, so the caller may record the failure for that artifact and go on."""
