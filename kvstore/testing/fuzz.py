"""Fuzz the store's admission and the graft: mutate real artifacts, admit them, graft whatever is admitted and
compare its suffix logits with the original's. The claim it tests: no mutant is admitted that grafts to logits
different from its original's (no silent wrong graft), and every refusal is a KVStoreError.

    python -m scripts.fuzz_store --mutants 100000 [--seed 0] [--models tiny-gemma3,tiny-llama] [--out runs/fuzz]
    python -m kvstore.testing.fuzz ...                      # the same; tests/kvstore/test_fuzz.py calls fuzz() directly

One artifact per model is deposited (tiny-gemma3: 24 tokens, across its sliding window of 16; tiny-llama: 12
tokens; all under Determinism(threads=1)), its graft checked byte-identical to the fresh reference, then
mutants are drawn from it: random bit flips, truncations, inserts and deletions (most aimed at the header),
and header JSON edits (numbers, dtypes, shapes, cumulative_length, token hashes, determinism fields,
bounds, non-canonical spellings). Every
mutant goes through MemoryStore.put_bytes (every 10th also through a LocalStore, which must agree), then
store.get, the backend's graft and the suffix forward from the position the cache reports, as the harness continues
a graft. Outcomes:

  admitted_exact      admitted, and grafts to the original's logits (byte-identical SHA-256)
  refused             a KVStoreError at admission or at graft, counted by stage and class
  silent_wrong        admitted, grafted, different logits, no error: must be 0
  foreign             an exception outside KVStoreError anywhere: must be 0
  forgery             consistent forgeries (tensor bytes rewritten with their digests recomputed), out of scope
                      for admission (FORMAT.md 6): counted apart, by what happened to them

Prints a JSON summary (and writes it to --out/summary.json): counts, mutants/s, the machine, examples.

Over 400 lines on purpose: the mutators and the loop that classifies their outcomes are one procedure, read top
to bottom against the list above; neither half means anything alone, and no other module uses either.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

from kvstore import Determinism, KVStoreError, LocalStore, MemoryStore, load_backend, to_bytes
from kvstore.atomic import atomic_write
from kvstore.engine.verify import graft_logits, logits_sha256, reference_logits
from kvstore.environment import cpu_name
from kvstore.format.artifact import NumericsRecord, from_bytes

MODELS = ("tiny-gemma3", "tiny-llama")
PREFIX = {"tiny-gemma3": 24, "tiny-llama": 12}
SUFFIX = 4
_HEX = "0123456789abcdef"


@dataclass
class Base:
    """One original artifact and what its graft must reproduce."""

    model: str
    be: object  # the transformers backend
    data: bytes
    prefix: list[int]
    suffix: list[int]
    ref_sha: str
    header: dict
    meta: dict
    body: bytes


def make_base(model: str) -> Base:
    # One thread: tiny matrices gain nothing from two, and a shared machine makes two-thread barriers slow.
    # Deposit, reference and every graft run under the same settings, as the exactness claim requires.
    be = load_backend("transformers", source=model, determinism=Determinism(threads=1))
    n = PREFIX[model]
    prefix = [2] + [4 + (37 * i + 11) % 250 for i in range(n - 1)]
    suffix = [4 + (53 * i + 7) % 250 for i in range(SUFFIX)]
    snap = be.deposit(prefix, extra={"fuzz": model})
    data = to_bytes(snap)
    ref = logits_sha256(reference_logits(be, prefix, suffix))
    got = logits_sha256(graft_logits(be, prefix, suffix, _measured(from_bytes(data), snap)).logits)
    base = Base(model, be, data, prefix, suffix, ref, {}, {}, b"")
    if got != ref or logits_sha256(graft_and_continue(base, _measured(from_bytes(data), snap))) != ref:
        raise SystemExit(f"{model}: the original artifact does not graft exactly ({got[:12]} != {ref[:12]}); "
                         "fuzzing it would be meaningless")
    hlen = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + hlen])
    meta = json.loads(header["__metadata__"]["kvgraft"])
    return Base(model, be, data, prefix, suffix, ref, header, meta, data[8 + hlen :])


# ------------------------------------------------------------------------------------------ mutations
def _canon(obj: object) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def assemble(header: dict, body: bytes, meta: dict | None = None, meta_text: str | None = None) -> bytes:
    """safetensors bytes from a header dict (its order kept) and a data buffer; the kvgraft metadata replaced by
    `meta` (canonical JSON) or by `meta_text` verbatim when given."""
    header = json.loads(json.dumps(header))
    if meta is not None or meta_text is not None:
        header["__metadata__"]["kvgraft"] = meta_text if meta_text is not None else _canon(meta)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)
    return len(text).to_bytes(8, "little") + text + body


def _leaves(obj: object, path: tuple = ()) -> list[tuple]:
    """Paths to every scalar leaf of a JSON value."""
    if isinstance(obj, dict):
        return [p for k, v in obj.items() for p in _leaves(v, path + (k,))]
    if isinstance(obj, list):
        return [p for i, v in enumerate(obj) for p in _leaves(v, path + (i,))]
    return [path]


def _get(obj: object, path: tuple) -> object:
    for k in path:
        obj = obj[k]
    return obj


def _set(obj: object, path: tuple, value: object) -> None:
    for k in path[:-1]:
        obj = obj[k]
    obj[path[-1]] = value


def _number_like(rng: random.Random, v: object) -> object:
    base = v if isinstance(v, int) and not isinstance(v, bool) else 1
    return rng.choice([0, 1, -1, base + 1, base - 1, base * 2, 15, 16, 17, 39, 41, 60, 1000, 2**31, 2**53 + 1,
                       2**64, 10**400, True, False, 1.5, 1e308, None, "1", [base], {"n": base}])


def _string_like(rng: random.Random, v: object) -> object:
    s = v if isinstance(v, str) else "x"
    flipped = s[:-1] + rng.choice(_HEX.replace(s[-1:], "") or "0") if s else "0"
    return rng.choice(["float32", "bfloat16", "float16", "int32", "F32", "full", "sliding", "eager", "sdpa",
                       "", "x" * 5000, flipped, s.upper(), hashlib.sha256(s.encode()).hexdigest(), 0, None, [s]])


def mutate(rng: random.Random, b: Base) -> tuple[bytes, str, bool]:
    """(mutant bytes, what was done, whether it is a consistent forgery)."""
    data, hlen = b.data, 8 + int.from_bytes(b.data[:8], "little")
    kind = rng.choices(["flip", "truncate", "insert", "delete", "meta", "targeted", "st_header", "forgery"],
                       weights=[18, 6, 6, 5, 25, 25, 10, 5])[0]
    aim = (lambda: rng.randrange(hlen)) if rng.random() < 0.6 else (lambda: rng.randrange(len(data)))
    if kind == "flip":
        out = bytearray(data)
        spots = [aim() for _ in range(rng.choice([1, 1, 1, 2, 3]))]
        for p in spots:
            out[p] ^= 1 << rng.randrange(8)
        return bytes(out), f"flip bits at {spots}", False
    if kind == "truncate":
        n = rng.choice([rng.randrange(hlen + 1), rng.randrange(len(data)), len(data) - 1, 7, 8])
        return data[:n], f"truncate to {n}", False
    if kind == "insert":
        p, junk = aim(), bytes(rng.randrange(256) for _ in range(rng.choice([1, 2, 8, 16])))
        return data[:p] + junk + data[p:], f"insert {len(junk)} bytes at {p}", False
    if kind == "delete":
        p = aim()
        n = rng.choice([1, 2, 8])
        return data[:p] + data[p + n :], f"delete {n} bytes at {p}", False
    if kind == "meta":
        return _meta_edit(rng, b)
    if kind == "targeted":
        return _targeted(rng, b)
    if kind == "st_header":
        return _st_header_edit(rng, b)
    return _forgery(rng, b)


def _meta_edit(rng: random.Random, b: Base) -> tuple[bytes, str, bool]:
    meta = json.loads(json.dumps(b.meta))
    path = rng.choice(_leaves(meta))
    old = _get(meta, path)
    new = _number_like(rng, old) if isinstance(old, int | float) or old is None else _string_like(rng, old)
    _set(meta, path, new)
    return assemble(b.header, b.body, meta), f"meta {'.'.join(map(str, path))}: {old!r:.40} -> {new!r:.40}", False


def _targeted(rng: random.Random, b: Base) -> tuple[bytes, str, bool]:
    meta, header = json.loads(json.dumps(b.meta)), json.loads(json.dumps(b.header))
    n_layers = len(meta["layers"])
    i = rng.randrange(n_layers)
    what = rng.randrange(14)
    if what == 0:  # finding 1: cumulative_length
        v = rng.choice([0, 15, 16, 39, 41, 60, 1000, meta["token_count"] + 1, meta["token_count"] - 1])
        i = 0 if rng.random() < 0.5 else i  # layer 0's is the length the cache reports (get_seq_length)
        meta["layers"][i]["cumulative_length"] = v
        return assemble(header, b.body, meta), f"layers[{i}].cumulative_length -> {v}", False
    if what == 1:  # finding 1: values dtype F32 -> I32 (bytes untouched), optionally the metadata too
        tag = rng.choice(["I32", "F16", "BF16", "I64", "F64", "U8", "BOOL"])
        part = rng.choice(["keys", "values"])
        header[f"layers.{i}.{part}"]["dtype"] = tag
        if rng.random() < 0.5:
            meta["layers"][i]["dtype"] = {"I32": "int32", "F16": "float16", "BF16": "bfloat16"}.get(tag, "int64")
        return assemble(header, b.body, meta), f"layers.{i}.{part} dtype -> {tag}", False
    if what == 2:  # finding 2: determinism fields
        field, value = rng.choice([("prefill_chunk", 7), ("prefill_chunk", 0), ("attn_implementation", "eager"),
                                   ("threads", 1), ("threads", 4), ("deterministic_algorithms", False),
                                   ("dtype", "bfloat16"), ("threads", True), ("extra_setting", 1)])
        meta["determinism"][field] = value
        return assemble(header, b.body, meta), f"determinism.{field} -> {value!r}", False
    if what == 3:  # finding 3: tokens_sha256 lie (alone, or with the tensor digest too)
        other = hashlib.sha256(torch.tensor([2, 9, 9], dtype=torch.int64).numpy().tobytes()).hexdigest()
        meta["tokens_sha256"] = other
        if rng.random() < 0.5:
            meta["tensor_sha256"]["token_ids"] = other
        return assemble(header, b.body, meta), "tokens_sha256 -> another sequence's", False
    if what == 4:  # finding 4: swapped shape dims, in the safetensors header and (or not) the metadata
        shape = header[f"layers.{i}.keys"]["shape"]
        a, c = rng.sample(range(4), 2)
        shape[a], shape[c] = shape[c], shape[a]
        for part in ("keys", "values"):
            header[f"layers.{i}.{part}"]["shape"] = list(shape)
        if rng.random() < 0.7:
            meta["layers"][i]["shape"] = list(shape)
        return assemble(header, b.body, meta), f"layers.{i} shape dims {a}<->{c} -> {shape}", False
    if what == 5:  # finding 4: a token_count that is a list, deep JSON, huge numbers
        field = rng.choice(["token_count", "start_position", "extra"])
        if field == "extra":  # nesting written as text: building it as Python objects would itself recurse
            depth = rng.choice([9, 50, 5000, 100000])
            meta["extra"] = {"deep": "__DEEP__"}
            text = _canon(meta).replace('"__DEEP__"', "[" * depth + "1" + "]" * depth)
            return assemble(header, b.body, meta_text=text), f"extra.deep nested {depth} levels", False
        v = rng.choice([[meta["token_count"]], 2**70, -1, "24", 1e999])
        meta[field] = v
        text = _canon(meta) if not (isinstance(v, float) and v != v) else None
        return assemble(header, b.body, meta_text=text), f"{field} -> {str(v)[:20]}", False
    if what == 6:  # window / kind
        lm = meta["layers"][i]
        lm["kind"], lm["window"] = rng.choice([("sliding", 16), ("sliding", 2), ("sliding", 1), ("sliding", 40),
                                               ("full", None), ("full", 16), ("sliding", None), ("chunked", 16)])
        return assemble(header, b.body, meta), f"layers[{i}] -> {lm['kind']}/{lm['window']}", False
    if what == 7:  # start position
        v = rng.choice([1, 16, 2**31 - 1, 2**31, -5])
        meta["start_position"] = v
        return assemble(header, b.body, meta), f"start_position -> {v}", False
    if what == 8:  # remove / add a field
        if rng.random() < 0.5:
            key = rng.choice(sorted(meta))
            del meta[key]
            return assemble(header, b.body, meta), f"remove field {key}", False
        meta[rng.choice(["note", "format2", "layers_extra"])] = 1
        return assemble(header, b.body, meta), "add an unknown field", False
    if what == 9:  # non-canonical spellings of the same metadata
        text = rng.choice([json.dumps(b.meta, sort_keys=True), json.dumps(b.meta),
                           _canon(b.meta).replace('"format"', '"format":"x","format"', 1),
                           _canon(b.meta).replace(":24,", ":24.0,", 1), " " + _canon(b.meta)])
        return assemble(header, b.body, meta_text=text), "non-canonical metadata text", False
    if what == 10:  # NaN / Infinity / duplicate keys in the safetensors header
        raw = assemble(header, b.body)
        hl = int.from_bytes(raw[:8], "little")
        text = raw[8 : 8 + hl].decode()
        text = rng.choice([text.replace('"shape":[1', '"shape":[NaN', 1),
                           text.replace('{"__metadata__"', '{"x":Infinity,"__metadata__"', 1),
                           text.replace('{"__metadata__"', '{"token_ids":1,"__metadata__"', 1)]).encode()
        text += b" " * (-(8 + len(text)) % 8)
        return len(text).to_bytes(8, "little") + text + b.body, "NaN/Infinity/duplicate key in header", False
    if what == 11:  # model / tokenizer fingerprint
        field = rng.choice(["model_fingerprint", "tokenizer_fingerprint"])
        meta[field] = "0" * 64
        return assemble(header, b.body, meta), f"{field} -> zeros", False
    if what == 12:  # neutral fields (must be admitted and exact)
        field = rng.choice(["model_name", "environment", "extra"])
        meta[field] = {"model_name": "renamed", "environment": {"torch": "0.0"}, "extra": {"k": "v"}}[field]
        return assemble(header, b.body, meta), f"neutral field {field} edited", False
    layers = meta["layers"]  # 13: drop a layer consistently from metadata, header and sums
    del layers[-1]
    return assemble(header, b.body, meta), "one layer dropped from the metadata", False


def _st_header_edit(rng: random.Random, b: Base) -> tuple[bytes, str, bool]:
    header = json.loads(json.dumps(b.header))
    names = [k for k in header if k != "__metadata__"]
    name = rng.choice(names)
    e = header[name]
    what = rng.randrange(6)
    if what == 0:
        j = rng.randrange(2)
        e["data_offsets"][j] += rng.choice([-8, -4, -1, 1, 4, 8, 10**6])
        desc = f"{name} data_offsets[{j}] moved"
    elif what == 1:
        e["shape"][rng.randrange(len(e["shape"]))] = rng.choice([0, 2, 3, 8, 10**9, -1])
        desc = f"{name} shape -> {e['shape']}"
    elif what == 2:
        e["dtype"] = rng.choice(["I32", "F16", "BF16", "I64", "F64", "U8", "BOOL", "F8_E4M3", "X"])
        desc = f"{name} dtype -> {e['dtype']}"
    elif what == 3:
        del header[name]
        desc = f"{name} removed"
    elif what == 4:
        header["layers.99.keys"] = dict(e)
        desc = "unknown tensor entry added"
    else:
        header = {k: header[k] for k in reversed(list(header))}
        desc = "header keys reversed"
    return assemble(header, b.body), desc, False


def _forgery(rng: random.Random, b: Base) -> tuple[bytes, str, bool]:
    """Consistent forgeries: tensors rewritten and every digest recomputed (by to_bytes). Out of scope."""
    snap = from_bytes(bytearray(b.data))
    what = rng.randrange(3)
    i = rng.randrange(len(snap.layers))
    if what == 0:
        t = snap.layers[i].keys if rng.random() < 0.5 else snap.layers[i].values
        t.view(-1)[rng.randrange(t.numel())] += 1.0
        desc = f"layer {i} tensor element changed, digests recomputed"
    elif what == 1:
        j = rng.randrange(len(snap.layers))
        a, c = snap.layers[i], snap.layers[j]
        if a.keys.shape == c.keys.shape:
            a.keys, c.keys = c.keys, a.keys
        desc = f"layers {i} and {j} keys swapped, digests recomputed"
    else:
        snap.token_ids[rng.randrange(1, len(snap.token_ids))] += 1
        desc = "a token id changed, tokens_sha256 recomputed"
    return to_bytes(snap), desc, True


# ------------------------------------------------------------------------------------------ running
def _measured(parsed, captured):
    """`parsed` (from_bytes: no numerics record) with the record of the capture it was written from."""
    parsed.numerics = captured.numerics
    return parsed


def _with_record(snap, fingerprint: str):
    """`snap` with an in-memory numerics record naming `fingerprint` (the fuzz's own claim: never written)."""
    snap.numerics = NumericsRecord((fingerprint,), "the fuzz: the original's capture, attached in memory")
    return snap


def graft_and_continue(b: Base, snap) -> torch.Tensor:
    """Graft as the harness does and run the suffix from where the cache says it is (cache.get_seq_length(),
    which a sliding layer derives from its cumulative_length): the suffix logits (1, SUFFIX, vocab)."""
    cache = b.be.graft(snap, token_ids=b.prefix + b.suffix)
    return b.be.forward(b.suffix, cache)


def run_one(b: Base, mutant: bytes, store, local: LocalStore | None) -> str:
    """The outcome class of one mutant (see the module docstring)."""
    try:
        try:
            aid = store.put_bytes(mutant)
        except KVStoreError as e:
            outcome = f"refused_admission:{type(e).__name__}"
            if local is not None:
                try:
                    local.put_bytes(mutant)
                    return "store_disagreement"
                except KVStoreError:
                    pass
            return outcome
        if local is not None:
            local.remove(local.put_bytes(mutant))
        try:
            # the mutant read back carries the original capture's numerics record, attached in memory only (the
            # mutations are of the format, and admission's numerics check would otherwise refuse every mutant first;
            # a store never records a numerics record it did not measure: issue 61)
            logits = graft_and_continue(b, _with_record(store.get(aid), b.be.numerics()))
        except KVStoreError as e:
            return f"refused_graft:{type(e).__name__}"
        finally:
            store.remove(aid)
        return "admitted_exact" if logits_sha256(logits) == b.ref_sha else "silent_wrong"
    except Exception as e:  # noqa: BLE001 - exactly what the fuzz is looking for
        return f"foreign:{type(e).__name__}: {str(e)[:120]}"


def fuzz(mutants: int, seed: int = 0, models: tuple[str, ...] = MODELS, local_every: int = 10,
         deadline_s: float | None = None, progress: bool = False) -> dict:
    """Run `mutants` mutants (spread over the models); returns the summary dict. Stops early at deadline_s."""
    bases = [make_base(m) for m in models]
    counts: Counter[str] = Counter()
    forgeries: Counter[str] = Counter()
    examples: dict[str, list[str]] = {}
    store = MemoryStore()
    t0 = time.perf_counter()
    done = 0
    with tempfile.TemporaryDirectory(prefix="kvgraft-fuzz-") as tmp:
        local = LocalStore(Path(tmp) / "store")
        for i in range(mutants):
            if deadline_s is not None and time.perf_counter() - t0 > deadline_s:
                break
            b = bases[i % len(bases)]
            rng = random.Random(f"{seed}:{i}")
            mutant, desc, forged = mutate(rng, b)
            outcome = run_one(b, mutant, store, local if i % local_every == 0 else None)
            if forged:
                forgeries[outcome.split(":")[0]] += 1
                outcome = "forgery"
            counts[outcome.split(":")[0] if outcome.startswith("foreign") else outcome] += 1
            ex = examples.setdefault(outcome.split(":")[0], [])
            if len(ex) < 3:
                ex.append(f"#{i} {b.model}: {desc} -> {outcome}")
            done += 1
            if progress and done % 1000 == 0:
                rate = done / (time.perf_counter() - t0)
                print(f"{done} mutants, {rate:.0f}/s, silent_wrong={counts['silent_wrong']} "
                      f"foreign={counts['foreign']}", file=sys.stderr, flush=True)
        gc_report = local.gc()
    elapsed = time.perf_counter() - t0
    refused = {k: v for k, v in sorted(counts.items()) if k.startswith("refused")}
    return {
        "mutants": done,
        "seed": seed,
        "models": list(models),
        "admitted_exact": counts["admitted_exact"],
        "refused_total": sum(refused.values()),
        "refused": refused,
        "silent_wrong": counts["silent_wrong"],
        "foreign": counts["foreign"],
        "store_disagreement": counts["store_disagreement"],
        "forgery": dict(sorted(forgeries.items())),
        "gc_after": {k: (len(v) if isinstance(v, list) else v) for k, v in gc_report.items()},
        "elapsed_s": round(elapsed, 1),
        "mutants_per_s": round(done / elapsed, 1) if elapsed else None,
        "machine": {"cpu": f"{cpu_name()} ({os.cpu_count()} logical cores)", "torch_threads": torch.get_num_threads(),
                    "python": platform.python_version()},
        "examples": examples,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mutants", type=int, default=100_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated tiny models")
    p.add_argument("--out", type=Path, default=Path("runs/fuzz"), help="folder for summary.json")
    p.add_argument("--deadline-s", type=float, default=None, help="stop after this many seconds")
    args = p.parse_args(argv)
    summary = fuzz(args.mutants, args.seed, tuple(args.models.split(",")), deadline_s=args.deadline_s,
                   progress=True)
    atomic_write(args.out / "summary.json", (json.dumps(summary, indent=2) + "\n").encode())
    print(json.dumps(summary, indent=2))
    return 0 if summary["silent_wrong"] == 0 and summary["foreign"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
