"""A whole run on the tiny random-weight model: run folder, manifest that re-scores, MLflow, graft condition
(recurring and held-out), and the compare job. Plumbing only: a random model's answers are noise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.compare.job import find_baseline
from harness.config.schema import compose_config, typed
from harness.library.build import build_library, open_library
from harness.record.audit import audit
from harness.run.loop import comparable_key, run
from harness.task.problems import load_problems
from kvstore import LocalStore, load_backend

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def fm():
    return load_backend("transformers", source="tiny-gemma3")


def _cfg(tmp: Path, *extra: str):
    return compose_config([
        "model=tiny_gemma3", f"project_root={REPO}", f"runs_dir={tmp}/runs", "dataset.limit=3",
        "determinism.batch_invariant=false",  # the mode of the model fixture these runs are handed
        "decoding.max_new_tokens=6", f"tracking.uri=sqlite:///{tmp}/mlflow.db", f"library.root={tmp}/library",
        f"library.store={tmp}/store", *extra,
    ])


def test_baseline_run_writes_a_folder_that_rescores(tmp_path, fm):
    folder, summary = run(_cfg(tmp_path), tmp_path / "runs" / "baseline" / "r1", be=fm, progress=False)
    d = folder.path
    assert summary == folder.read_summary()
    for name in ("config.yaml", "problems.jsonl", "outputs.jsonl", "summary.json", "manifest.json", "tracking.json"):
        assert (d / name).is_file(), name
    check = audit(folder)
    assert check.ok, check.findings
    rows = [json.loads(x) for x in (d / "outputs.jsonl").read_text().splitlines()]
    assert [r["problem_id"] for r in rows] == ["kvg-001", "kvg-002", "kvg-003"]
    assert all(r["grafted_tokens"] == 0 and r["prefill_tokens"] == r["prompt_tokens"] for r in rows)
    assert all(1 <= r["decode_tokens"] <= 6 for r in rows)
    assert all(r["energy_j"] is None or r["energy_j"] >= 0 for r in rows)
    tracking = json.loads((d / "tracking.json").read_text())
    assert tracking.get("run_id"), tracking


def test_sampling_draws_n_samples_per_problem_reproducibly(tmp_path, fm):
    cfg = _cfg(tmp_path, "decoding=sample", "decoding.n_samples=2", "dataset.limit=2", "tracking=off")
    a, _ = run(cfg, tmp_path / "a", be=fm, progress=False)
    b, _ = run(cfg, tmp_path / "b", be=fm, progress=False)
    a, b = a.path, b.path
    ra = [json.loads(x) for x in (a / "outputs.jsonl").read_text().splitlines()]
    rb = [json.loads(x) for x in (b / "outputs.jsonl").read_text().splitlines()]
    assert len(ra) == 4 and [r["sample"] for r in ra] == [0, 1, 0, 1]
    assert [r["completion_token_ids"] for r in ra] == [r["completion_token_ids"] for r in rb]
    assert "pass@2" in json.loads((a / "summary.json").read_text())["scores"]


def test_library_holds_only_verified_entries_and_graft_recurring_uses_the_problem_itself(tmp_path, fm):
    cfg = _cfg(tmp_path, "condition=graft", "tracking=off")
    path = build_library(cfg.library, fm, REPO, progress=False)
    lib = open_library(cfg.library, fm, REPO)
    assert len(lib.entries) == 40 and all(e.verification["correct"] for e in lib.entries)
    assert json.loads((path / "manifest.json").read_text())["n_entries"] == 40
    folder, _ = run(cfg, tmp_path / "g", be=fm, progress=False)
    d = folder.path
    rows = [json.loads(x) for x in (d / "outputs.jsonl").read_text().splitlines()]
    by_id = {e.problem_id: e for e in lib.entries}
    for r in rows:
        assert r["match"] == "exact" and r["artifact_id"] == by_id[r["problem_id"]].artifact_id
        assert r["grafted_tokens"] == by_id[r["problem_id"]].tokens
        assert r["prefill_tokens"] == r["prompt_tokens"] - r["grafted_tokens"]
    assert audit(folder).ok


def test_held_out_graft_never_puts_the_evaluated_problem_in_the_context(tmp_path, fm):
    cfg = _cfg(tmp_path, "condition=graft", "library.exclude_self=true", "tracking=off", "dataset.limit=5")
    build_library(cfg.library, fm, REPO, progress=False)
    lib = open_library(cfg.library, fm, REPO)
    store = LocalStore(tmp_path / "store")
    folder, _ = run(cfg, tmp_path / "h", be=fm, progress=False)
    d = folder.path
    rows = [json.loads(x) for x in (d / "outputs.jsonl").read_text().splitlines()]
    problems = {p.id: p for p in load_problems(str(REPO / "problems/kvgraft_original.jsonl"))}
    own_artifact = {e.problem_id: e.artifact_id for e in lib.entries}
    for r in rows:
        assert r["match"] == "bm25"
        assert r["artifact_id"] != own_artifact[r["problem_id"]]
        grafted = store.get(r["artifact_id"]).token_ids
        assert r["prompt_token_ids"][: len(grafted)] == grafted
        problem_ids = fm.encode(problems[r["problem_id"]].problem, add_bos=False)
        hay = grafted
        assert not any(hay[i : i + len(problem_ids)] == problem_ids for i in range(len(hay) - len(problem_ids) + 1))
    summary = json.loads((d / "summary.json").read_text())
    assert set(summary["groups"]) == {"held_out"}


def test_compare_finds_the_matching_baseline_by_comparable_key(tmp_path, fm):
    cfg = _cfg(tmp_path, "tracking=off", "dataset.limit=2")
    folder, _ = run(cfg, tmp_path / "runs" / "baseline" / "b", be=fm, progress=False)
    assert find_baseline(tmp_path / "runs", comparable_key(typed(cfg), fm)) == folder
    other = _cfg(tmp_path, "tracking=off", "dataset.limit=2", "decoding.max_new_tokens=7")
    assert find_baseline(tmp_path / "runs", comparable_key(typed(other), fm)) is None


def test_batched_sampling_run_reproduces_records_seeds_and_rescores(tmp_path, fm):
    cfg = _cfg(tmp_path, "decoding=sample", "decoding.n_samples=4", "decoding.batch_size=3", "dataset.limit=2",
               "decoding.max_new_tokens=5", "tracking=off", "condition=graft")
    a, sa = run(cfg, tmp_path / "a", be=fm, progress=False, build_library_if_missing=True)
    b, _ = run(cfg, tmp_path / "b", be=fm, progress=False)
    ra, rb = a.read_rows(), b.read_rows()
    assert [(r.problem_id, r.sample, r.completion.seed) for r in ra] == [
        (p, s, s) for p in ("kvg-001", "kvg-002") for s in range(4)]  # chunks of 3 + 1, seeds = seed + sample
    assert [r.completion.token_ids for r in ra] == [r.completion.token_ids for r in rb]
    assert [r.completion.first_logits_sha256 for r in ra] == [r.completion.first_logits_sha256 for r in rb]
    assert sum((sa.stop_reasons or {}).values()) == 8 and sa.scores.n_samples == 4 and 4 in sa.scores.pass_at
    assert audit(a).ok, audit(a).findings
    one = _cfg(tmp_path, "decoding=sample", "decoding.n_samples=4", "dataset.limit=2", "decoding.max_new_tokens=5",
               "tracking=off", "condition=graft")
    assert comparable_key(typed(cfg), fm) != comparable_key(typed(one), fm)  # the batch size is part of what the bits depend on


def test_a_resumed_batched_run_redoes_a_cut_batch_whole_and_matches_the_uninterrupted_rows(tmp_path, fm):
    from harness.config.schema import recorded
    from harness.record.folder import RunFolder
    from harness.run.loop import resume_key

    cfg = _cfg(tmp_path, "decoding=sample", "decoding.n_samples=4", "decoding.batch_size=2", "dataset.limit=2",
               "tracking=off")
    clean, _ = run(cfg, tmp_path / "clean", be=fm, progress=False)
    rows = clean.read_rows()
    problems = load_problems(str(REPO / cfg.dataset.path), limit=2)
    key = resume_key(recorded(cfg), problems, fm, None)  # the resolved config as a run records it
    cut = RunFolder(tmp_path / "runs" / "baseline" / "cut")
    cut.begin(key, "2026-01-01T00:00:00+00:00")
    for r in rows[:3]:  # the second batch (samples 2, 3 of the first problem) was cut after one row
        cut.append(r)
    cut.release()
    resumed, summary = run(cfg, be=fm, progress=False)  # the same config: finds the cut run under runs/baseline
    assert resumed == cut and audit(resumed).ok
    timing = {"wall_s", "cpu_s", "energy_j", "energy_status", "ttft_s"}
    strip = lambda rs: [{k: v for k, v in r.to_json().items() if k not in timing} for r in rs]  # noqa: E731
    assert strip(resumed.read_rows()) == strip(rows) and summary.started_at == "2026-01-01T00:00:00+00:00"
    assert resumed.read_rows()[:2] == rows[:2]  # the whole first batch was kept as it was, timings included
    assert resumed.read_rows()[2] != rows[2]  # the cut batch was decoded again (its timing differs)
