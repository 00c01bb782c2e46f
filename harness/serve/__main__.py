"""`python -m harness.serve --library FOLDER --retrieval recurring|held-out|random|none --backend B --server MODULE
[server args]` (`make serve LIBRARY=FOLDER RETRIEVAL=...`): audit the library for the served model, then run the
backend's server (`--server`: make serve gives kvstore's vLLM server) with LibraryMiddleware (harness.serve.middleware)
and the connector grafting only what a request names (`--graft marked`: the library decides what grafts). An unknown
RETRIEVAL, a missing or edited library, one of another model, or one whose artifacts are missing is one line, and no
server starts. RETRIEVAL=none is the backend's server without a library, as it is.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from harness.errors import ConfigError, exit_on_error
from harness.serve.library import RETRIEVAL_MODES, ServedLibrary, retrieval_settings
from harness.serve.middleware import ENV, INCONTEXT_SUFFIX
from harness.serve.supervise import supervise

MIDDLEWARE = "harness.serve.middleware.LibraryMiddleware"


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(prog="python -m harness.serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--library", default="", help="a library folder (the one holding manifest.json)")
    p.add_argument("--retrieval", default="recurring", help=f"one of {[*RETRIEVAL_MODES, 'none']}")
    p.add_argument("--prompt", default="answer", help="the harness's prompt config (configs/prompt/NAME.yaml)")
    p.add_argument("--store", default="runs/store")
    p.add_argument("--model", default="")
    p.add_argument("--model-name", default="gemma3-270m")
    p.add_argument("--journal", default="")
    p.add_argument("--library-override", action="append", default=[], metavar="library.KEY=VALUE",
                   help="a library config override where the library's own config (configs/library/<its name>.yaml "
                   "with the source its manifest records) is not the one it was built with: library.entry_template=...")
    p.add_argument("--backend", required=True, help="the registered backend whose server runs (make serve: its own)")
    p.add_argument("--server", required=True, help="the backend's server module (python -m SERVER; make serve: "
                   "kvstore's)")
    return p.parse_known_args(argv)


def _value(argv: list[str], flag: str) -> str | None:
    """The value of `flag` in `argv` (`--flag V` or `--flag=V`), or None."""
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def served_chat_template(argv: list[str], text: object) -> str:
    """The chat template the server applies (its --chat-template; else the one the backend's server applies by
    default, `served_chat_template()` of its text model: the model's own, or the one it gives a model that has none):
    a chat request's text as sent is its messages through it."""
    path = _value(argv, "--chat-template")
    if path:
        return Path(path).read_text(encoding="utf-8") if Path(path).is_file() else path
    for name in ("served_chat_template", "chat_template"):
        own = getattr(text, name, None)
        if callable(own):
            return str(own() or "")
    return ""


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    args, rest = parse(sys.argv[1:] if argv is None else argv)
    passed = ["--store", args.store, "--model-name", args.model_name] + (["--model", args.model] if args.model else [])
    passed += ["--journal", args.journal] if args.journal else []
    if "--" in rest:
        i = rest.index("--")
        rest, extra = rest[:i], rest[i + 1:]
    else:
        extra = []
    command = [sys.executable, "-m", args.server, *passed, *rest]
    if args.retrieval == "none":
        if args.library:
            raise ConfigError(f"RETRIEVAL=none serves no library, but LIBRARY={args.library} is given; drop one")
        return supervise(command + (["--", *extra] if extra else []))
    retrieval_settings(args.retrieval)  # an unknown name: one line
    if not args.library:
        raise ConfigError(f"RETRIEVAL={args.retrieval} needs LIBRARY=<library folder> (make library builds one)")
    from harness.config.schema import compose_config
    from kvstore import backend_missing, load_text_model

    missing = backend_missing(args.backend)
    if missing:
        raise ConfigError(f"the library-aware server runs backend {args.backend!r}, which this Python lacks "
                          f"({missing}); run it with that backend's Python (make serve does)")
    template = compose_config([f"prompt={args.prompt}"]).prompt.template
    text = load_text_model(args.backend, model=args.model, model_name=args.model_name)
    store = args.store if args.store.startswith("s3://") else str(Path(args.store).resolve())
    root = str(Path.cwd())
    served = ServedLibrary(args.library, store, args.retrieval, text, template, project_root=root,
                           overrides=args.library_override)
    served.audit()
    settings = {"library": str(Path(args.library).resolve()), "store": store, "retrieval": args.retrieval,
                "backend": args.backend, "chat_template": served_chat_template([*rest, *extra], text),
                "context": _value(rest, "--max-model-len") or _value(extra, "--max-model-len") or getattr(
                    text, "context", 0),
                "model": args.model, "model_name": args.model_name, "template": template, "project_root": root,
                "library_overrides": args.library_override,
                "journal": str(Path(args.journal).resolve()) if args.journal else ""}
    lib = served.library
    print(f"kvgraft serve: library {lib.path.name} ({len(lib.entries)} entries, audited: manifest, index, identity "
          f"and source, every artifact and its tokens), RETRIEVAL={args.retrieval}; graft: model "
          f"{args.model_name!r}, in-context control: model {args.model_name + INCONTEXT_SUFFIX!r}", flush=True)
    os.environ[ENV] = json.dumps(settings)
    return supervise(command + ["--graft", "marked", "--", *extra, "--middleware", MIDDLEWARE])


if __name__ == "__main__":
    sys.exit(main())
