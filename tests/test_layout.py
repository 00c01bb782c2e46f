"""The rules of the house (docs/extending.md), checked on the source with ast: one concept per folder with a face,
layered folders, no private name imported across modules, no re-export outside a face, kvstore independent of the
harness (and its messages naming none of the harness's config keys), the harness using kvstore only through its
face, no sys.path edits, no `# fmt: skip`, and backends found by the registry alone."""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LAYERS = {"kvstore": 6, "harness": 7}
TOP_LEVEL = {"kvstore": {"errors", "atomic", "environment", "determinism", "processes", "cli"},
             "harness": {"__main__", "errors", "rescore"}}


def _files(*dirs: str) -> list[Path]:
    return sorted(p for d in dirs for p in (REPO / d).rglob("*.py"))


def _imports(path: Path):
    """(module, names, node) of every import statement in `path`, at any depth (relative imports resolved)."""
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    package = parts[:-1] if parts[-1] != "__init__" else parts[:-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, [], node
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                anchor = package[: len(package) - (node.level - 1)]
                module = ".".join([*anchor, module] if module else anchor)
            yield module, [a.name for a in node.names], node


def _unit(pkg: str, path: Path) -> str:
    rel = path.relative_to(REPO / pkg).parts
    return rel[0].removesuffix(".py")


def _unit_graph(pkg: str) -> dict[str, set[str]]:
    units = {p.name.removesuffix(".py") for p in (REPO / pkg).iterdir()
             if (p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists()))} - {"__init__"}
    graph: dict[str, set[str]] = {u: set() for u in units}
    for path in _files(pkg):
        u = _unit(pkg, path)
        if u == "__init__":
            continue
        for module, _, _ in _imports(path):
            parts = module.split(".")
            if parts[0] == pkg and len(parts) > 1 and parts[1] in units and parts[1] != u:
                graph[u].add(parts[1])
    return graph


@pytest.mark.parametrize("pkg", ["kvstore", "harness"])
def test_folders_form_layers_without_a_cycle(pkg):
    graph = _unit_graph(pkg)

    @functools.cache
    def depth(u: str, path: tuple[str, ...] = ()) -> int:
        assert u not in path, f"{pkg}: folders import each other: {' -> '.join([*path, u])}"
        return 1 + max((depth(d, (*path, u)) for d in graph[u]), default=0)

    deepest = max(graph, key=depth)
    assert depth(deepest) <= LAYERS[pkg], f"{pkg}: {deepest} is {depth(deepest)} layers deep"


@pytest.mark.parametrize("pkg", ["kvstore", "harness"])
def test_every_folder_has_a_face_and_few_top_level_modules(pkg):
    root = REPO / pkg
    for d in [root, *[p for p in root.rglob("*") if p.is_dir() and p.name != "__pycache__"]]:
        if any(d.glob("*.py")):
            face = d / "__init__.py"
            assert face.exists(), f"{d.relative_to(REPO)} has no __init__.py face"
            assert ast.get_docstring(ast.parse(face.read_text())), f"{face.relative_to(REPO)}: no docstring"
    top = {p.stem for p in root.glob("*.py")} - {"__init__"}
    assert top <= TOP_LEVEL[pkg], f"{pkg}: modules outside a concept folder: {sorted(top - TOP_LEVEL[pkg])}"


def test_no_private_name_is_imported_across_modules():
    found = [f"{p.relative_to(REPO)}:{node.lineno} {module}.{name}"
             for p in _files("kvstore", "harness", "scripts") for module, names, node in _imports(p)
             for name in names if name.startswith("_") and not name.startswith("__")]
    assert not found, found


def test_only_faces_re_export():
    """A module's __all__ lists what it defines; only an __init__.py face may list imported names."""
    found = []
    for p in _files("kvstore", "harness"):
        if p.name == "__init__.py":
            continue
        tree = ast.parse(p.read_text())
        imported = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
                names = {e.value for e in getattr(node.value, "elts", []) if isinstance(e, ast.Constant)}
                found += [f"{p.relative_to(REPO)}: {n}" for n in sorted(names & imported)]
    assert not found, found


def test_no_re_export_hides_behind_a_noqa_outside_a_face():
    """`# noqa: F401` on an import keeps an unused name importable from a module that is not a face: a second way in.
    Only a folder's __init__.py re-exports; a side-effect import says so by importing inside the function that needs
    it (and keeps its noqa there)."""
    found = []
    for p in _files("kvstore", "harness", "scripts"):
        if p.name == "__init__.py":
            continue
        for node in ast.parse(p.read_text()).body:  # module level: where a re-export lives
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                lines = p.read_text().splitlines()[node.lineno - 1 : node.end_lineno]
                if any("noqa: F401" in line for line in lines):
                    found.append(f"{p.relative_to(REPO)}:{node.lineno}")
    assert not found, found


def test_kvstore_imports_nothing_of_the_harness():
    found = [f"{p.relative_to(REPO)}:{node.lineno}" for p in _files("kvstore")
             for module, _, node in _imports(p) if module.split(".")[0] == "harness"]
    assert not found, found


def test_the_harness_uses_kvstore_only_through_its_face():
    found = [f"{p.relative_to(REPO)}:{node.lineno} {module}" for p in _files("harness")
             for module, _, node in _imports(p) if module.startswith("kvstore.")]
    assert not found, found


HARNESS_KEY = re.compile(r"\b(model|decoding|library|condition|dataset|prompt|tracking|compare|energy|execution)"
                         r"(\.[a-z_]+)+=|python -m harness|make aime")  # nested keys too: model.vllm.role=


def test_kvstore_messages_name_no_harness_config_key():
    found = []
    for p in _files("kvstore"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Raise):
                for s in ast.walk(node):
                    if isinstance(s, ast.Constant) and isinstance(s.value, str) and HARNESS_KEY.search(s.value):
                        found.append(f"{p.relative_to(REPO)}:{s.lineno}: {s.value[:80]!r}")
    assert not found, found


def test_no_sys_path_edits_and_no_fmt_skip():
    """sys.path: in the packages and scripts (a test may emulate `python scripts/x.py`); fmt skip: anywhere."""
    found = []
    for p in _files("kvstore", "harness", "scripts", "tests"):
        text = p.read_text()
        if p.parts[len(REPO.parts)] != "tests" and re.search(r"sys\.path\.(insert|append)|sys\.path\s*=", text):
            found.append(f"{p.relative_to(REPO)}: sys.path")
        if p != Path(__file__) and "fmt: " + "skip" in text:
            found.append(f"{p.relative_to(REPO)}: fmt skip")
    assert not found, found


def test_backends_are_found_by_what_they_declare():
    """Each backend under kvstore/backends/ declares REGISTERED; the registry lists exactly those, and the harness's
    model.backend accepts each (the fake: `model=fake`, configs/model/fake.yaml, loads through the registry)."""
    code = ("import kvstore, sys; from harness.config.schema import compose_config, typed; "
            "from harness.config.model import load_model; print(','.join(kvstore.backend_names())); "
            "be = load_model(typed(compose_config(['model=fake']))); print(be.name, type(be).__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr
    names, loaded = out.stdout.split("\n")[:2]
    # a backend is a module or a package (never __pycache__ or the folder's own __init__.py) that declares REGISTERED
    sources = {p.stem: (p / "__init__.py" if p.is_dir() else p) for p in (REPO / "kvstore" / "backends").iterdir()
               if (p.is_dir() and (p / "__init__.py").is_file()) or (p.suffix == ".py" and p.name != "__init__.py")}
    declared = sorted(name for name, src in sources.items() if "REGISTERED = Registered(" in src.read_text())
    assert sorted(names.split(",")) == declared
    assert loaded == "fake kvstore.backends.fake"


def _code_strings(path: Path) -> list[str]:
    """The string constants of a module that are not docstrings (what its code compares, loads or records)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docs]


#: Outside its own folder, the code that names a backend (docs/extending.md's counts): a backend added after the seam
#: (vllm, fake) is named nowhere else; llama.cpp by the harness's config schema alone (its `model.llamacpp` section
#: was declared there before sections were generated, and every recorded config holds it). transformers, the default,
#: is named as the default (the registry, the CLI, the seam's "absent = transformers", the recorded-key exception).
NAMED_OUTSIDE = {"llamacpp": {"harness/config/schema.py"}, "vllm": set(), "fake": set()}


@pytest.mark.parametrize("name", sorted(NAMED_OUTSIDE))
def test_a_backend_is_named_only_in_its_folder_and_its_configs(name):
    own = REPO / "kvstore" / "backends" / name
    found = {str(p.relative_to(REPO)) for p in _files("kvstore", "harness")
             if own not in p.parents and p != own.with_suffix(".py")
             and any(s == name or s.startswith(f"kvstore.backends.{name}") for s in _code_strings(p))}
    assert found == NAMED_OUTSIDE[name], f"{name} is named outside its folder in {sorted(found)}"
    configs = [p for p in (REPO / "configs").rglob("*.yaml") if re.search(rf"^backend: {name}\b", p.read_text(), re.M)]
    assert configs and all(p.parent.name == "model" for p in configs), configs  # its model configs, nothing else


def test_a_dataset_is_one_config_file():
    """A dataset other than the default (kvgraft_original, the schema's default and the replay's problems) is its
    configs/dataset/<name>.yaml (plus its data file or hub id): no module of the packages names it."""
    names = {p.stem for p in (REPO / "configs" / "dataset").glob("*.yaml")} - {"kvgraft_original"}
    found = sorted(f"{p.relative_to(REPO)}: {s}" for p in _files("kvstore", "harness") for s in _code_strings(p)
                   if s in names)
    assert len(names) >= 4 and not found, found


BACKEND_NAMES = {"be", "fm", "backend", "model"}  # how the harness names a backend it holds


def _is_backend(node: ast.AST) -> bool:
    """`be`, `fm`, `backend`, `self.backend`, `self.fm`, `cond.backend`: an expression the harness holds a backend in."""
    if isinstance(node, ast.Name):
        return node.id in BACKEND_NAMES
    return isinstance(node, ast.Attribute) and node.attr in {"backend", "fm"}


def test_the_harness_reads_no_backend_setting_as_a_dict_and_never_getattrs_a_backend():
    """Facts are methods (`be.batch_invariant()`, `be.allows_environment_mismatch()`, ...), asked by name: no
    `settings().get(` / `settings()[` in harness/, no getattr/hasattr on a backend (docs/extending.md)."""
    found = []
    for p in _files("harness"):
        text = p.read_text(encoding="utf-8")
        found += [f"{p.relative_to(REPO)}:{text[:m.start()].count(chr(10)) + 1} settings() read as a dict"
                  for m in re.finditer(r"settings\(\)\s*(\.get\(|\[)", text)]
        for node in ast.walk(ast.parse(text)):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
                    and node.args and (_is_backend(node.args[0])
                                       or any(_is_backend(n) for n in ast.walk(node.args[0])))):
                found.append(f"{p.relative_to(REPO)}:{node.lineno} {node.func.id} on a backend")
    assert not found, found


def test_the_layout_check_of_backend_facts_can_fail(tmp_path):
    """The check above finds what it looks for (a module written the old way)."""
    bad = "def f(be, backend):\n    return be.settings().get('batch_invariant') or getattr(getattr(backend, 'fm'), 'x')\n"
    tree = ast.parse(bad)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
             and n.func.id == "getattr" and any(_is_backend(x) for x in ast.walk(n.args[0]))]
    assert re.search(r"settings\(\)\s*(\.get\(|\[)", bad) and len(calls) == 2


def _settings_dispatch(text: str) -> list[int]:
    """Lines that guess a backend from its Settings class's fields: `fields(...)` of a `settings_class(...)` (the
    Settings class asked for its fields by name), or `.field_names()` of one."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            inner = [n for a in node.args for n in ast.walk(a) if isinstance(n, ast.Call)]
            asks_class = any((isinstance(c.func, ast.Name) and c.func.id == "settings_class")
                             or (isinstance(c.func, ast.Attribute) and c.func.attr == "settings_class") for c in inner)
            if (name == "fields" and asks_class) or name == "field_names":
                found.append(node.lineno)
    return found


def test_no_code_outside_the_backends_chooses_a_backend_by_its_settings_fields():
    """A backend's settings come from its own Settings class (`kvstore.settings_for(name, ModelChoice(...))`, the
    class's `from_config`); nothing outside kvstore/backends reads a Settings class's fields to guess which backend it
    is (the class answers: `takes_device()`, `pins_determinism()`)."""
    own = REPO / "kvstore" / "backends"
    found = [f"{p.relative_to(REPO)}:{line}" for p in _files("kvstore", "harness", "scripts") if own not in p.parents
             for line in _settings_dispatch(p.read_text(encoding="utf-8"))]
    assert not found, f"settings read by field name outside kvstore/backends: {found}"


def test_the_settings_dispatch_check_can_fail():
    """The check above finds the old way (a module that reads a Settings class's fields)."""
    bad = ("import dataclasses\nfrom kvstore import settings_class\n"
           "def f(name):\n    return 'device' in {f.name for f in dataclasses.fields(settings_class(name))}\n")
    assert _settings_dispatch(bad) == [4]


#: An engine's handles and the transformers-only extras: read only in kvstore/backends/<engine> (its `bare` module is
#: how a benchmark reaches the engine alone: `kvstore.backend_tools(name).bare`).
ENGINE_HANDLES = {"llm", "ll", "ctx", "cfg", "fm", "torch_model", "layer_layout", "device", "sampling_params"}


def _engine_reaches(text: str) -> list[str]:
    """`be.llm`, `fm.layer_layout()`, `self.backend.cfg`...: an engine handle or extra read off a backend."""
    return [f"{node.lineno} .{node.attr}" for node in ast.walk(ast.parse(text))
            if isinstance(node, ast.Attribute) and node.attr in ENGINE_HANDLES
            and (isinstance(node.value, ast.Name) and node.value.id in {"be", "fm", "backend"}
                 or isinstance(node.value, ast.Attribute) and node.value.attr in {"backend", "fm", "be"})]


def test_nothing_outside_an_engine_folder_reads_its_handles_or_imports_its_folder():
    """No `.llm` / `.ll` / `.ctx` / `.cfg` / `.fm` / `.torch_model()` / `.layer_layout()` / `.device` read off a
    backend outside kvstore/backends (facts are the base's methods: `sliding_window()`, `layer_kinds()`), and no
    script or harness module imports `kvstore.backends.<engine>`: an engine's own names come from its class
    (`kvstore.backend_tools(name)`)."""
    own = REPO / "kvstore" / "backends"
    builds = REPO / "kvstore" / "testing"  # random-weight models: a transformers FrozenModel assembled (its `fm`)
    found = [f"{p.relative_to(REPO)}:{hit}" for p in _files("kvstore", "harness", "scripts")
             if own not in p.parents and builds not in p.parents
             for hit in _engine_reaches(p.read_text(encoding="utf-8"))]
    engines = {p.name for p in own.iterdir() if (p / "__init__.py").is_file()}
    found += [f"{p.relative_to(REPO)}:{node.lineno} imports {module}" for p in _files("harness", "scripts")
              for module, _, node in _imports(p)
              if module.split(".")[:2] == ["kvstore", "backends"] and len(module.split(".")) > 2
              and module.split(".")[2] in engines]
    assert not found, f"an engine's handles or folder reached from outside it: {found}"


def test_the_engine_reach_check_can_fail():
    """The check above finds the old way (a benchmark reading vLLM's engine and llama.cpp's context)."""
    bad = "def f(be, fm):\n    be.llm.generate([])\n    return fm.layer_layout(), be.ll.llama_token, be.device\n"
    assert sorted(_engine_reaches(bad)) == ["2 .llm", "3 .device", "3 .layer_layout", "3 .ll"]


def _loads_a_backend(value: ast.AST) -> bool:
    """`be`, or a call that returns a loaded backend (`load_model(c)`, `kvstore.load_backend(...)`)."""
    if isinstance(value, ast.Name):
        return value.id == "be"
    if isinstance(value, ast.Call):
        f = value.func
        return (f.id if isinstance(f, ast.Name) else getattr(f, "attr", "")) in ("load_model", "load_backend")
    return False


def _backend_names(text: str) -> list[str]:
    """Where a module holds a backend under a name other than `be`: a parameter or variable annotated `Backend` (or
    `Backend | None`), a `self.<attr>: Backend`, and any name `fm` (the FrozenModel's old name for the backend)."""
    found = []

    def annotated_backend(ann: ast.AST | None) -> bool:  # a Backend (a `type[Backend]` is its class, not one)
        if ann is None or (isinstance(ann, ast.Subscript) and isinstance(ann.value, ast.Name) and ann.value.id == "type"):
            return False
        return any(isinstance(n, ast.Name) and n.id == "Backend" for n in ast.walk(ann))

    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.arg) and annotated_backend(node.annotation) and node.arg != "be":
            found.append(f"{node.lineno} parameter {node.arg}")
        elif isinstance(node, ast.AnnAssign) and annotated_backend(node.annotation):
            target = node.target
            name = target.id if isinstance(target, ast.Name) else getattr(target, "attr", "?")
            if name != "be":
                found.append(f"{node.lineno} holds a Backend as {name}")
        elif isinstance(node, ast.Assign):  # x = be / load_model(c) / load_backend(), also a, b = be, 1
            for target in node.targets:
                pairs = (zip(target.elts, node.value.elts, strict=False)
                         if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple)
                         else [(target, node.value)])
                for t, value in pairs:
                    name = t.id if isinstance(t, ast.Name) else getattr(t, "attr", "be")
                    if _loads_a_backend(value) and name != "be":
                        found.append(f"{node.lineno} holds a Backend as {name}")
        elif (isinstance(node, ast.Name) and node.id == "fm") or (isinstance(node, ast.arg) and node.arg == "fm") \
                or (isinstance(node, ast.Attribute) and node.attr == "fm") or \
                (isinstance(node, ast.keyword) and node.arg == "fm"):
            found.append(f"{node.lineno} fm")
    return found


def test_the_harness_names_a_backend_one_way():
    """The harness (and the scripts, and kvstore above its engines) hold a backend under one name, `be` (a
    parameter, a variable, a condition's `self.be`, the run's `run(cfg, be=...)`): never `fm`, never `backend` for
    the object (a backend's *name*, a string, is `backend`)."""
    own = (REPO / "kvstore" / "backends", REPO / "kvstore" / "testing")  # an engine's folder names its own model
    found = [f"{p.relative_to(REPO)}:{hit}" for p in _files("harness", "scripts", "kvstore")
             if not any(o in p.parents for o in own) for hit in _backend_names(p.read_text())]
    assert not found, f"a backend held under another name than `be`: {found}"


def test_the_backend_name_check_can_fail():
    bad = ("def f(fm: Backend, backend: Backend | None = None):\n    model: Backend = fm\n    run(cfg, fm=model)\n"
           "class C:\n    def __init__(self, be: Backend):\n        self.backend: Backend = be\n"
           "        self.engine, self.n = be, 1\n        self.model = load_model(c)\n")
    hits = sorted(h.split(" ", 1)[1] for h in _backend_names(bad))
    assert hits == ["fm", "fm", "holds a Backend as backend", "holds a Backend as engine",
                    "holds a Backend as model", "holds a Backend as model", "parameter backend", "parameter fm"], hits
