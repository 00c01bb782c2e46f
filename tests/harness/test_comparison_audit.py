"""`make rescore` of a compare folder recomputes every figure of comparison.json from the runs it names and checks
those are the runs it was made from: each edit fails naming the field; the compare job reuses a baseline only if
it re-scores, and says why it passes one over. Tiny random-weight model (plumbing only)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from harness import rescore
from harness.compare import job as compare
from harness.compare.audit import audit_comparison
from harness.config.schema import compose_config
from harness.run.loop import run

REPO = Path(__file__).resolve().parents[2]


def _overrides(root: Path, *extra: str) -> list[str]:
    return ["model=tiny_gemma3", f"project_root={REPO}", f"runs_dir={root}/runs", "dataset.limit=2",
            "decoding.max_new_tokens=3", "tracking=off", f"library.root={root}/library", f"library.store={root}/store",
            *extra]


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> tuple[Path, Any]:
    """One compare job's folder and its comparison (the module's tests copy comparison.json and edit the copy)."""
    root = tmp_path_factory.mktemp("job")
    result = compare.main(_overrides(root))
    return next((root / "runs" / "compare").iterdir()), result


def _rescore(path: Path) -> int:
    return rescore.main([str(path)])


def _edited(job, tmp_path: Path, edit) -> Path:
    """A copy of the job's compare folder with comparison.json changed by `edit(d)`."""
    src, _ = job
    dst = tmp_path / "compare" / src.name
    shutil.copytree(src, dst)
    d = json.loads((dst / "comparison.json").read_text())
    edit(d)
    (dst / "comparison.json").write_text(json.dumps(d, indent=2))
    return dst


def _plus(field: str):
    def edit(d):  # as /work/shared/acceptance/runs does: +7.5 in every summary's comparison
        for s in d["summaries"].values():
            if s["comparison"] and isinstance(s["comparison"].get(field), (int, float)):
                s["comparison"][field] += 7.5
    return edit


def _swap(section: str, a: str, b: str):
    def edit(d):
        d[section][a], d[section][b] = d[section][b], d[section][a]
    return edit


def test_the_untouched_compare_folder_passes_and_records_each_runs_manifest(job, capsys):
    folder, result = job
    assert _rescore(folder) == 0
    assert "every figure recomputes" in capsys.readouterr().out
    for label, path in result.runs.items():
        manifest = json.loads((Path(path) / "manifest.json").read_text())
        assert (result.run_manifests or {})[label] == manifest["manifest_sha256"]
    assert audit_comparison(folder).ok


@pytest.mark.parametrize("edit, named", [
    (_plus("token_reduction"), "summaries.graft (held-out).comparison.token_reduction: recorded"),
    (_plus("accuracy_delta"), "summaries.incontext (recurring).comparison.accuracy_delta: recorded"),
    (_plus("baseline_accuracy"), "summaries.graft (recurring).comparison.baseline_accuracy: recorded"),
    (_swap("pairs", "recurring", "held_out"), "pairs.recurring.graft_run: recorded"),
    (_swap("runs", "graft (recurring)", "graft (held-out)"), "it is not the recurring run"),
    (lambda d: d["pairs"]["recurring"].update(identical_rows=5), "pairs.recurring.identical_rows: recorded 5"),
    (lambda d: d["summaries"]["baseline"]["scores"].update(accuracy=0.75), "summaries.baseline.scores.accuracy"),
    (lambda d: d["summaries"]["graft (held-out)"]["tokens"].update(decode=1), "graft (held-out).tokens.decode"),
    (lambda d: d["pairs"]["held_out"].update(graft_run=d["runs"]["graft (recurring)"]), "pairs.held_out.graft_run"),
    (lambda d: d.pop("run_manifests"), "no 'run_manifests'"),
    (lambda d: d["run_manifests"].update(baseline="0" * 64), "run_manifests.baseline: 0000000000000000.. but"),
    (lambda d: d["plan"]["pairs"].update(recurring=["truncated (recurring)", "incontext (recurring)"]),
     "pairs.recurring: truncated (recurring) row differs from its twin incontext (recurring)"),
    (lambda d: d["plan"]["runs"].remove("truncated (recurring)"), "plan.runs: ['baseline'"),
    (lambda d: d["summaries"]["truncated (recurring)"]["tokens"].update(prefill=1), "truncated (recurring).tokens"),
], ids=["token_reduction", "accuracy_delta", "baseline_accuracy", "pairs_swapped", "graft_runs_swapped",
        "identical_rows", "baseline_accuracy_score", "decode_tokens", "pair_repointed", "no_manifests",
        "manifest_edited", "plan_pair_repointed", "plan_run_dropped", "new_condition_figure"])
def test_each_edit_of_comparison_json_fails_rescore_naming_the_field(job, tmp_path, capsys, edit, named):
    folder = _edited(job, tmp_path, edit)
    assert _rescore(folder) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and named in out, out


def test_a_baseline_with_another_comparable_key_or_another_run_fails(job, tmp_path, capsys):
    _, result = job
    root = Path(result.runs["baseline"]).parents[2]
    other, _ = run(compose_config(_overrides(root, "decoding.max_new_tokens=4", "condition=baseline")),
                   tmp_path / "runs" / "baseline" / "other-key", progress=False)
    folder = _edited(job, tmp_path, lambda d: d["runs"].update(baseline=str(other.path)))
    assert _rescore(folder) == 1
    out = capsys.readouterr().out
    assert "comparison.json runs.baseline:" in out and "has comparable_key" in out
    assert "not the run the comparison was made from" in out
    again, _ = run(compose_config(_overrides(root, "condition=baseline")),
                   tmp_path / "runs" / "baseline" / "same-key", progress=False)  # same key, another run
    folder = _edited(job, tmp_path / "2", lambda d: d["runs"].update(baseline=str(again.path)))
    assert _rescore(folder) == 1
    out = capsys.readouterr().out
    assert "run_manifests.baseline" in out and "has comparable_key" not in out


def _baseline(root: Path, name: str) -> Path:
    folder, _ = run(compose_config(_overrides(root, "condition=baseline")),
                    root / "runs" / "baseline" / name, progress=False)
    return folder.path


@pytest.mark.parametrize("damage", ["outputs_missing", "summary_edited"])
def test_the_compare_job_reuses_only_a_baseline_that_rescores_and_says_why(tmp_path, capsys, damage):
    bad = _baseline(tmp_path, "bad")
    if damage == "outputs_missing":
        (bad / "outputs.jsonl").unlink()
    else:
        summary = json.loads((bad / "summary.json").read_text())
        summary["scores"]["accuracy"] = 0.75
        summary["tokens"]["decode"] = 999
        (bad / "summary.json").write_text(json.dumps(summary))
    capsys.readouterr()
    result = compare.main(_overrides(tmp_path))
    out = capsys.readouterr().out
    assert f"baseline {bad} not reused" in " ".join(out.split())
    assert ("outputs.jsonl: file is missing" if damage == "outputs_missing" else "does not re-score") in out
    assert "running the baseline first" in out
    assert result.runs["baseline"] != str(bad)
    assert result.summaries["baseline"].scores.accuracy != 0.75
    assert audit_comparison(next((tmp_path / "runs" / "compare").iterdir())).ok


def test_a_baseline_that_rescores_is_reused(tmp_path, capsys):
    good = _baseline(tmp_path, "good")
    capsys.readouterr()
    result = compare.main(_overrides(tmp_path))
    assert result.runs["baseline"] == str(good)
    assert f"matching baseline run: {good}" in " ".join(capsys.readouterr().out.split())


def _archive(job, tmp_path: Path) -> Path:
    """A copy of the job's whole runs/ folder elsewhere (compare folder and runs together); its compare folder."""
    src, _ = job
    shutil.copytree(src.parents[1], tmp_path / "archive" / "runs", ignore=shutil.ignore_patterns("mlflow*"))
    return tmp_path / "archive" / "runs" / "compare" / src.name


def test_a_copied_compare_folder_rechecks_the_runs_beside_it_not_the_originals(job, tmp_path, capsys):
    """Issue 31, finding 3: the runs are found through run_links (relative to the compare folder), so a copy is
    re-checked as the copy: intact, it passes with every run inside the copy; a tampered copy fails although the
    originals are intact."""
    _, result = job
    assert set(result.run_links) == set(result.runs)
    copy = _archive(job, tmp_path)
    assert _rescore(copy) == 0
    out = capsys.readouterr().out
    lines = [x for x in out.splitlines() if x.startswith("run ")]
    assert len(lines) == len(result.runs) and all(f"; {copy.parents[1]}/" in x and "(run_links)" in x for x in lines)
    run = copy.parents[1] / Path(result.runs["graft (recurring)"]).relative_to(Path(result.runs["baseline"]).parents[1])
    rows = (run / "outputs.jsonl").read_text().splitlines()
    first = json.loads(rows[0])
    first.update(correct=not first["correct"])
    (run / "outputs.jsonl").write_text("\n".join([json.dumps(first), *rows[1:]]) + "\n")
    assert _rescore(copy) == 1
    assert f"run 'graft (recurring)' ({run})" in capsys.readouterr().out
    assert _rescore(job[0]) == 0  # the originals still re-check


def test_an_older_comparison_with_relative_paths_rechecks_from_any_working_directory(job, tmp_path, capsys,
                                                                                      monkeypatch):
    """A comparison.json written before run_links, by a job with a relative runs_dir (paths like runs/baseline/<x>):
    the runs are found beside the compare folder, whatever the working directory (it used to decide)."""
    copy = _archive(job, tmp_path)
    d = json.loads((copy / "comparison.json").read_text())
    d.pop("run_links", None)
    rel = {k: str(Path("runs", *Path(v).parts[-2:])) for k, v in d["runs"].items()}
    for p in d["pairs"].values():
        p.update(graft_run=rel[next(k for k, v in d["runs"].items() if v == p["graft_run"])],
                 incontext_run=rel[next(k for k, v in d["runs"].items() if v == p["incontext_run"])])
    d["runs"] = rel
    (copy / "comparison.json").write_text(json.dumps(d, indent=2))
    for where in (tmp_path, copy, REPO):
        monkeypatch.chdir(where)
        assert _rescore(copy) == 0, capsys.readouterr().out
        assert capsys.readouterr().out.count("(beside the compare folder)") == len(rel)


def test_swapped_run_paths_fail_even_where_the_links_lead_to_the_right_runs(job, tmp_path, capsys):
    copy = _archive(job, tmp_path)
    d = json.loads((copy / "comparison.json").read_text())
    d["runs"]["graft (recurring)"], d["runs"]["graft (held-out)"] = d["runs"]["graft (held-out)"], \
        d["runs"]["graft (recurring)"]
    (copy / "comparison.json").write_text(json.dumps(d, indent=2))
    assert _rescore(copy) == 1
    assert "comparison.json runs.graft (recurring): names" in capsys.readouterr().out
