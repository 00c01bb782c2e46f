"""`make aime-graft` on the llama.cpp backend (model=gemma3_270m_llamacpp, the bundled GGUF): the library is
deposited by llama.cpp into its own folder, every graft row is identical to its in-context twin in both groups,
and every run's manifest and the library record the llamacpp backend and its settings. Skipped where
llama-cpp-python is not installed (`make setup` builds it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (make setup builds it)")

from harness.compare import job as compare  # noqa: E402

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_compare_job_on_llamacpp_gives_graft_rows_identical_to_their_twins(tmp_path: Path) -> None:
    result = compare.main([
        "model=gemma3_270m_llamacpp", "model.llamacpp.n_ctx=1024", "model.llamacpp.threads=1", f"project_root={REPO}",
        f"runs_dir={tmp_path}/runs", "dataset.limit=2", "decoding.max_new_tokens=8", "tracking=off",
        f"library.root={tmp_path}/library", f"library.store={tmp_path}/store",
        "library.dataset.limit=3",  # the 2 problems' own entries and one more: each group has a choice
    ])
    for group in ("recurring", "held_out"):
        p = (result.pairs or {})[group].pairing
        assert (p.identical, p.differing) == (2, 0), p
    for label, run in result.runs.items():
        manifest = json.loads((Path(run) / "manifest.json").read_text())
        det = manifest["inputs"]["determinism"]
        assert det["backend"] == "llamacpp" and det["n_ctx"] == 1024 and det["threads"] == 1, label
        assert det["llama_cpp_python"] and det["llama_cpp"], label  # the llama.cpp build is recorded
        config = (Path(run) / "config.yaml").read_text()
        assert "backend: llamacpp" in config, label
    (lib,) = (tmp_path / "library").iterdir()  # the library of this backend and these settings
    m = json.loads((lib / "manifest.json").read_text())
    assert m["identity"]["backend"] == "llamacpp" and m["identity"]["backend_settings"]["n_ctx"] == 1024
    assert m["determinism"]["backend"] == "llamacpp"
