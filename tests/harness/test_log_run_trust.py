"""`make log-run` re-checks a folder before logging it (issue 41, finding 4): a real run folder of the tiny model
whose summary.json was edited to accuracy 1.000 (its rows score 0/3) is refused in one line naming `make rescore`
and nothing reaches MLflow; the intact folder is logged."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.config.schema import compose_config
from harness.run.loop import run
from kvstore import load_backend

REPO = Path(__file__).resolve().parents[2]


def _log_run_main():
    spec = importlib.util.spec_from_file_location("kvgraft_log_run", REPO / "scripts" / "log_run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def test_an_edited_summary_is_refused_and_the_intact_folder_logged(tmp_path, sqlite_uri, fast_mlflow, capsys):
    from mlflow import MlflowClient

    cfg = compose_config(["model=tiny_gemma3", "determinism.batch_invariant=false", f"project_root={REPO}",
                          f"runs_dir={tmp_path}/runs", "dataset.limit=3",
                          "decoding.max_new_tokens=4", "prompt.stop=[]", "tracking=off"])
    folder, summary = run(cfg, be=load_backend("transformers", source="tiny-gemma3"), progress=False)
    assert summary.scores.accuracy == 0.0
    path = folder.path / "summary.json"
    intact = path.read_text()
    edited = json.loads(intact)
    edited["scores"]["accuracy"] = 1.0
    path.write_text(json.dumps(edited))
    main = _log_run_main()
    capsys.readouterr()
    assert main([str(folder.path), "--tracking-uri", sqlite_uri]) == 1
    err = capsys.readouterr().err
    assert "does not re-check" in err and "scores.accuracy" in err and f"make rescore RUN={folder.path}" in err
    client = MlflowClient(tracking_uri=sqlite_uri)
    assert not any(client.search_runs([e.experiment_id]) for e in client.search_experiments())
    path.write_text(intact)
    assert main([str(folder.path), "--tracking-uri", sqlite_uri]) == 0
    [logged] = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    assert logged.data.metrics["accuracy"] == 0.0


@pytest.mark.slow
def test_a_compare_folder_whose_comparison_was_edited_is_refused_and_nothing_logged(tmp_path, sqlite_uri,
                                                                                    fast_mlflow, capsys):
    """Issue 51, item 9: `make log-run` of a compare folder whose comparison.json says accuracy 0.75 where its runs
    give 0.0 logged the edited figure on the comparison's MLflow run (each run was audited, the comparison not). It is
    refused now, naming the field, before any run of it is logged; the intact folder logs, with its figure."""
    from mlflow import MlflowClient

    from harness.compare import job as compare

    compare.main(["model=tiny_gemma3", f"project_root={REPO}", f"runs_dir={tmp_path}/runs", "dataset.limit=2",
                  "decoding.max_new_tokens=3", "tracking=off", f"library.root={tmp_path}/library",
                  f"library.store={tmp_path}/store"])
    [folder] = list((tmp_path / "runs" / "compare").iterdir())
    path = folder / "comparison.json"
    intact = path.read_text()
    edited = json.loads(intact)
    assert edited["summaries"]["baseline"]["scores"]["accuracy"] == 0.0
    edited["summaries"]["baseline"]["scores"]["accuracy"] = 0.75
    path.write_text(json.dumps(edited, indent=2))
    main = _log_run_main()
    capsys.readouterr()
    assert main([str(folder), "--tracking-uri", sqlite_uri]) == 1
    err = capsys.readouterr().err
    assert "does not re-check" in err and "summaries.baseline.scores.accuracy: recorded 0.75" in err, err
    show = [sys.executable, str(REPO / "scripts" / "show_comparison.py"), str(folder), "--width", "100"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # this checkout's harness, whatever the venv was installed from
    shown = subprocess.run(show, capture_output=True, text=True, timeout=300, check=False, env=env)
    assert shown.returncode == 2 and "summaries.baseline.scores.accuracy" in shown.stderr and shown.stdout == ""
    client = MlflowClient(tracking_uri=sqlite_uri)
    assert not any(client.search_runs([e.experiment_id]) for e in client.search_experiments())
    path.write_text(intact)
    shown = subprocess.run(show, capture_output=True, text=True, timeout=300, check=False, env=env)
    assert shown.returncode == 0 and "scores and tokens" in shown.stdout, shown.stderr
    table = folder / "per_problem.json"
    view = json.loads(table.read_text())
    view["rows"][0]["baseline ok"] = not view["rows"][0]["baseline ok"]  # the view's figure, not comparison.json
    table.write_text(json.dumps(view))
    shown = subprocess.run(show, capture_output=True, text=True, timeout=300, check=False, env=env)
    assert shown.returncode == 2 and "per_problem.json: row 1" in shown.stderr and "baseline ok" in shown.stderr
    assert main([str(folder), "--tracking-uri", sqlite_uri]) == 0
    logged = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    [parent] = [r for r in logged if r.data.tags.get("job") == "compare"]
    assert {r.data.tags.get("run_dir") for r in logged} >= {str(Path(p).resolve()) for p in edited["runs"].values()}
    assert not [k for k, v in parent.data.metrics.items() if "accuracy" in k and v == 0.75], parent.data.metrics
