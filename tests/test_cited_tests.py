"""Docs that cite a test can back themselves (issue 51, item 7: a docstring cited tests/kvstore/test_ragged.py, which
does not exist): every `tests/<path>.py` named in the sources, docs, configs and Makefile exists, and every
`tests/<path>.py::<test>` names a test function that file defines."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CITED = re.compile(r"\btests/[\w/.-]+?\.py(?:::\s*\n?\s*[\w]+)?")


def _sources() -> list[Path]:
    return sorted({*REPO.glob("kvstore/**/*.py"), *REPO.glob("harness/**/*.py"), *REPO.glob("scripts/**/*.py"),
                   *REPO.glob("docs/**/*.md"), *REPO.glob("harness/*.md"), *REPO.glob("kvstore/*.md"),
                   *REPO.glob("configs/**/*.yaml"), REPO / "README.md", REPO / "Makefile"})


def test_every_cited_test_file_and_test_exists() -> None:
    missing = []
    for path in _sources():
        for m in CITED.finditer(path.read_text(encoding="utf-8")):
            cited, _, name = m.group(0).partition("::")
            where = f"{path.relative_to(REPO)}: {m.group(0).split()[0]}"
            if not (REPO / cited).is_file():
                missing.append(where)
            elif name.strip():
                tree = ast.parse((REPO / cited).read_text(encoding="utf-8"))
                names = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
                if name.strip() not in names:
                    missing.append(f"{where}::{name.strip()}")
    assert not missing, f"cited tests that do not exist: {missing}"
