"""scripts/ inside the house (issue 50): every script is a module of the `scripts` package, run as `python -m
scripts.NAME` from the checkout, importing its siblings package-qualified; nothing outside the transformers folder
reaches into its Backend for the FrozenModel (`.fm`), and nothing outside kvstore/backends/ asks a backend its name."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"


def _modules(*folders: str) -> list[Path]:
    return sorted(p for f in folders for p in (REPO / f).rglob("*.py") if "__pycache__" not in p.parts)


def test_every_script_folder_is_a_package_and_imports_its_siblings_by_package() -> None:
    folders = {p.parent for p in _modules("scripts")}
    assert all((f / "__init__.py").is_file() for f in folders), sorted(str(f) for f in folders)
    siblings = {p.stem for p in _modules("scripts")} - {"__init__"}
    found = []
    for p in _modules("scripts"):
        for node in ast.walk(ast.parse(p.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            found += [f"{p.relative_to(REPO)}:{node.lineno} {n}" for n in names if n.split(".")[0] in siblings]
    assert not found, f"bare sibling imports (write `from scripts.bench.common import ...`): {found}"


def test_no_fm_outside_the_transformers_folder() -> None:
    """The FrozenModel is the transformers folder's own: the harness, scripts and the rest of kvstore use the
    Backend's verbs and facts (`sliding_window()`, `layer_kinds()`), and its folder's `bare` module for the engine alone."""
    found = [f"{p.relative_to(REPO)}:{node.lineno}"
             for p in _modules("harness", "scripts", "kvstore") if "transformers" not in p.relative_to(REPO).parts[1:3]
             for node in ast.walk(ast.parse(p.read_text())) if isinstance(node, ast.Attribute) and node.attr == "fm"]
    # harness/run/conditions keeps a Condition's backend as `self.fm` until the seam's rewrite renames it
    assert all(f.startswith("harness/run/conditions/") for f in found), found


def test_no_backend_name_is_compared_outside_the_backends_folder() -> None:
    """A script or the harness asks a capability (isinstance) or a fact, never `backend == "llamacpp"`."""
    names = {"transformers", "llamacpp", "vllm", "fake"}
    found = []
    for p in _modules("harness", "scripts", "kvstore"):
        if p.relative_to(REPO).parts[:2] == ("kvstore", "backends"):
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn))
                                                     for op in node.ops):
                constants = {c.value for side in (node.left, *node.comparators) for c in ast.walk(side)
                             if isinstance(c, ast.Constant) and isinstance(c.value, str)}
                if constants & names:
                    found.append(f"{p.relative_to(REPO)}:{node.lineno}")
    assert not found, found


def test_a_bench_module_runs_as_a_package_module_from_the_checkout() -> None:
    """`python -m scripts.bench.X` resolves its siblings through the package (here: --help of the one that imports
    the most of them, in a fresh process whose only path to `scripts` is the working directory)."""
    done = subprocess.run([sys.executable, "-m", "scripts.bench.run", "--help"], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--no-invariant" in done.stdout
