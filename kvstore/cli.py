"""The `kvstore` command: deposit, list, inspect, verify and remove KV artifacts in a local store.

    kvstore [--store DIR] [--model SOURCE] deposit --text "..." [--tag T ...]   # prints the artifact id
    kvstore deposit --backend llamacpp --setting n_ctx=8192 --text "..."          # any registered backend
            [--attn-implementation eager] [--dtype bfloat16] [--threads N] [--prefill-chunk N] [--profile P]
            [--batch-invariant]                                       # the batch-invariant mode (the exact default)
    kvstore reverify ID ...    # recompute with the artifact's own backend, model and recorded settings (the mode
                               # included), compare bytes, record the numerics measured; a contradicting flag refused
    kvstore ls [--tag T] [--json]
    kvstore show ID [--json]
    kvstore verify [ID ...]          # all artifacts when no id is given; exit 1 if any is damaged
    kvstore rm ID
    kvstore gc
    kvstore export (ID ... | --tag T) [--attach FILE ...] -o BUNDLE   # artifacts (+ opaque files) as one file
    kvstore import BUNDLE [--attachments-dir DIR]   # verify every byte, then add all or nothing
    (a solution library: python -m harness.library.bundle export|import, harness/library/bundle.py)

The store defaults to $KVGRAFT_STORE or runs/store; the model to the bundled Gemma 3 270M. Ids may be
abbreviated to a unique prefix of at least 8 hex digits. Every failure prints one line, `kvstore: error: ...`, and
exits 2; KVGRAFT_DEBUG=1 prints the full traceback as well. A model kvgraft cannot capture exactly is refused at
deposit in one line naming the layer (docs/exactness.md).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import traceback
from dataclasses import asdict
from pathlib import Path

from kvstore.backends.transformers.model import BUNDLED, layout_string
from kvstore.determinism import ATTN_IMPLEMENTATIONS
from kvstore.errors import InvalidIdError, KVStoreError, NotFoundError
from kvstore.format.artifact import read_metadata
from kvstore.format.ids import ArtifactId
from kvstore.store.local import LocalStore
from kvstore.store.open import open_store

MIN_PREFIX = 8
_EPILOG = (f"Ids may be abbreviated to a unique prefix of at least {MIN_PREFIX} hex digits.\nExit status: 0 ok, "
           "1 an artifact failed verification (verify, gc), 2 error.")


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 verification failed, 2 error)."""
    args = _parser().parse_args(argv)
    debug = os.environ.get("KVGRAFT_DEBUG", "") not in ("", "0")
    try:
        return args.run(args)
    except (KVStoreError, OSError) as e:
        if debug:
            traceback.print_exc()
        print(f"kvstore: error: {_one_line(str(e))}", file=sys.stderr)
        return 2
    except Exception as e:  # a failure kvstore did not name: still one line, the traceback on request
        if debug:
            traceback.print_exc()
        print(f"kvstore: error: {type(e).__name__}: {_one_line(str(e))} (an unexpected failure; run with "
              "KVGRAFT_DEBUG=1 for the traceback)", file=sys.stderr)
        return 2


def _one_line(text: str) -> str:
    lines = [x.strip() for x in text.strip().splitlines() if x.strip()]
    return _printable(" ".join(lines) if len(lines) <= 3 else lines[0] + " ...")


def _printable(text: str) -> str:
    """`text` with control characters (ANSI escapes from a forged row or file name) shown escaped, not obeyed."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvstore", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_EPILOG)
    _global_options(p, top=True)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    d = _command(sub, "deposit", "prefill a token sequence and store its KV cache")
    src = d.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="text to encode with the model's tokenizer (a BOS token is prepended)")
    src.add_argument("--text-file", type=Path, metavar="F", help="read the text from a UTF-8 file")
    src.add_argument("--token-ids", metavar="1,2,3", help="comma-separated token ids, used as given")
    src.add_argument("--token-ids-file", type=Path, metavar="F.json", help="a JSON list of token ids")
    d.add_argument("--tag", action="append", default=[], metavar="T", help="tag the artifact (repeatable)")
    _backend_options(d)
    d.set_defaults(run=_deposit)

    rv = _command(sub, "reverify", "re-verify artifacts' numerics by reproduction: recompute each prefix here, "
                                   "compare the bytes, record the numerics measured when they are equal")
    rv.add_argument("ids", nargs="+", metavar="ID", help="artifacts to re-verify (ids or unique prefixes)")
    _backend_options(rv)
    rv.set_defaults(run=_reverify)

    ls = _command(sub, "ls", "list artifacts")
    ls.add_argument("--tag", metavar="T", help="only artifacts with this tag")
    ls.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ls.set_defaults(run=_ls)

    sh = _command(sub, "show", "print an artifact's metadata")
    sh.add_argument("id", metavar="ID")
    sh.add_argument("--json", action="store_true", help="print JSON")
    sh.set_defaults(run=_show)

    v = _command(sub, "verify", "re-hash artifacts' bytes and tensors")
    v.add_argument("ids", nargs="*", metavar="ID", help="artifacts to check (default: all)")
    v.set_defaults(run=_verify)

    rm = _command(sub, "rm", "remove an artifact")
    rm.add_argument("id", metavar="ID")
    rm.set_defaults(run=_rm)

    gc = _command(sub, "gc", "drop temp files and stale index rows, index stray objects")
    gc.set_defaults(run=_gc)
    _bundle_commands(sub)
    return p


def _backend_options(d: argparse.ArgumentParser) -> None:
    """The backend and determinism options of the commands that compute (deposit, reverify)."""
    d.add_argument("--backend", default=None, metavar="NAME",
                   help="the engine that computes it (kvstore.backends: transformers, the default; llamacpp; fake); "
                        "reverify: the artifact's own")
    d.add_argument("--setting", action="append", default=[], metavar="KEY=VALUE",
                   help="a setting of a backend other than transformers (its Settings dataclass), e.g. n_ctx=8192 "
                        "or gguf=/models/x.gguf; VALUE is read as JSON when it parses (repeatable)")
    d.add_argument("--profile", default=None, choices=["native", "portable"],
                   help="determinism.profile: the kernel paths (kvstore/environment.py; default native)")
    d.add_argument("--batch-invariant", action="store_true", default=None,
                   help="determinism.batch_invariant: the batch-invariant mode (the harness's exact default; "
                        "transformers on CPU, float32)")
    d.add_argument("--attn-implementation", choices=list(ATTN_IMPLEMENTATIONS), default=None,
                   help="determinism.attn_implementation (default sdpa; some architectures need eager)")
    d.add_argument("--dtype", default=None, help="determinism.dtype: float32 (default), bfloat16 or float16")
    d.add_argument("--threads", type=int, default=None, help="determinism.threads (default 2)")
    d.add_argument("--prefill-chunk", type=int, default=None, metavar="N",
                   help="determinism.prefill_chunk: tokens per prefill pass (default 512; 0 = all at once)")


def _command(sub, name: str, help: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".")
    _global_options(p, top=False)
    return p


def _global_options(p: argparse.ArgumentParser, top: bool) -> None:
    """--store and --model, accepted before or after the subcommand. A subcommand's copies default to
    SUPPRESS so that they do not overwrite a value given before the subcommand."""
    store = os.environ.get("KVGRAFT_STORE", "runs/store")
    p.add_argument("--store", metavar="DIR", default=store if top else argparse.SUPPRESS,
                   help=f"store directory (default: $KVGRAFT_STORE or runs/store; now {store})")
    p.add_argument("--model", metavar="SOURCE", default=None if top else argparse.SUPPRESS,
                   help=f"model for deposit: {BUNDLED} (default), tiny-gemma3, tiny-llama or a local HF folder; "
                        "reverify: the artifact's own (its recorded name, checked against its fingerprint)")


def resolve_id(store: LocalStore, given: str) -> ArtifactId:
    """A full id as is; a prefix of >= 8 hex digits resolved against the store's index."""
    text = given.strip().lower()
    if len(text) == 64:
        return ArtifactId(text)
    if len(text) < MIN_PREFIX or not set(text) <= set("0123456789abcdef"):
        raise InvalidIdError(f"{given!r} is not an artifact id or a prefix of at least {MIN_PREFIX} hex digits")
    matches = [i.id for i in store.list() if i.id.startswith(text)]
    if not matches and hasattr(store, "unindexed"):  # an object whose row is missing or damaged (`kvstore rm` it)
        matches = [a for a in store.unindexed() if a.startswith(text)]
    if not matches:
        raise NotFoundError(f"no artifact id starts with {text} in store {store.root} (see `kvstore ls`)")
    if len(matches) > 1:
        shown = ", ".join(m[:16] for m in matches[:5])
        raise InvalidIdError(f"prefix {text} is ambiguous: {len(matches)} artifacts match ({shown}); give more digits")
    return ArtifactId(matches[0])


def _store(args) -> LocalStore:
    return open_store(args.store)  # a folder, or s3://BUCKET/PREFIX (docs/scale-out.md)


def _token_ids(args, be) -> tuple[list[int], dict]:
    """The tokens to deposit and the caller-owned `extra` metadata recording where they came from."""
    if args.text is not None or args.text_file is not None:
        text = args.text if args.text is not None else args.text_file.read_text(encoding="utf-8")
        return be.encode(text), {"text_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest()}
    if args.token_ids is not None:
        try:
            ids = [int(x) for x in args.token_ids.split(",") if x.strip()]
        except ValueError:
            raise KVStoreError(f"--token-ids {args.token_ids!r}: give comma-separated integers, e.g. 2,105") from None
    else:
        try:
            ids = json.loads(args.token_ids_file.read_text(encoding="utf-8"))
        except ValueError as e:
            raise KVStoreError(f"{args.token_ids_file}: not JSON ({e}); give a JSON list of token ids") from None
        if not isinstance(ids, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in ids):
            raise KVStoreError(f"{args.token_ids_file}: expected a JSON list of integers, e.g. [2, 105, 106]")
    vocab = be.vocab_size()
    bad = [x for x in ids if not 0 <= x < vocab]
    if bad:
        raise KVStoreError(f"token ids {bad[:5]} are outside the model's vocabulary [0, {vocab}); check the ids")
    return ids, {}


def flag_settings(args):
    """The settings of `args.backend` from the flags, built by its own Settings class (kvstore.settings_for, no
    backend named or guessed here): --model as the model's source, the determinism flags, and each --setting
    KEY=VALUE by name (VALUE as JSON when it parses, else a string)."""
    from kvstore.backends import settings_for
    from kvstore.backends.settings import ModelChoice
    from kvstore.determinism import Determinism

    named: dict = {}
    for item in args.setting:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise KVStoreError(f"--setting {item!r}: give KEY=VALUE, e.g. --setting n_ctx=8192")
        try:
            named[key] = json.loads(value)
        except ValueError:
            named[key] = value
    return settings_for(args.backend, ModelChoice(source=args.model or "", named=named,
                                                  determinism=Determinism(**determinism_options(args))))


def _deposit(args) -> int:
    from kvstore.backends import load_backend
    from kvstore.environment import enter_profile

    args.backend = args.backend or "transformers"
    enter_profile(args.profile or "native")  # re-executes with the profile's kernel variables when not set
    if os.environ.get("KVGRAFT_DEBUG", "") in ("", "0"):  # transformers' notes on fallback kernels are not ours
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    store = _store(args)
    be = load_backend(args.backend, **flag_settings(args).keywords())
    ids, extra = _token_ids(args, be)
    aid = store.put(be.deposit(ids, extra), tags=args.tag)
    print(f"deposited {len(ids)} tokens with {be.model_name} ({be.name}) into {store.root}", file=sys.stderr)
    print(aid)
    return 0


def _reverify(args) -> int:
    """Re-verify each artifact by reproduction (issue 51: absent evidence is not evidence): its token ids are
    prefilled again here from position 0 with its own `extra`, by its own backend, model and recorded settings (the
    mode included: issue 61), captured, and the bytes compared with the stored ones (their ids). A flag that
    contradicts the record, or a model whose fingerprint is not the recorded one, is refused naming both: nothing is
    recomputed. Equal: the recomputed snapshot is put, and its capture's measured numerics replace the artifact's
    record (a graft here then admits it). Other bytes: nothing is recorded, exit 1: the artifact is not this
    machine's."""
    from kvstore.backends import load_backend
    from kvstore.environment import enter_profile
    from kvstore.format.artifact import to_bytes

    store = _store(args)
    ids = [resolve_id(store, i) for i in args.ids]
    plans = {aid: _recorded_plan(args, aid, read_metadata(store.get_bytes(aid))) for aid in ids}
    profiles = sorted({plan[2] for plan in plans.values()})
    if len(profiles) > 1:
        raise KVStoreError(f"the artifacts were computed under profiles {profiles}; one process runs one profile: "
                           "re-verify them in one call per profile")
    enter_profile(profiles[0])  # the record's kernel paths (re-executes when they are not in force)
    loaded: dict[str, object] = {}
    failed = 0
    for aid in ids:
        name, settings, _profile, meta = plans[aid]
        key = json.dumps([name, repr(settings)])
        if key not in loaded:
            loaded[key] = load_backend(name, **settings)
        be = loaded[key]
        _check_recorded(be, aid, meta)
        snap = store.get(aid)
        if snap.start_position != 0:
            failed += 1
            print(f"REFUSED {aid}: it starts at position {snap.start_position}; only a prefix computed from position 0 "
                  "can be recomputed")
            continue
        fresh = be.deposit(snap.token_ids, snap.extra)
        again = ArtifactId.of(to_bytes(fresh))
        sha = be.numerics()
        if again != aid:
            failed += 1
            print(f"DIFFERS {aid}: recomputed here with its own model {be.model_name} ({be.name}) and recorded "
                  f"settings, its {snap.token_count} tokens give other bytes ({again[:12]}...): nothing recorded; "
                  "deposit it again here to graft it here")
        elif sha is None:
            print(f"SAME    {aid}: reproduced byte for byte; the {be.name} backend measures no numerics "
                  "fingerprint, so nothing is recorded")
        else:
            store.put(fresh)  # the same bytes: its capture's measured record replaces the stored one
            print(f"SAME    {aid}: reproduced byte for byte here; numerics:{sha[:16]} recorded (what was measured)")
    return 1 if failed else 0


def _recorded_plan(args, aid: str, meta: dict) -> tuple[str, dict, str, dict]:
    """(backend, its load_backend settings, profile, the record) for recomputing an artifact from its own record:
    the backend, the model and every pinned setting it recorded. A flag that says otherwise is refused naming both."""
    from kvstore.backends import settings_class, settings_for
    from kvstore.backends.settings import ModelChoice
    from kvstore.determinism import Determinism

    det = meta.get("determinism") if isinstance(meta.get("determinism"), dict) else {}
    name = det.get("backend", "transformers")
    if args.backend is not None and args.backend != name:
        raise KVStoreError(f"artifact {aid[:12]}: --backend {args.backend} contradicts its record (made by the {name} "
                           "backend); reverify recomputes with the artifact's own backend: drop --backend")
    if settings_class(name).pins_determinism():  # its recorded settings are a Determinism (transformers)
        if args.setting:
            raise KVStoreError(f"--setting is for backends other than {name}; reverify takes {name}'s settings from "
                               "the artifact's record")
        recorded = {k: v for k, v in det.items() if k != "backend"}
        try:
            determinism = Determinism.from_dict(recorded)
        except KVStoreError as e:
            raise KVStoreError(f"artifact {aid[:12]}: its recorded settings cannot be run here ({e})") from None
        given = {**determinism_options(args)}
        for key, value in given.items():
            have = getattr(determinism, key)
            if value != have:
                flag = "--" + key.replace("_", "-")
                raise KVStoreError(f"artifact {aid[:12]}: {flag} {value!r} contradicts its recorded determinism.{key} "
                                   f"{have!r}; reverify recomputes under the artifact's own settings: drop {flag}")
        source = args.model or meta.get("model_name") or BUNDLED
        choice = ModelChoice(source=source, determinism=determinism)
        return name, settings_for(name, choice).keywords(), determinism.profile, meta
    return name, flag_settings(argparse.Namespace(**{**vars(args), "backend": name})).keywords(), \
        str(det.get("profile", "native")), meta


def _check_recorded(be, aid: str, meta: dict) -> None:
    """Refuse (KVStoreError, one line naming both) a loaded backend whose model or pinned settings are not the
    artifact's record: recomputing under them would blame the bytes for a difference of the model or settings."""
    from kvstore.engine.admission import settings_differences

    if be.fingerprint != meta.get("model_fingerprint"):
        raise KVStoreError(f"artifact {aid[:12]}: computed with model {meta.get('model_name')!r} (fingerprint "
                           f"{str(meta.get('model_fingerprint'))[:12]}), the model loaded is {be.model_name!r} "
                           f"({be.fingerprint[:12]}); nothing recomputed: give --model with the artifact's own model")
    diffs = settings_differences(meta.get("determinism"), be.settings())
    if diffs:
        raise KVStoreError(f"artifact {aid[:12]}: the backend loaded runs other settings than the artifact records "
                           f"({'; '.join(diffs)}); nothing recomputed: give the recorded settings")


def determinism_options(args) -> dict:
    """The determinism settings given on the command line (--profile, --attn-implementation, --dtype, --threads,
    --prefill-chunk), as Determinism keyword arguments; the others keep their defaults."""
    given = {"profile": args.profile, "attn_implementation": args.attn_implementation, "dtype": args.dtype,
             "threads": args.threads, "prefill_chunk": args.prefill_chunk,
             "batch_invariant": getattr(args, "batch_invariant", None)}
    return {k: v for k, v in given.items() if v is not None}


def _ls(args) -> int:
    rows = _store(args).list(args.tag)
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=2))
        return 0
    if not rows:
        print("no artifacts" + (f" tagged {args.tag!r}" if args.tag else ""), file=sys.stderr)
        return 0
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table("id", "tokens", "size", "model", "tags")
    for r in rows:
        model = f"{r.model_fingerprint[:12]} {r.model_name}".strip()
        table.add_row(r.id[:16], str(r.token_count), _human(r.size), escape(_printable(model)),
                      escape(_printable(", ".join(r.tags))))  # rows and tags are data: never markup or escapes
    Console(soft_wrap=False).print(table)
    return 0


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _show(args) -> int:
    store = _store(args)
    aid = resolve_id(store, args.id)
    data = store.get_bytes(aid)  # re-hashes the whole file
    meta = read_metadata(data)
    try:
        tags = list(store.info(aid).tags)
    except KVStoreError:  # an object without a readable index row (`kvstore gc` indexes it)
        tags = []
    if args.json:
        print(json.dumps({"id": aid, "size": len(data), "tags": tags, "metadata": meta}, indent=2, sort_keys=True))
        return 0
    layers = meta["layers"]
    kinds = layout_string(layers)
    windows = sorted({x["window"] for x in layers if x["window"]})
    cached = [x["shape"][-2] for x in layers]
    shape = layers[0]["shape"] if layers else []
    lines = [
        ("id", aid),
        ("format", meta["format"]),
        ("size", f"{len(data)} bytes"),
        ("tags", ", ".join(tags) or "-"),
        ("model", meta.get("model_name") or "-"),
        ("tokens", str(meta["token_count"])),
        ("start position", str(meta["start_position"])),
        ("tokens sha256", meta["tokens_sha256"]),
        ("dtype", meta["dtype"]),
        ("layers", f"{len(layers)} ({kinds}; F full, S sliding or chunked"
                   + (f" window {', '.join(map(str, windows))}" if windows else "") + ")"),
        ("kv shape", f"(batch, kv_heads, cached, head_dim) = {tuple(shape)}; cached per layer {cached}"),
        ("model fingerprint", meta["model_fingerprint"]),
        ("tokenizer fingerprint", meta["tokenizer_fingerprint"]),
        ("environment", _kv(meta["environment"])),
        ("determinism", _kv(meta["determinism"])),
        ("numerics", _numerics_line(tags)),
    ]
    if meta.get("extra"):
        lines.append(("extra", _kv(meta["extra"])))
    width = max(len(k) for k, _ in lines)
    for k, v in lines:
        print(f"{k:<{width}}  {v}")
    return 0


def _numerics_line(tags: list[str]) -> str:
    """The artifact's numerics record in words: what a graft here is compared with (issue 51)."""
    fps = [t.split(":", 1)[1] for t in tags if t.startswith("numerics:")]
    if not fps:
        return "NOT RECORDED: a graft by a backend that measures numerics refuses it (`kvstore reverify ID`)"
    if len(fps) > 1:
        return (f"{len(fps)} fingerprints recorded ({', '.join(f[:16] for f in fps)}): refused at graft (forged or "
                "damaged)")
    return fps[0]


def _kv(d: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(d.items()))


def _verify(args) -> int:
    store = _store(args)
    ids = [resolve_id(store, i) for i in args.ids] if args.ids else [ArtifactId(i.id) for i in store.list()]
    unindexed = [] if args.ids else store.unindexed()  # objects no readable row lists: verified and named too
    if not ids and not unindexed:
        print(f"nothing to verify: store {store.root} is empty", file=sys.stderr)
        return 0
    failed = 0
    for aid in [*ids, *unindexed]:
        try:
            store.verify(aid)
            print(f"OK      {aid}" if aid in ids else
                  f"NO ROW  {aid}: bytes OK, but no readable index row (ls, tags and token lookups miss it)")
        except KVStoreError as e:
            failed += 1
            print(f"FAILED  {aid}: {_printable(str(e))}")
    if failed:
        print(f"{failed} of {len(ids) + len(unindexed)} artifacts failed verification; remove them (`kvstore rm ID`) "
              "and deposit them again", file=sys.stderr)
    if unindexed:
        print(f"{len(unindexed)} object(s) without a readable index row in {store.root}: run `kvstore gc` to index "
              "them", file=sys.stderr)
    return 1 if failed or unindexed else 0


def _rm(args) -> int:
    store = _store(args)
    aid = resolve_id(store, args.id)
    store.remove(aid)
    print(f"removed {aid}")
    return 0


def _gc(args) -> int:
    report = _store(args).gc()
    if "temp_removed" in report:  # a folder's own (an S3 or memory store has no temp files)
        print(f"temp files removed  {report['temp_removed']}")
        print(f"temp files kept     {report['temp_kept']} (younger than the grace period or held by a live writer)")
    print(f"index rows dropped  {report['rows_dropped']}")
    print(f"index rows repaired {len(report['rows_repaired'])} (said other facts than their object, or damaged)")
    for d in report["rows_repaired"]:
        print(f"  {_printable(d)}")
    print(f"objects indexed     {report['objects_indexed']}")
    if report["objects_indexed"]:  # their tags lived in the lost index rows: nothing in an object holds them
        print(f"  indexed WITHOUT TAGS: the library and numerics tags of these {report['objects_indexed']} were in "
              "the lost index rows, and nothing in an object holds them. A graft refuses an artifact with no numerics "
              "record until it is re-verified by recomputation here (`kvstore reverify ID`; rebuilding a library "
              "with `python -m harness.library` re-verifies and re-tags its entries)")
    print(f"damaged             {len(report['damaged'])}")
    for d in report["damaged"]:
        print(f"  {_printable(d)}")
    return 1 if report["damaged"] or report["rows_repaired"] else 0


# --------------------------------------------------------------------------------------------- export / import
# (kvstore/bundle/bundle.py; the bundle format is FORMAT.md section 7)


def _bundle_commands(sub) -> None:
    e = _command(sub, "export", "write artifacts (and opaque attached files) as one bundle file")
    e.add_argument("ids", nargs="*", metavar="ID", help="artifacts to export (ids or unique prefixes)")
    e.add_argument("--tag", metavar="T", help="export every artifact with this tag")
    e.add_argument("--attach", type=Path, action="append", default=[], metavar="FILE",
                   help="carry this file unchanged, under its file name (repeatable)")
    e.add_argument("-o", "--output", type=Path, required=True, metavar="BUNDLE", help="bundle file to write (new)")
    e.set_defaults(run=_export)

    i = _command(sub, "import", "verify a bundle completely, then add its artifacts to the store (all or nothing)")
    i.add_argument("bundle", type=Path, metavar="BUNDLE")
    i.add_argument("--attachments-dir", type=Path, metavar="DIR",
                   help="where to write the bundle's attached files, if it has any")
    i.set_defaults(run=_import)


def _export(args) -> int:
    from kvstore.bundle.bundle import export_bundle

    given = [x for x in (args.ids, args.tag) if x]
    if len(given) != 1:
        raise KVStoreError("kvstore export: give artifact ids or --tag (only one of them)" if given
                           else "kvstore export: nothing selected; give artifact ids or --tag")
    store = _store(args)
    ids = [resolve_id(store, i) for i in args.ids]
    if args.tag:
        ids = [ArtifactId(r.id) for r in store.list(args.tag)]
        if not ids:
            raise KVStoreError(f"nothing to export: no artifact tagged {args.tag!r} in {store.root} (see `kvstore ls`)")
    attachments = {}
    for f in args.attach:
        try:
            attachments[f.name] = f.read_bytes()
        except OSError as e:
            raise KVStoreError(f"kvstore export --attach {f}: cannot read it ({e}); give a readable file") from None
    info = export_bundle(store, ids, args.output, attachments=attachments)
    lib = f", attachments {', '.join(sorted(attachments))}" if attachments else ""
    print(f"exported {len(info.artifacts)} artifacts ({info.size} bytes{lib}) from {store.root} to {info.path}; "
          f"bundle sha256 {info.sha256}", file=sys.stderr)
    print(info.path)
    return 0


def _import(args) -> int:
    from kvstore.bundle.bundle import import_bundle

    store = _store(args)
    info = import_bundle(args.bundle, store, attachments_dir=args.attachments_dir)
    n, new = len(info.artifacts), len(info.added)
    print(f"imported {n} artifacts into {store.root}: {new} new, {n - new} already present "
          f"(bundle sha256 {info.sha256})")
    if info.claims:
        print(f"{len(info.claims)} numerics record(s) in the bundle are another machine's claim, not recorded here: a "
              "graft refuses those artifacts until `kvstore reverify ID` reproduces them here", file=sys.stderr)
    if info.attachments_dir is not None:
        print(f"attachments {', '.join(sorted(info.attachments))} written to {info.attachments_dir}")
    elif info.attachments:
        print(f"the bundle has attachments ({', '.join(sorted(info.attachments))}), not written: give "
              "--attachments-dir DIR to write them", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
