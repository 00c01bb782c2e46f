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


def test_the_cot_experiment_docs_do_not_claim_the_keys_of_runs_made_under_another_row_schedule() -> None:
    """Issue 51, item 7: configs/experiment/transfer_cot.yaml and docs/models.md said the file gives "the same
    resolved config and keys" as the 1.5B table's runs; those runs predate vLLM's one-request greedy row, and the
    comparable key of a vLLM run records the row schedule (harness.run.loop.comparable_key, the backend's
    row_schedule), so a re-run's key is another. Read without vLLM: the schedule is a constant of its backend."""
    tree = ast.parse((REPO / "kvstore" / "backends" / "vllm" / "backend.py").read_text(encoding="utf-8"))
    schedule = [n.value.value for n in tree.body if isinstance(n, ast.Assign)
                and any(getattr(t, "id", None) == "ROW_SCHEDULE" for t in n.targets)]
    assert schedule and schedule[0], "the vLLM backend names no row schedule: the claim would need re-checking"
    assert "row_schedule" in (REPO / "harness" / "run" / "loop.py").read_text(encoding="utf-8")  # in the key
    for doc in ("configs/experiment/transfer_cot.yaml", "configs/experiment/transfer_cot_270m.yaml",
                "docs/models.md"):
        text = " ".join((REPO / doc).read_text(encoding="utf-8").replace("#", " ").split())
        assert "same resolved config and keys" not in text, doc
    assert "row_schedule" in (REPO / "configs" / "experiment" / "transfer_cot.yaml").read_text(encoding="utf-8")
