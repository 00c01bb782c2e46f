"""The KV artifact format (versions 1 and 2): a safetensors file with one metadata entry. No I/O happens here.

See kvstore/FORMAT.md for the normative description. Version 2 (written by default) has the same bytes as
version 1; only the `format` string differs, and with it the hash that names the artifact: `content_id(data)`
is BLAKE3-256 of the file for version 2 (parallel, memory speed) and SHA-256 for version 1 (still read).
`to_bytes(snapshot)` and `from_bytes(data)` are inverse: from_bytes(to_bytes(s)) == s, and to_bytes is a pure
function of the snapshot's content, so the artifact id (`content_id` of the bytes) is stable.
`from_bytes` (hence every store admission and read) checks
every invariant of FORMAT.md section 6 before it returns a tensor; `check_snapshot` checks the ones that
concern an in-memory Snapshot (graft runs it before any tensor reaches a model).

The safetensors framing (header parsing and checks, tensors laid over the bytes) is kvstore/format/framing.py; the
metadata invariants are kvstore/format/invariants.py.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field

import blake3
import torch
from safetensors.torch import save as st_save

from kvstore.errors import FormatError, IntegrityError, KVStoreError, ValidationError
from kvstore.format.canonical import canonical_json
from kvstore.format.framing import (
    FORMAT,
    FORMAT_V2,
    FORMATS,
    META_KEY,
    parse_header,
    read_layout,
    tensor_views,
)
from kvstore.format.invariants import (
    MAX_HEADER_BYTES,
    MAX_LAYERS,
    MAX_POSITION,
    MAX_TOKENS,
    cached_tokens,
    tensor_names,
)
from kvstore.format.invariants import is_int as _is_int

PARALLEL_HASH_MIN = 1 << 20  # below this many bytes, one thread hashes faster than several

_TORCH = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LayerKV:
    """One layer's cache exactly as transformers held it.

    keys/values: (batch, kv_heads, cached_tokens, head_dim); for a sliding-window layer the last
    min(n, window-1) positions, as `DynamicSlidingWindowLayer` keeps them.
    """

    kind: str  # "full" | "sliding"
    window: int | None
    cumulative_length: int  # tokens the layer has seen (== token_count for a snapshot from position 0)
    keys: torch.Tensor
    values: torch.Tensor


@dataclass(frozen=True)
class NumericsRecord:
    """What is known of the numerics an artifact was computed under (kvstore.environment.numerics_fingerprint):
    kept beside the artifact, never in its bytes (its id does not move; FORMAT.md section 8).

    fingerprints: the ones recorded (a store's `numerics:` tags, or the one measured by the process that captured
    it); empty: none recorded. `source` names where they were read (a store, "measured by this process").
    `error`: the record could not be read (the index failed): admission refuses, as for no record."""

    fingerprints: tuple[str, ...]
    source: str
    error: str | None = None
    # the capability issued by the code that measured it (kvstore/format/measured.py `issue`, bound to the bytes):
    # only a record carrying it is written by a put; any other record is a claim and is not written (issue 61)
    measurement: object = field(default=None, compare=False, repr=False)

    @property
    def measured(self) -> bool:
        """Whether this record carries a measurement (a store checks it was issued here, for these bytes)."""
        return self.measurement is not None


@dataclass
class Snapshot:
    """The KV state of one token sequence, with everything needed to check a graft is legitimate.

    `numerics` is not part of the bytes: the evidence of the numerics it was computed under, attached by whoever
    produced the object (a store's get: its record; a capture: this process's measured fingerprint; None: neither,
    e.g. `from_bytes` of bytes from elsewhere). Admission (kvstore.engine.admission) compares it."""

    token_ids: list[int]
    start_position: int
    layers: list[LayerKV]
    model_fingerprint: str
    tokenizer_fingerprint: str
    dtype: str
    determinism: dict
    environment: dict
    model_name: str = ""
    extra: dict = field(default_factory=dict)  # free-form, caller-owned (e.g. {"text_sha256": ...})
    numerics: NumericsRecord | None = field(default=None, compare=False, repr=False)  # not serialized

    @property
    def token_count(self) -> int:
        return len(self.token_ids)

    @property
    def layout(self) -> list[dict]:
        return [{"kind": lyr.kind, "window": lyr.window} for lyr in self.layers]

    def nbytes(self) -> int:
        return sum(lyr.keys.nbytes + lyr.values.nbytes for lyr in self.layers)


def tokens_sha256(token_ids: list[int]) -> str:
    """SHA-256 of token ids as little-endian int64: the key for token-prefix lookups."""
    return hashlib.sha256(torch.tensor(token_ids, dtype=torch.int64).numpy().astype("<i8").tobytes()).hexdigest()


def _sha(t: torch.Tensor) -> str:
    t = t.contiguous()
    return hashlib.sha256(t.view(torch.uint8).numpy() if t.numel() else b"").hexdigest()


@contextmanager
def guard(what: str, error: type[KVStoreError] = FormatError) -> Iterator[None]:
    """Turn any stray Python exception raised while handling untrusted input into a kvstore error naming `what`
    (KVStoreErrors pass through unchanged)."""
    try:
        yield
    except KVStoreError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, RecursionError, OverflowError,
            UnicodeError) as e:
        raise error(f"{what}: {type(e).__name__}: {e}") from e


def hash_threads() -> int:
    """Threads a BLAKE3 pass may use: the CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def declared_format(data: bytes | bytearray | memoryview) -> str | None:
    """The `format` an artifact's header declares, or None when the bytes are not a readable artifact header.
    Untrusted: it only chooses which hash names the bytes (`content_id`); both hashes are preimage-resistant,
    so declaring either version cannot make forged bytes match an id, and from_bytes validates everything."""
    try:
        with guard("artifact header"):
            if len(data) < 8:
                return None
            n = int.from_bytes(bytes(data[:8]), "little")
            if n < 2 or n > MAX_HEADER_BYTES or 8 + n > len(data):
                return None
            # plain json (size-bounded above, RecursionError caught by guard): the strict, bounded parse is
            # from_bytes's, which every read runs next; doing it twice cost ~1.5 ms per read of a 10 kB header
            header = json.loads(bytes(data[8 : 8 + n]))
            md = header.get("__metadata__") if isinstance(header, dict) else None
            if not isinstance(md, dict) or not isinstance(md.get(META_KEY), str):
                return None
            meta = json.loads(md[META_KEY])
            version = meta.get("format") if isinstance(meta, dict) else None
            return version if isinstance(version, str) else None
    except KVStoreError:
        return None


def content_id(data: bytes | bytearray | memoryview, threads: int | None = None) -> str:
    """The artifact id of these bytes, 64 lowercase hex digits: BLAKE3-256 of the whole file when its header
    declares kvgraft-kv/2 (on `threads` threads, default all usable CPUs, for files of 1 MiB and more),
    SHA-256 of the whole file otherwise (kvgraft-kv/1, and any bytes that are not an artifact)."""
    if declared_format(data) == FORMAT_V2:
        n = threads if threads is not None else hash_threads()
        n = n if len(data) >= PARALLEL_HASH_MIN else 1
        return blake3.blake3(data, max_threads=max(1, n)).hexdigest()
    return hashlib.sha256(data).hexdigest()


def to_bytes(s: Snapshot, version: str = FORMAT) -> bytes:
    """Serialize a snapshot. Tensors are stored in their own dtype and shape, bytes untouched. `version` is
    FORMAT (kvgraft-kv/2) unless bytes of the older version are wanted (tests, tools that write for old readers);
    the two differ only in the `format` string, hence in which hash names them."""
    if version not in FORMATS:
        raise FormatError(f"to_bytes: unknown format {version!r}; write one of {list(FORMATS)}")
    tensors: dict[str, torch.Tensor] = {"token_ids": torch.tensor(s.token_ids, dtype=torch.int64)}
    layers_meta = []
    for i, lyr in enumerate(s.layers):
        k, v = lyr.keys.detach().contiguous().cpu(), lyr.values.detach().contiguous().cpu()
        tensors[f"layers.{i}.keys"] = k
        tensors[f"layers.{i}.values"] = v
        layers_meta.append({
            "kind": lyr.kind, "window": lyr.window, "cumulative_length": lyr.cumulative_length,
            "shape": list(k.shape), "dtype": str(k.dtype).removeprefix("torch."),
        })
    meta = {
        "format": version,
        "token_count": s.token_count,
        "start_position": s.start_position,
        "tokens_sha256": tokens_sha256(s.token_ids),
        "model_fingerprint": s.model_fingerprint,
        "tokenizer_fingerprint": s.tokenizer_fingerprint,
        "model_name": s.model_name,
        "dtype": s.dtype,
        "determinism": s.determinism,
        "environment": s.environment,
        "layers": layers_meta,
        "tensor_sha256": {name: _sha(t) for name, t in sorted(tensors.items())},
        "extra": s.extra,
    }
    # One metadata key holding canonical JSON: safetensors' header order is then fully determined.
    return st_save(tensors, metadata={META_KEY: canonical_json(meta, ensure_ascii=True)})  # FORMAT.md S4


def read_metadata(data: bytes | bytearray | memoryview) -> dict:
    """Parse and validate only the header's kvgraft metadata (cheap: no tensor is touched)."""
    with guard("artifact metadata"):
        return parse_header(data)[1]


def _verify_tensors(tensors: dict[str, torch.Tensor], expected: dict, names: list[str],
                    threads: int | None = None) -> None:
    """Every tensor's SHA-256 against the metadata (V7), on `threads` threads (default: all usable CPUs) when
    the tensors hold 1 MiB or more (hashlib releases the GIL); IntegrityError naming the first bad tensor."""
    n = threads if threads is not None else hash_threads()
    if n > 1 and sum(tensors[k].nbytes for k in names) >= PARALLEL_HASH_MIN:
        with ThreadPoolExecutor(max_workers=n, thread_name_prefix="kvgraft-verify") as pool:
            digests = list(pool.map(lambda k: _sha(tensors[k]), names))
    else:
        digests = [_sha(tensors[k]) for k in names]
    for name, got in zip(names, digests, strict=True):
        if got != expected[name]:
            raise IntegrityError(f"tensor {name!r} does not match its recorded SHA-256 (corrupted artifact)")


def from_bytes(data: bytes | bytearray | memoryview, verify_tensors: bool = True) -> Snapshot:
    """Parse an artifact, checking every invariant of FORMAT.md section 6 except, without verify_tensors, the
    per-tensor SHA-256 (a store checks the whole file's hash instead). Raises FormatError (structure),
    ValidationError (an invariant) or IntegrityError (a hash); never any other exception.

    The snapshot's tensors are views of one writable buffer: `data` itself when it is writable (a bytearray or
    a writable memoryview, which the snapshot then owns), otherwise one copy of it, so that tensors never alias
    immutable bytes the caller (or a store) still holds.
    """
    with guard("artifact"):
        layout = read_layout(data)
        meta = layout.meta
        buf = memoryview(data)
        if buf.readonly:
            buf = memoryview(bytearray(buf))
        tensors = tensor_views(buf.cast("B"), layout)
        if verify_tensors:
            _verify_tensors(tensors, meta["tensor_sha256"], tensor_names(len(meta["layers"])))
        elif _sha(tensors["token_ids"]) != meta["tokens_sha256"]:  # cheap, and the index trusts it: always checked
            raise IntegrityError("tensor 'token_ids' does not hash to the recorded tokens_sha256: the metadata lies "
                                 "about which tokens the artifact holds; deposit it again")
        layers = [LayerKV(lm["kind"], lm["window"], lm["cumulative_length"],
                          tensors[f"layers.{i}.keys"], tensors[f"layers.{i}.values"])
                  for i, lm in enumerate(meta["layers"])]
        snapshot = Snapshot(
            token_ids=tensors["token_ids"].tolist(), start_position=meta["start_position"], layers=layers,
            model_fingerprint=meta["model_fingerprint"], tokenizer_fingerprint=meta["tokenizer_fingerprint"],
            dtype=meta["dtype"], determinism=meta["determinism"], environment=meta["environment"],
            model_name=meta["model_name"], extra=meta["extra"],
        )
        check_snapshot(snapshot)
        return snapshot


def check_snapshot(s: Snapshot) -> None:
    """Raise ValidationError unless an in-memory snapshot satisfies the format's invariants (FORMAT.md 6, V1-V6):
    token ids, dtype, and per layer kind/window, cumulative_length, and keys/values of the artifact dtype with
    shape (1, kv_heads, cached_tokens, head_dim)."""
    name = s.model_name or "snapshot" if isinstance(s.model_name, str) else "snapshot"
    ids = s.token_ids
    if not isinstance(ids, list) or not 1 <= len(ids) <= MAX_TOKENS:
        raise ValidationError(f"{name}: token_ids must be a list of 1 to {MAX_TOKENS} token ids")
    plain = set(map(type, ids)) == {int} and 0 <= min(ids) and max(ids) < MAX_POSITION  # C-speed common case
    if not plain and not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < MAX_POSITION for x in ids):
        bad = next(x for x in ids if not (isinstance(x, int) and not isinstance(x, bool) and 0 <= x < MAX_POSITION))
        raise ValidationError(f"{name}: token id {bad!r} is not an integer in [0, 2**31); deposit it again")
    t = len(ids)
    if not _is_int(s.start_position, 0, MAX_POSITION - t):
        raise ValidationError(f"{name}: start_position {s.start_position!r} is not an integer in [0, 2**31 - {t}]")
    if s.dtype not in _TORCH:
        raise ValidationError(f"{name}: dtype {s.dtype!r} is not one of {sorted(_TORCH)}")
    if not isinstance(s.determinism, dict) or not isinstance(s.environment, dict):
        raise ValidationError(f"{name}: determinism and environment must be dicts (as capture_snapshot records them)")
    if not isinstance(s.layers, list) or not 1 <= len(s.layers) <= MAX_LAYERS:
        raise ValidationError(f"{name}: layers must be a list of 1 to {MAX_LAYERS} LayerKV")
    want = _TORCH[s.dtype]
    for i, lyr in enumerate(s.layers):
        where = f"{name}: layer {i}"
        if lyr.kind not in ("full", "sliding") or (lyr.kind == "full") != (lyr.window is None) or (
                lyr.kind == "sliding" and not _is_int(lyr.window, 2, MAX_POSITION)):
            raise ValidationError(f"{where}: kind {lyr.kind!r} with window {lyr.window!r} is not 'full' with no "
                                  "window or 'sliding' with a window >= 2")
        if lyr.cumulative_length != t or isinstance(lyr.cumulative_length, bool):
            raise ValidationError(f"{where}: cumulative_length {lyr.cumulative_length!r} differs from the token count "
                                  f"{t}; a graft would mask and position the suffix wrongly. Deposit it again")
        for part in ("keys", "values"):
            x = getattr(lyr, part)
            if not isinstance(x, torch.Tensor) or x.dtype != want:
                got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
                raise ValidationError(f"{where} {part} are {got}, the artifact dtype is {s.dtype}; deposit it again")
            cached = cached_tokens(lyr.kind, lyr.window, t)
            if x.dim() != 4 or x.shape[0] != 1 or x.shape[2] != cached or x.shape[1] < 1 or x.shape[3] < 1:
                raise ValidationError(f"{where} {part} have shape {tuple(x.shape)}; a {lyr.kind} layer (window "
                                      f"{lyr.window}) that has seen {t} tokens holds (1, kv_heads, {cached}, head_dim)")
        if lyr.keys.shape != lyr.values.shape:
            raise ValidationError(f"{where}: keys {tuple(lyr.keys.shape)} and values {tuple(lyr.values.shape)} "
                                  "differ in shape; deposit it again")
