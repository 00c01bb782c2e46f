"""Integration on the real bundled model (Gemma 3 270M): a baseline run tracked in a real MLflow sqlite store,
and the recurring case: with its verified solution grafted, the model answers correctly in a handful of
decode tokens (measured: 4-5, the answer's digits plus the stop newline)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.config.schema import compose_config
from harness.library.build import build_library
from harness.record.audit import audit
from harness.run.loop import run
from kvstore import load_backend

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
HANDFUL = 6  # decode tokens allowed for a recurring answer: up to 3 digits, a leading space, the stop newline


@pytest.fixture(scope="module")
def fm():
    return load_backend("transformers")


def _cfg(tmp: Path, *extra: str):
    return compose_config([
        f"project_root={REPO}", f"runs_dir={tmp}/runs", f"tracking.uri=sqlite:///{tmp}/mlflow.db",
        "determinism.batch_invariant=false",  # the mode of the model fixture these runs are handed
        f"library.root={tmp}/library", f"library.store={tmp}/store", "library.dataset.limit=6", *extra,
    ])


def test_baseline_on_the_bundled_model_is_tracked_in_mlflow_and_rescores(tmp_path, fm):
    from mlflow import MlflowClient

    folder, _ = run(_cfg(tmp_path, "dataset.limit=2", "decoding.max_new_tokens=8"), tmp_path / "b", be=fm, progress=False)
    d = folder.path
    assert audit(folder).ok
    tracking = json.loads((d / "tracking.json").read_text())
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    got = client.get_run(tracking["run_id"])
    assert got.data.tags["condition"] == "baseline"
    assert "accuracy" in got.data.metrics and "scores.accuracy" not in got.data.metrics  # the headline names
    assert got.data.params["model.source"] == "gemma3-270m"


def test_recurring_problems_are_answered_from_the_grafted_solution_in_a_handful_of_tokens(tmp_path, fm):
    cfg = _cfg(tmp_path, "condition=graft", "dataset.limit=6", "decoding.max_new_tokens=16", "tracking=off")
    build_library(cfg.library, fm, REPO, progress=False)
    folder, _ = run(cfg, tmp_path / "g", be=fm, progress=False)
    rows = [json.loads(x) for x in (folder.path / "outputs.jsonl").read_text().splitlines()]
    assert len(rows) == 6
    for r in rows:
        assert r["match"] == "exact"
        assert r["correct"], (r["problem_id"], r["completion"], r["gold_answer"])
        assert r["decode_tokens"] <= HANDFUL, (r["problem_id"], r["decode_tokens"])
    assert audit(folder).ok
