"""docs/extending.md's counts and example checked against the checkout: each row of "What each addition touches" lists
as many files as its count says, every one of them exists (a `<name>` standing for the new thing's name), and every
line the run-setting example quotes is in the file it names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOC = (REPO / "docs" / "extending.md").read_text(encoding="utf-8")
KINDS = ("a backend", "a setting of a backend", "a capability of a backend", "a run setting",
         "a model setting every backend may read", "a condition", "a metric", "a dataset")


def _table() -> dict[str, tuple[list[str], int]]:
    section = DOC.split("## What each addition touches", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] in KINDS:
            rows[cells[0]] = (re.findall(r"`([^`]+)`", cells[1]), int(cells[2]))
    return rows


def test_every_kind_of_addition_has_a_row() -> None:
    assert sorted(_table()) == sorted(KINDS)


@pytest.mark.parametrize("kind", KINDS)
def test_each_row_counts_its_files_and_each_exists(kind: str) -> None:
    files, count = _table()[kind]
    assert len(files) == count, f"{kind}: {count} stated, {len(files)} listed ({files})"
    for f in files:
        pattern = re.sub(r"<[a-z]+>", "*", f).rstrip("/")
        assert list(REPO.glob(pattern)), f"{kind}: {f} names nothing in the checkout"


def test_the_run_setting_example_quotes_the_code_as_it_is() -> None:
    section = DOC.split("## Add a run setting", 1)[1].split("\n## ", 1)[0]
    steps = re.split(r"\n(?=\d\. )", section)
    quoted = 0
    for step in steps:
        path = re.search(r"`((?:harness|tests)/[\w/]+\.py)`", step)
        for block in re.findall(r"```\n(.*?)```", step, re.S):
            assert path, step[:80]
            for line in filter(None, (x.strip() for x in block.splitlines())):
                assert line in (REPO / path.group(1)).read_text(encoding="utf-8"), f"{path.group(1)}: {line}"
                quoted += 1
    assert quoted >= 3
