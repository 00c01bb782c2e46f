"""Every shell command in README.md and docs/*.md runs as written, or is checked as far as it can be without a long
job, or names the test that runs it for real (issue 24). One test per command, named ``<file>:<line>``.

Which lines are commands (the rule; docs/extending.md repeats it):

- in a fenced block tagged ``bash``, ``sh``, ``shell`` or ``zsh``: every line that is not blank and not a comment;
- in any other fenced block (untagged, ``console``, ``text``: recorded sessions) that has a line starting with
  ``$ `` (after indentation): those lines, the ``$ `` dropped; the lines up to the next command are its output;
- in such a block without any ``$ `` line whose first line starts like a command (``COMMAND_HEAD``: make, python,
  .venv/bin/..., kvstore, pip, export, ray, optionally after ``NAME=value``): every line that starts like one
  (the others are output). Python blocks and other blocks are not commands;
- a line ending in ``\\`` continues on the next; a trailing ``# comment`` is dropped; leading ``NAME=value``
  assignments are the command's environment, and a line that is only ``NAME="..."`` defines ``$NAME`` for the
  file's later commands (``$PWD`` is the repository root);
- of a pipeline or ``cmd & cmd`` list the first command is checked; the others must be plain shell (``tail``,
  ``kill`` ...). Inline code in prose is not a command.

How each is checked (``check``), by what it runs:

- ``make TARGET [VAR=...]``: ``make -n`` knows the target, and each recipe line it prints that runs one of our
  entry points is checked as below (so ``ARGS`` is checked by the entry point that gets it). ``make rescore`` of
  a run folder also runs for real, on a hand-built run folder (tests/harness/fakerun.py);
- ``python -m harness[.compare|.library] OVERRIDES``: every override composes (``harness.config.schema.compose_config``;
  each value of a sweep in turn); a ``hydra/launcher`` that needs an extra must be named in pyproject.toml's
  extras. An override that does not compose passes only if the doc shows, as the next line, exactly the
  ``error:`` line the entry point prints for it;
- ``python -m scripts.X`` (or ``python scripts/X.py``) / ``python -m harness.compare.report|harness.tracking.server|pytest``:
  the script exists and every
  ``--flag`` is listed by its ``--help`` (all ``--help`` pages are read in one subprocess); a run-folder path
  has the shape of one (``runs/<condition>/<stamp>[-label]``, ``runs/compare/<stamp>`` ...);
- ``kvstore [--store S] [--model M] COMMAND ...``: a command of ``kvstore --help``, flags of its own ``--help``;
  ``ls``, ``verify`` and ``show`` on a local store also run for real (``kvstore.cli.main``) on a small store;
- ``pip install torch==V``: V is the pin in constraints.txt or make setup's; ``source F``: F exists; ``ray``: installed;
- ``RAN_BY``: commands that cannot be checked from their text (placeholders, a session by hand) name the test
  that runs them; the test must exist.

Anything else fails with its file and line: add a checker or a RAN_BY entry.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_TAGS = {"bash", "sh", "shell", "zsh"}
PLAIN_SHELL = {"ls", "export", "cd", "tail", "head", "kill", "sleep", "cat", "echo", "wc", "grep"}
PYTHON = re.compile(r"(\.venv[\w-]*/bin/)?python3?")  # python, .venv/bin/python, .venv-audit/bin/python
HARNESS_ENTRY_POINTS = {"harness", "harness.compare", "harness.library"}
ARGPARSE_MODULES = {"harness.compare.report", "harness.export", "harness.tracking.server", "kvstore.backends.packaged",
                    "kvstore.backends.vllm.serve"}
#: flags an entry point takes besides overrides
HARNESS_FLAGS = {"harness": {"-m", "--multirun"}, "harness.library": {"--redeposit"}, "harness.compare": set()}
#: kvstore's global options that take a value
KVSTORE_GLOBALS = {"--store", "--model"}
#: Hydra launchers that come from an extra in pyproject.toml rather than configs/hydra/launcher/
LAUNCHER_EXTRAS = {"submitit_slurm": ("cluster", "hydra-submitit-launcher"),
                   "submitit_local": ("cluster", "hydra-submitit-launcher")}
STAMP = r"\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d(-\d{6})?(-[a-z_]+)?(-\d+)?"
RUN_PATH = re.compile(r"(.*/)?runs/(baseline|graft|incontext|compare|multirun)/(?P<rest>[^/]+)(/.*)?")

#: Commands checked only by the test that runs them (normalised text -> "tests/file.py::test_name").
RAN_BY = {
    "python -m harness model=tiny_gemma3 dataset.limit=6 decoding=sample decoding.n_samples=2 ... & kill -TERM $!":
        "tests/harness/test_lifecycle.py::test_sigterm_stops_between_rows_with_one_line_and_a_resumable_folder",
    "python -m harness <same overrides>":
        "tests/harness/test_lifecycle.py::test_sigterm_stops_between_rows_with_one_line_and_a_resumable_folder",
    "PYTHONPATH=. .venv-lmeval/bin/lm-eval run --include_path harness/task/lmeval --tasks kvgraft_original --model "
    "local-completions --model_args model=gemma3-270m,base_url=http://127.0.0.1:8000/v1/completions,num_concurrent=1,"
    "max_retries=1,tokenized_requests=False,tokenizer_backend=None --output_path runs/lmeval/graft --log_samples":
        "tests/harness/test_lmeval_serve.py::test_lmeval_through_the_server_equals_the_harness_runs_sample_by_sample",
    "python -m scripts.lmeval_compare --lmeval runs/lmeval/graft --run runs/graft/<stamp>-held_out":
        "tests/harness/test_lmeval_serve.py::test_lmeval_through_the_server_equals_the_harness_runs_sample_by_sample",
    ".venv-audit/bin/python -m scripts.rescore runs/compare/<stamp>":
        "tests/harness/test_rescore_fresh_venv.py::test_a_fresh_venv_with_only_the_audit_extra_rescores_a_run",
}


@dataclass(frozen=True)
class Command:
    file: str  # relative to the repository root
    line: int
    text: str  # as written, continuations joined, `$ ` dropped
    output: tuple[str, ...] = ()  # the recorded lines that follow it (untagged blocks)
    variables: dict[str, str] = field(default_factory=dict, hash=False)  # NAME="..." lines before it in the file

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


#: How a command line of a block without `$ ` starts (an untagged block whose first line is one is a command block)
COMMAND_HEAD = re.compile(r"([A-Za-z_]\w*=\S*\s+)*(make|python3?|\.venv[\w-]*/bin/\S+|kvstore|pip|export|ray)(\s|$)")


def _blocks(lines: list[str]) -> list[tuple[str, int, list[str]]]:
    """(tag, number of the first line, lines) of each fenced block."""
    blocks, tag, body, first = [], None, [], 0
    for number, raw in enumerate(lines, 1):
        s = raw.strip()
        if s.startswith("```"):
            if tag is None:
                tag, body, first = s[3:].strip() or "none", [], number + 1
            else:
                blocks.append((tag, first, body))
                tag = None
        elif tag is not None:
            body.append(raw)
    return blocks


def extract(path: Path) -> list[Command]:
    """The commands of one markdown file, by the rule in the module docstring."""
    rel = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
    found: list[tuple[int, str, list[str]]] = []
    for tag, first, body in _blocks(path.read_text(encoding="utf-8").splitlines()):
        stripped = [b.strip() for b in body]
        if tag in SHELL_TAGS:
            mode = "shell"
        elif any(s.startswith("$ ") for s in stripped):
            mode = "dollar"
        elif tag != "python" and next((s for s in stripped if s), "") and COMMAND_HEAD.match(
                next(s for s in stripped if s)):
            mode = "heads"
        else:
            continue
        pending: tuple[int, str] | None = None
        output: list[str] = []
        for number, s in enumerate(stripped, first):
            if pending is not None:
                start, text = pending
                text = f"{text[:-1]} {s}"
                pending = (start, text) if text.endswith("\\") else None
                if pending is None:
                    found.append((start, text, output))
                continue
            if mode == "shell" and s and not s.startswith("#"):
                text = s
            elif mode == "dollar" and s.startswith("$ "):
                text = s[2:]
            elif mode == "heads" and COMMAND_HEAD.match(s):
                text = s
            else:
                if s and mode != "shell":
                    output.append(s)
                continue
            output = []
            if text.endswith("\\"):
                pending = (number, text)
            else:
                found.append((number, text, output))
    variables: dict[str, str] = {}
    out: list[Command] = []
    for number, text, output in found:
        words = shlex.split(text, comments=True)
        if words and all(re.match(r"[A-Za-z_]\w*=", w) for w in words):  # NAME="..." alone: a variable
            for w in words:
                name, _, value = w.partition("=")
                variables[name] = value
        out.append(Command(rel, number, text, tuple(output), dict(variables)))
    return out


def all_commands() -> list[Command]:
    return [c for path in DOCS for c in extract(path)]


def normalised(text: str) -> str:
    return " ".join(shlex.join([w]) if " " in w else w for w in shlex.split(text, comments=True))


def words_of(cmd: Command) -> tuple[dict[str, str], list[str], list[list[str]]]:
    """(environment, the first command's words, the other commands of the line), variables expanded."""
    text = cmd.text.replace("$PWD", str(ROOT))
    for name, value in cmd.variables.items():
        text = re.sub(rf"\${{?{name}\b}}?", value, text)
    lexer = shlex.shlex(text, posix=True, punctuation_chars="|&;")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    parts: list[list[str]] = [[]]
    for w in lexer:
        if w in ("|", "&", "&&", ";", "||"):
            parts.append([])
        else:
            parts[-1].append(w)
    first, rest = parts[0], [p for p in parts[1:] if p]
    env = {}
    while first and re.match(r"[A-Za-z_]\w*=", first[0]):
        name, _, value = first.pop(0).partition("=")
        env[name] = value
    return env, first, rest


# ------------------------------------------------------------------------------------------------ help pages

_HELP_PROBE = r"""
import contextlib, io, json, runpy, sys
out = {}
for kind, name, *sub in json.loads(sys.argv[1]):
    buf = io.StringIO()
    sys.argv = [name, *sub, "--help"]
    try:
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
            if kind == "script":
                sys.path.insert(0, name.rsplit("/", 1)[0])  # as `python scripts/x.py` has it
                try:
                    runpy.run_path(name, run_name="__main__")
                finally:
                    sys.path.pop(0)
            elif kind == "module":
                runpy.run_module(name, run_name="__main__", alter_sys=True)
            else:
                import kvstore.cli
                kvstore.cli.main([*sub, "--help"])
    except SystemExit:
        pass
    except Exception as exc:
        buf.write(f"<--help failed: {type(exc).__name__}: {exc}>")
    out[" ".join([name, *sub])] = buf.getvalue()
print(json.dumps(out))
"""


def _is_python(word: str) -> bool:
    return PYTHON.fullmatch(word) is not None


def _script_module(name: str) -> Path | None:
    """The file of an entry point run as `python -m scripts.X[.Y]` (scripts/X/Y.py), None for any other module."""
    return ROOT.joinpath(*name.split(".")).with_suffix(".py") if name.split(".")[0] == "scripts" else None


def _help_specs() -> set[tuple[str, ...]]:
    """Every --help page the commands need (scripts, argparse modules, kvstore and its subcommands)."""
    specs: set[tuple[str, ...]] = {("kvstore", "kvstore")}
    for cmd in COMMANDS:
        for argv in _entry_points(cmd):
            if _is_python(argv[0]) and len(argv) > 1 and argv[1].endswith(".py"):
                specs.add(("script", argv[1]))
            elif _is_python(argv[0]) and argv[1:2] == ["-m"] and (
                    argv[2] in ARGPARSE_MODULES or _script_module(argv[2]) is not None):
                specs.add(("module", argv[2]))
            elif Path(argv[0]).name == "kvstore":
                sub = _kvstore_split(argv)[1]
                if sub:
                    specs.add(("kvstore", "kvstore", sub[0]))
    return {s for s in specs if (s[0] != "script" or (ROOT / s[1]).is_file())
            and (s[0] != "module" or _script_module(s[1]) is None or _script_module(s[1]).is_file())}


@cache
def help_pages() -> dict[str, str]:
    specs = sorted(_help_specs())
    done = subprocess.run([sys.executable, "-c", _HELP_PROBE, json.dumps(specs)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env=_env())
    assert done.returncode == 0, f"reading the --help pages failed: {done.stderr[-2000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


#: What a `make` this test runs must not inherit from a `make test ARGS=...` above it: MAKEFLAGS carries the
#: parent's command-line variables into every sub-make, and the Makefile reads ARGS/RUN/... from the environment.
_MAKE_INHERITED = {"MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "ARGS", "RUN", "PROFILE", "PORT"}


def _env() -> dict[str, str]:
    import os

    clean = {k: v for k, v in os.environ.items() if k not in _MAKE_INHERITED}
    return {**clean, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONPATH": str(ROOT)}


def _flags_listed(flags: list[str], page: str, what: str) -> None:
    assert page and "<--help failed" not in page, f"{what} --help gave no page: {page[-500:]}"
    for flag in flags:
        name = flag.split("=", 1)[0]
        assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", page), \
            f"{what} has no option {name} (its --help lists none)"


def _check_run_paths(words: list[str]) -> None:
    for w in words:
        m = RUN_PATH.fullmatch(w.split("=", 1)[-1])
        if m:
            assert re.fullmatch(STAMP, m["rest"]), (
                f"{w}: not a run folder name (runs/<kind>/<YYYY-MM-DD_HH-MM-SS-ffffff>[-label]); a placeholder is not "
                "copy-pasteable: write a real one, or name the test that runs the command in RAN_BY")


# ------------------------------------------------------------------------------------------------ the checkers


def _make_recipe(env: dict[str, str], words: list[str]) -> list[str]:
    return _recipe(tuple(sorted(env.items())), tuple(words))


@cache
def _recipe(env_items: tuple[tuple[str, str], ...], words: tuple[str, ...]) -> list[str]:
    env = dict(env_items)
    target_and_vars = [w for w in words[1:] if not w.startswith("-")]
    assert target_and_vars, "make without a target"
    done = subprocess.run(["make", "-n", "-o", ".venv/.setup-done", *target_and_vars], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, env={**_env(), **env})
    assert done.returncode == 0, f"make -n {' '.join(target_and_vars)}: {done.stderr.strip()}"
    return done.stdout.splitlines()


def _entry_points(cmd: Command) -> list[list[str]]:
    """The argv of each of our entry points a command runs (for make: the recipe lines that run one)."""
    try:
        env, first, _ = words_of(cmd)
    except ValueError:
        return []
    if not first:
        return []
    if first[0] == "make":
        try:
            recipe = _make_recipe(env, first)
        except AssertionError:
            return []
        lines = []
        for line in recipe:
            argv = shlex.split(line)
            if argv and _is_python(argv[0]) and len(argv) > 1 and (argv[1].startswith("scripts/") or (
                    argv[1] == "-m" and argv[2].split(".")[0] in {"harness", "kvstore", "scripts"})):
                lines.append(argv)
        return lines
    return [first]


def _compose(overrides: list[str]) -> None:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from harness.config.schema import compose_config

    parsed = OverridesParser.create().parse_overrides(overrides)  # a syntax error raises here
    base, sweeps = [], []
    for raw, o in zip(overrides, parsed, strict=True):
        if o.is_sweep_override():
            values = list(o.sweep_string_iterator())
            sweeps.append((o.key_or_group, values))
            base.append(f"{o.key_or_group}={values[0]}")
        else:
            base.append(raw)
    launcher = [w for w in base if w.startswith("hydra/launcher=")]
    for w in launcher:
        name = w.split("=", 1)[1]
        if not (ROOT / "configs/hydra/launcher" / f"{name}.yaml").is_file() and name in LAUNCHER_EXTRAS:
            extra, package = LAUNCHER_EXTRAS[name]
            extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
            assert package in extras.get(extra, []), f"hydra/launcher={name} needs {package}: not in extra {extra}"
            try:
                import hydra_plugins.hydra_submitit_launcher  # noqa: F401
            except ImportError:  # not installed here: compose the rest
                base = [b for b in base if b != w and not b.startswith("hydra.launcher.")]
    compose_config(base)
    for key, values in sweeps:
        for value in values[1:]:
            compose_config([b for b in base if not b.startswith(f"{key}=")] + [f"{key}={value}"])


def _check_harness(cmd: Command, argv: list[str]) -> str:
    from harness.errors import HarnessError

    module = argv[2]
    args = argv[3:]
    flags = [a for a in args if a.startswith("-")]
    unknown = [f for f in flags if f not in HARNESS_FLAGS[module]]
    assert not unknown, f"python -m {module} takes no flag {unknown}; it takes {sorted(HARNESS_FLAGS[module])}"
    overrides = [a for a in args if not a.startswith("-")]
    try:
        _compose(overrides)
    except Exception as exc:  # noqa: BLE001 - a Hydra grammar error or our ConfigError: the doc must show it
        from harness.config.schema import compose_config

        try:
            compose_config(overrides)
            message = f"{type(exc).__name__}: {exc}"
        except HarnessError as err:
            message = str(err)
        shown = cmd.output[0] if cmd.output else "(nothing)"
        assert shown == f"error: {message}", (
            f"python -m {module} {' '.join(overrides)} does not compose ({message}); a doc may show a failing "
            f"command only with its exact error line next, and it shows {shown!r}")
        return "fails as the doc shows"
    _check_run_paths(overrides)
    return f"composes for python -m {module}"


def _check_python(cmd: Command, argv: list[str]) -> str:
    if argv[1:2] == ["-m"]:
        module = argv[2]
        if module in HARNESS_ENTRY_POINTS:
            return _check_harness(cmd, argv)
        if module == "pytest":
            for a in argv[3:]:
                if not a.startswith("-"):
                    assert (ROOT / a.split("::")[0]).exists(), f"pytest {a}: no such test file"
            return "pytest paths exist"
        script = _script_module(module)
        assert script is None or script.is_file(), f"python -m {module}: no such script ({script})"
        assert module in ARGPARSE_MODULES or script is not None, f"python -m {module}: no checker for this module"
        _flags_listed([a for a in argv[3:] if a.startswith("-")], help_pages()[module], f"python -m {module}")
        _check_run_paths(argv[3:])
        return "flags in --help"
    script = argv[1]
    assert script.endswith(".py") and (ROOT / script).is_file(), f"{script}: no such script"
    flags = [a for a in argv[2:] if a.startswith("-")]
    if flags:
        _flags_listed(flags, help_pages()[script], script)
    _check_run_paths(argv[2:])
    return "script exists, flags in --help"


def _kvstore_split(argv: list[str]) -> tuple[list[str], list[str]]:
    """kvstore's global options and the subcommand with its arguments."""
    i, globals_ = 1, []
    while i < len(argv) and argv[i].startswith("-"):
        globals_ += argv[i:i + 2] if argv[i] in KVSTORE_GLOBALS else argv[i:i + 1]
        i += 2 if argv[i] in KVSTORE_GLOBALS else 1
    return globals_, argv[i:]


def _check_kvstore(argv: list[str]) -> str:
    globals_, sub = _kvstore_split(argv)
    pages = help_pages()
    _flags_listed([g for g in globals_ if g.startswith("-")], pages["kvstore"], "kvstore")
    assert sub, "kvstore without a command"
    assert re.search(rf"^\s+{re.escape(sub[0])}\s", pages["kvstore"], re.M), f"kvstore has no command {sub[0]}"
    _flags_listed([a for a in sub[1:] if a.startswith("-")], pages[f"kvstore {sub[0]}"], f"kvstore {sub[0]}")
    store = dict(zip(globals_[::2], globals_[1::2], strict=False)).get("--store", "runs/store")
    if sub[0] in {"ls", "verify", "show"} and "://" not in store:
        _run_kvstore_for_real(sub)
        return "ran for real on a small store"
    return "command and flags in --help"


def _check_pip(words: list[str]) -> str:
    pins = [w for w in words if "==" in w]
    assert pins, "pip install without a pinned version"
    constraints = (ROOT / "constraints.txt").read_text()
    makefile = (ROOT / "Makefile").read_text()  # torch is pinned by make setup's own line, not constraints.txt
    for pin in pins:
        assert re.search(rf"^{re.escape(pin)}(\s|$|;)", constraints, re.M | re.I) or re.search(
            rf"pip install .*(?<![\w.-]){re.escape(pin)}(\s|$)", makefile, re.M), \
            f"{pin} is neither constraints.txt's pin nor make setup's"
    return "pins equal the tested stack's"


def check(cmd: Command) -> str:
    """How `cmd` was checked; AssertionError (saying what is wrong) when it would not run as written."""
    test = RAN_BY.get(normalised(cmd.text))
    if test is not None:
        path, _, name = test.partition("::")
        assert (ROOT / path).is_file() and re.search(rf"^def {re.escape(name)}\(", (ROOT / path).read_text(), re.M), \
            f"{test}, named in RAN_BY as the test that runs this command, does not exist"
        return f"run by {test}"
    env, first, rest = words_of(cmd)
    for other in rest:
        assert other[0] in PLAIN_SHELL, f"{other[0]}: only plain shell may follow a | or &"
    if not first:
        assert env, "an empty command"
        return "defines a variable"
    head = first[0]
    if head in PLAIN_SHELL:
        return "plain shell"
    if head in ("source", "."):
        assert len(first) == 2 and (ROOT / first[1]).is_file(), f"{' '.join(first)}: no such file (run make setup)"
        return "the file it sources exists"
    if head == "make":
        _make_recipe(env, first)  # asserts the target exists
        how = ["make -n knows the target"]
        for argv in _entry_points(cmd):
            how.append(_check_python(cmd, argv) if _is_python(argv[0]) else _check_kvstore(argv))
        run = RUN_PATH.fullmatch(next((w[4:] for w in first if w.startswith("RUN=")), ""))
        if "rescore" in first and run and run[2] in {"baseline", "graft", "incontext"}:
            _rescore_a_run_folder_for_real()
            how.append("ran for real on a hand-built run folder")
        return "; ".join(how)
    if _is_python(head):
        return _check_python(cmd, first)
    if Path(head).name == "kvstore":
        return _check_kvstore(first)
    if head == "ray":
        import shutil

        assert shutil.which("ray") or (ROOT / ".venv/bin/ray").exists(), "ray is not installed (make setup-ray)"
        return "ray is installed"
    if Path(head).name == "pip" and first[1:2] == ["install"]:
        return _check_pip(first)
    raise AssertionError(f"no checker for {head!r}: add one to tests/test_docs_commands.py or a RAN_BY entry")


# ------------------------------------------------------------------------------------------------ real runs


def _scratch(prefix: str) -> Path:
    """A temporary folder removed when the test process exits."""
    import atexit
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, path, True)
    return path


def _load(name: str, path: Path) -> ModuleType:
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


@cache
def _rescore_a_run_folder_for_real() -> None:
    """`make rescore RUN=<a run folder>` as written, on a hand-built run folder (no model)."""
    fakerun = _load("kvgraft_tests_fakerun", ROOT / "tests/harness/fakerun.py")
    run = fakerun.build_fake_run(_scratch("docs-rescore-") / "run")
    done = subprocess.run(["make", "-o", ".venv/.setup-done", "rescore", f"RUN={run}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env=_env())
    assert done.returncode == 0 and "OK: 3 rows re-scored, all hashes match" in done.stdout, done.stdout + done.stderr


@cache
def _small_store() -> tuple[str, str]:
    """A local store holding one hand-built artifact (no model): (its folder, the artifact id)."""
    from kvstore import LocalStore

    conftest = _load("kvgraft_tests_kvstore_conftest", ROOT / "tests/kvstore/conftest.py")
    root = str(_scratch("docs-store-"))
    return root, LocalStore(root).put(conftest._hand_built_snapshot())


def _run_kvstore_for_real(sub: list[str]) -> None:
    import contextlib
    import io

    from kvstore.cli import main

    root, aid = _small_store()
    args = [aid[:12] if re.fullmatch(r"[0-9a-f]{8,64}", a) else a for a in sub]  # the doc's id -> this store's
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        status = main(["--store", root, *args])
    assert status == 0, f"kvstore {' '.join(args)} on a one-artifact store: exit {status}: {buf.getvalue()[-800:]}"
    assert aid[:12] in buf.getvalue() or sub[0] == "verify", buf.getvalue()


# ------------------------------------------------------------------------------------------------ the tests

COMMANDS = all_commands()


def test_the_docs_have_commands_and_the_rule_finds_the_main_ones() -> None:
    texts = {normalised(c.text) for c in COMMANDS}
    assert {"make aime-graft", "make test"} <= texts, sorted(texts)[:20]
    assert all(c.text for c in COMMANDS)


def test_the_extraction_rule(tmp_path: Path) -> None:
    doc = tmp_path / "sample.md"
    doc.write_text("text `make inline` is prose\n```bash\n# a comment\nmake a ARGS=\"x=1\" \\\n  y=2   # note\n```\n"
                   "```\n$ python scripts/rescore.py r\nOK\nmore\n$ ls\nplain output\n```\n```python\nx = 1\n```\n"
                   "```\nmake b\nsaid b\nA=1 python x.py\n```\n```\nOK: output only\nmake c\n```\n",
                   encoding="utf-8")
    got = extract(doc)
    assert [(c.line, c.text, c.output) for c in got] == [
        (4, 'make a ARGS="x=1"  y=2   # note', ()),
        (8, "python scripts/rescore.py r", ("OK", "more")),
        (11, "ls", ("plain output",)),
        (18, "make b", ("said b",)),
        (20, "A=1 python x.py", ()),
    ]
    assert normalised(got[0].text) == "make a ARGS=x=1 y=2"


def test_a_command_nothing_checks_fails_with_its_place() -> None:
    with pytest.raises(AssertionError, match="no checker for 'frobnicate'"):
        check(Command("docs/x.md", 3, "frobnicate --all"))
    with pytest.raises(AssertionError, match="no option --no-such-flag"):
        check(Command("docs/x.md", 4, "python -m scripts.rescore --no-such-flag runs/x"))
    with pytest.raises(AssertionError, match="does not compose"):
        check(Command("docs/x.md", 5, "make aime-graft ARGS=decoding.max_new_token=8", ("error: something else",)))
    with pytest.raises(AssertionError, match="make -n"):
        check(Command("docs/x.md", 6, "make no-such-target"))


@pytest.mark.parametrize("cmd", COMMANDS, ids=[c.where for c in COMMANDS])
def test_every_doc_command_runs_as_written(cmd: Command) -> None:
    try:
        how = check(cmd)
    except AssertionError as exc:
        pytest.fail(f"{cmd.where}: `{cmd.text}`: {exc}", pytrace=False)
    assert how
