"""lm-eval through the library-aware server equals kvgraft's own runs, sample by sample (issue 53, the reduced
version: 4 bundled problems; the 40-problem tables are in docs/vllm.md). scripts/lmeval_serve_check.py builds the
library on vLLM, runs the harness's graft and in-context runs (recurring, held-out), then `make serve LIBRARY=...
RETRIEVAL=recurring|held-out` and lm-eval 0.4.13 (`local-completions`, the task in harness/task/lmeval) as the graft
and as the in-context control: every completion text and the accuracy equal the harness's (four comparisons).
Three engine starts: ~10-20 min on 2 shared cores."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.integration
def test_lmeval_through_the_server_equals_the_harness_runs_sample_by_sample(tmp_path: Path) -> None:
    if not (REPO / ".venv-vllm" / "bin" / "python").exists():
        pytest.skip("no .venv-vllm (make setup-vllm): the server and the harness runs are vLLM")
    if not (REPO / ".venv-lmeval" / "bin" / "lm-eval").exists():
        pytest.skip("no .venv-lmeval (make setup-lmeval): the client is lm-eval")
    r = subprocess.run([sys.executable, "scripts/lmeval_serve_check.py", "--out", str(tmp_path), "--limit", "4"],
                       capture_output=True, text=True, cwd=REPO, timeout=3600)
    summary = json.loads((tmp_path / "summary.json").read_text()) if (tmp_path / "summary.json").exists() else {}
    rows = summary.get("rows", [])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert {(x["retrieval"], x["condition"]) for x in rows} == {(m, c) for m in ("recurring", "held-out")
                                                                 for c in ("graft", "incontext")}
    for x in rows:
        assert x["ok"] and x["result"].startswith("identical 4/4"), x
