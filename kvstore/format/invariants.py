"""The normative checks of kvstore/FORMAT.md section 6 that need no tensors: strict bounded JSON (M1-M3) and the
types, ranges and cross-field agreement of the kvgraft metadata (M4-M6). Pure functions; kvstore/format/artifact.py runs
them on every header before any tensor is built.
"""

from __future__ import annotations

import json
import math

from kvstore.errors import FormatError, IntegrityError, ValidationError

# Bounds on what an artifact may declare (FORMAT.md 6, M3). Far above any real artifact, low enough that a
# hostile header cannot exhaust memory or recursion before it is refused.
MAX_HEADER_BYTES = 4 << 20  # safetensors header (JSON), metadata included
MAX_JSON_DEPTH = 8  # nesting of objects/arrays, in the safetensors header and in the metadata
MAX_STRING = 4096  # characters in any metadata string or key
MAX_ITEMS = 1 << 16  # entries in any one metadata object or array
MAX_INT = 1 << 53  # |integer| anywhere in the metadata (exactly representable as a double)
MAX_LAYERS = 4096
MAX_TOKENS = 1 << 24
MAX_POSITION = 1 << 31  # start_position + token_count, and every token id, stay below this

# Artifact dtype -> safetensors tag of its layer tensors.
DTYPE_TAGS = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}
_HEX = frozenset("0123456789abcdef")
_LAYER_FIELDS = frozenset({"kind", "window", "cumulative_length", "shape", "dtype"})
_DETERMINISM_FIELDS = ("threads", "deterministic_algorithms", "attn_implementation", "dtype", "prefill_chunk")


def cached_tokens(kind: str, window: int | None, token_count: int) -> int:
    """Positions a layer holds after seeing `token_count` tokens: all of them (full attention), or the last
    window - 1 (transformers' DynamicSlidingWindowLayer keeps `[-window + 1:]`)."""
    return token_count if kind == "full" else min(token_count, int(window) - 1)


# ---- JSON: strict parsing and bounds (FORMAT.md 6, M1-M3) ----

def _no_duplicates(pairs: list[tuple[str, object]]) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise ValueError(f"duplicate key {next(k for i, (k, _) in enumerate(pairs) if k in dict(pairs[:i]))!r}")
    return out


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not a JSON number")


def loads_strict(raw: bytes | str, what: str, max_string: int = MAX_STRING) -> object:
    """Strict JSON (UTF-8, no duplicate keys, no NaN/Infinity) within the size bounds, else FormatError."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        obj = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except RecursionError:
        raise FormatError(f"{what}: JSON nested too deeply (limit {MAX_JSON_DEPTH}); not a kvgraft artifact") from None
    except ValueError as e:  # includes UnicodeDecodeError and json.JSONDecodeError
        raise FormatError(f"{what} is not valid JSON ({e}); not a kvgraft artifact, or damaged") from None
    _check_bounds(obj, what, max_string)
    return obj


def _check_bounds(obj: object, what: str, max_string: int) -> None:
    """Depth, item count, string length and number range of every value. Paths are built only for an error
    (a header is checked on every read, so the walk stays cheap: about 0.1 ms for a 10 kB header)."""
    stack: list[tuple[object, int, tuple]] = [(obj, 0, ())]
    while stack:
        x, depth, at = stack.pop()
        t = type(x)
        if t is dict or t is list:
            if depth >= MAX_JSON_DEPTH:
                raise FormatError(f"{what}{_path(at)}: JSON nested deeper than {MAX_JSON_DEPTH} levels")
            if len(x) > MAX_ITEMS:
                raise FormatError(f"{what}{_path(at)}: {len(x)} entries, more than the limit {MAX_ITEMS}")
            if t is dict:
                for k, v in x.items():
                    if len(k) > MAX_STRING:
                        raise FormatError(f"{what}{_path(at)}: a key of {len(k)} characters (limit {MAX_STRING})")
                    stack.append((v, depth + 1, (at, k)))
            else:
                for i, v in enumerate(x):
                    stack.append((v, depth + 1, (at, i)))
        elif t is str:
            if len(x) > max_string:
                raise FormatError(f"{what}{_path(at)}: a string of {len(x)} characters (limit {max_string})")
        elif t is int:
            if abs(x) > MAX_INT:
                raise FormatError(f"{what}{_path(at)}: integer {x} out of range (|n| <= 2**53)")
        elif t is float:
            if not math.isfinite(x):
                raise FormatError(f"{what}{_path(at)}: non-finite number {x}")


def _path(at: tuple) -> str:
    """`.key[3].other` from the linked (parent, key) pairs `_check_bounds` keeps."""
    keys = []
    while at:
        at, k = at
        keys.append(f".{k}" if isinstance(k, str) else f"[{k}]")
    return "".join(reversed(keys))


# ---- metadata fields (FORMAT.md 6, M4-M6) ----

def _bad(name: str, got: object, want: str) -> ValidationError:
    shown = repr(got)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    return ValidationError(f"artifact metadata {name} is {shown}: must be {want}. The artifact is not one kvgraft "
                           "wrote (edited or damaged header); deposit it again")


def is_int(v: object, lo: int, hi: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def _is_hex64(v: object) -> bool:
    return isinstance(v, str) and len(v) == 64 and set(v) <= _HEX


def tensor_names(n_layers: int) -> list[str]:
    """The tensors an artifact of `n_layers` layers holds, in sorted order."""
    return sorted(["token_ids"] + [f"layers.{i}.{p}" for i in range(n_layers) for p in ("keys", "values")])


def check_meta(meta: dict) -> None:
    """Types, ranges and cross-field agreement of the kvgraft metadata (not yet against the tensors)."""
    t = meta["token_count"]
    if not is_int(t, 1, MAX_TOKENS):
        raise _bad("token_count", t, f"an integer in [1, {MAX_TOKENS}]")
    sp = meta["start_position"]
    if not is_int(sp, 0, MAX_POSITION - t):
        raise _bad("start_position", sp, "an integer in [0, 2**31 - token_count]")
    for name in ("tokens_sha256", "model_fingerprint", "tokenizer_fingerprint"):
        if not _is_hex64(meta[name]):
            raise _bad(name, meta[name], "64 lowercase hex digits")
    if not isinstance(meta["model_name"], str):
        raise _bad("model_name", meta["model_name"], "a string")
    dtype = meta["dtype"]
    if dtype not in DTYPE_TAGS:
        raise _bad("dtype", dtype, f"one of {sorted(DTYPE_TAGS)}")
    for name in ("determinism", "environment", "extra", "tensor_sha256"):
        if not isinstance(meta[name], dict):
            raise _bad(name, meta[name], "a JSON object")
    _check_determinism(meta["determinism"], dtype)
    layers = meta["layers"]
    if not isinstance(layers, list) or not 1 <= len(layers) <= MAX_LAYERS:
        raise _bad("layers", type(layers).__name__ if not isinstance(layers, list) else f"{len(layers)} layers",
                   f"a list of 1 to {MAX_LAYERS} layer objects")
    for i, lm in enumerate(layers):
        _check_layer_meta(i, lm, t, dtype)
    sums = meta["tensor_sha256"]
    names = tensor_names(len(layers))
    if sorted(sums) != names:
        missing, extra = sorted(set(names) - set(sums)), sorted(set(sums) - set(names))
        raise ValidationError(f"artifact tensor_sha256 does not list exactly the tensors of {len(layers)} layers "
                              f"(missing {missing[:4]}, unexpected {extra[:4]}); deposit the artifact again")
    for name in names:
        if not _is_hex64(sums[name]):
            raise _bad(f"tensor_sha256[{name!r}]", sums[name], "64 lowercase hex digits")
    if sums["token_ids"] != meta["tokens_sha256"]:
        raise IntegrityError(f"artifact tokens_sha256 {meta['tokens_sha256'][:12]}... differs from the SHA-256 "
                             f"recorded for tensor 'token_ids' ({sums['token_ids'][:12]}...): the metadata lies "
                             "about which tokens it holds; deposit the artifact again")


def _check_determinism(det: dict, dtype: str) -> None:
    checks = {
        "threads": (lambda v: is_int(v, 1, 1 << 16), "an integer in [1, 65536]"),
        "deterministic_algorithms": (lambda v: isinstance(v, bool), "true or false"),
        "attn_implementation": (lambda v: isinstance(v, str) and 0 < len(v) <= 64, "a name such as 'sdpa'"),
        "dtype": (lambda v: v == dtype, f"the artifact dtype {dtype!r}"),
        "prefill_chunk": (lambda v: is_int(v, 0, MAX_POSITION), "an integer >= 0"),
    }
    for name, (ok, want) in checks.items():
        if name not in det:
            raise _bad("determinism", sorted(det), f"an object with the settings {list(_DETERMINISM_FIELDS)}")
        if not ok(det[name]):
            raise _bad(f"determinism.{name}", det[name], want)


def _check_layer_meta(i: int, lm: object, t: int, dtype: str) -> None:
    where = f"layers[{i}]"
    if not isinstance(lm, dict) or set(lm) != _LAYER_FIELDS:
        raise _bad(where, lm, f"an object with exactly the fields {sorted(_LAYER_FIELDS)}")
    kind, window = lm["kind"], lm["window"]
    if kind == "full":
        if window is not None:
            raise _bad(f"{where}.window", window, "null for a full-attention layer")
    elif kind == "sliding":
        if not is_int(window, 2, MAX_POSITION):
            raise _bad(f"{where}.window", window, "an integer >= 2 for a sliding-window layer")
    else:
        raise _bad(f"{where}.kind", kind, "'full' or 'sliding'")
    if lm["cumulative_length"] != t or not is_int(lm["cumulative_length"], 1, MAX_TOKENS):
        raise _bad(f"{where}.cumulative_length", lm["cumulative_length"],
                   f"the token count {t} (the tokens the layer has seen)")
    if lm["dtype"] != dtype:
        raise _bad(f"{where}.dtype", lm["dtype"], f"the artifact dtype {dtype!r}")
    shape = lm["shape"]
    if not (isinstance(shape, list) and len(shape) == 4 and all(is_int(d, 1, MAX_POSITION) for d in shape)):
        raise _bad(f"{where}.shape", shape, "[batch, kv_heads, cached_tokens, head_dim] of positive integers")
    want = cached_tokens(kind, window, t)
    if shape[0] != 1 or shape[2] != want:
        raise _bad(f"{where}.shape", shape, f"[1, kv_heads, {want}, head_dim] for a {kind} layer "
                   f"(window {window}) that has seen {t} tokens")
