"""The README's API snippet runs as written, on the bundled model, in a fresh process."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def readme_python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"), flags=re.S)


def test_readme_has_one_api_snippet() -> None:
    assert len(readme_python_blocks()) == 1


@pytest.mark.integration
def test_readme_api_snippet_runs_as_written(tmp_path: Path) -> None:
    (snippet,) = readme_python_blocks()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", snippet], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"graft == recompute: [0-9a-f]{16}", done.stdout), done.stdout
