"""The compare job computes the comparison in memory from the runs' Summaries and writes it once: nothing it
wrote is read back from disk. Uses the tiny random-weight model (plumbing only)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import ModuleType

import pytest

from harness import rescore
from harness.compare import comparison
from harness.compare import job as compare
from harness.record.folder import RunFolder
from harness.record.rows import Summary

REPO = Path(__file__).resolve().parents[2]


def _summary(fakerun: ModuleType, condition: str, decode_scale: int, wall: float) -> Summary:
    s = Summary.of(fakerun.make_rows(condition), condition=condition, model="toy", dataset="toy", run_dir=condition,
                   comparable_key="k", run_wall_s=1.0, energy_status="unavailable:test", energy_j=None,
                   group=None)
    return dataclasses.replace(s, tokens=dataclasses.replace(s.tokens, decode=s.tokens.decode // decode_scale),
                               time=dataclasses.replace(s.time, wall_s=wall))


def test_comparison_is_computed_from_summaries(fakerun: ModuleType, tmp_path: Path) -> None:
    base = _summary(fakerun, "baseline", 1, 4.0)
    graft = _summary(fakerun, "graft", 4, 1.0)
    folders = {"baseline": RunFolder(tmp_path / "b"), "graft (recurring)": RunFolder(tmp_path / "g")}
    result = comparison.comparison("k", folders, {"baseline": base, "graft (recurring)": graft})
    assert set(result.to_json()) == {"comparable_key", "runs", "summaries"}
    assert result.summaries["baseline"].comparison is None
    c = result.summaries["graft (recurring)"].comparison
    assert c is not None and c.token_reduction == pytest.approx(base.tokens.decode / graft.tokens.decode)
    assert c.wall_factor == pytest.approx(4.0)
    assert c.energy_factor is None and c.energy_status.startswith("unavailable")
    assert c.baseline_run == "baseline" and c.accuracy_delta == 0
    # the typed record round-trips through its JSON
    assert comparison.Comparison.from_json(json.loads(json.dumps(result.to_json()))) == result


def _no_read_back(monkeypatch) -> None:
    def no_read_back(original):
        def read(self, name="", *args, **kwargs):
            raise AssertionError(f"the compare job read {self.path} back from disk")
        return read

    for name in ("read_summary", "read_rows", "read_json", "read_jsonl", "read_config", "read_bytes", "read_tracking",
                 "read_manifest", "read_problems"):
        monkeypatch.setattr(RunFolder, name, no_read_back(getattr(RunFolder, name)))


def test_compare_job_with_tracking_reads_nothing_it_wrote(tmp_path: Path, monkeypatch, sqlite_uri: str) -> None:
    """With MLflow on, each run and the comparison are logged from the records the job holds (harness.tracking.log:
    log_run, log_comparison with records and run ids): no run file, summary or tracking.json is read back."""
    from mlflow import MlflowClient

    _no_read_back(monkeypatch)
    result = _compare(tmp_path, f"tracking.uri={sqlite_uri}", "tracking.traces=false", "tracking.enabled=true")
    client = MlflowClient(tracking_uri=sqlite_uri)
    runs = client.search_runs([client.get_experiment_by_name("kvgraft-aime").experiment_id])
    [parent] = [r for r in runs if r.data.tags.get("job") == "compare"]
    pid = parent.info.run_id
    linked = {r.data.tags.get("condition") for r in runs if r.data.tags.get("compare_run") == pid}
    assert linked == {"baseline", "incontext", "graft", "truncated"}  # listed flat in the headline view, linked
    assert {r.data.tags.get("condition") for r in runs if r.data.tags.get("mlflow.parentRunId") == pid} == {"library"}
    assert parent.data.metrics["truncated_recurring.accuracy"] == result.summaries["truncated (recurring)"].scores.accuracy


def test_compare_job_reads_nothing_it_wrote(tmp_path: Path, monkeypatch) -> None:
    """Not even each run's manifest SHA-256 (comparison.json records it to bind itself to those runs): the job
    holds every record it wrote (RunFolder.finish returns it)."""
    _no_read_back(monkeypatch)
    result = compare.main([
        "model=tiny_gemma3", f"project_root={REPO}", f"runs_dir={tmp_path}/runs", "dataset.limit=2",
        "decoding.max_new_tokens=3", "tracking=off", f"library.root={tmp_path}/library", f"library.store={tmp_path}/store",
    ])
    planned = ["baseline", "incontext (recurring)", "graft (recurring)", "incontext (held-out)", "graft (held-out)",
               "truncated (recurring)"]  # configs/compare/graft.yaml, in its order
    assert list(result.summaries) == planned and result.plan.labels == planned and result.plan_recorded
    assert result.plan.pairs == {"recurring": ("graft (recurring)", "incontext (recurring)"),
                                 "held_out": ("graft (held-out)", "incontext (held-out)")}
    for group in ("recurring", "held_out"):
        p = (result.pairs or {})[group].pairing
        assert (p.identical, p.differing, p.differences) == (2, 0, []), p
    s = result.summaries
    assert set(s["baseline"].stop_reasons or {}) == {"eos", "stop", "length"}
    assert (s["graft (recurring)"].groups or {})["recurring"].n_problems == 2
    assert set(s["graft (held-out)"].groups or {}) == {"held_out"}
    assert s["baseline"].tokens.grafted == 0
    written = list((tmp_path / "runs" / "compare").glob("*/comparison.json"))
    on_disk = json.loads(written[0].read_text())
    assert len(written) == 1 and on_disk == json.loads(json.dumps(result.to_json()))
    assert comparison.Comparison.from_json(on_disk) == result  # what the views read is what the job held
    for label, path in result.runs.items():
        assert (Path(path) / "manifest.json").is_file(), label
    assert Path(result.runs["graft (held-out)"]).name.endswith("-held_out")
    assert Path(result.runs["incontext (held-out)"]).parent.name == "incontext"


def _compare(tmp_path: Path, *extra: str) -> comparison.Comparison:
    return compare.main([
        "model=tiny_gemma3", f"project_root={REPO}", f"runs_dir={tmp_path}/runs", "dataset.limit=2",
        "decoding.max_new_tokens=3", "tracking=off", f"library.root={tmp_path}/library",
        f"library.store={tmp_path}/store", *extra,
    ])


def _rescore(path: Path) -> int:
    return rescore.main([str(path)])


def _edit_first_row(path: Path, change) -> None:
    lines = path.read_text().splitlines()
    row = json.loads(lines[0])
    change(row)
    lines[0] = json.dumps(row, ensure_ascii=False)
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("tamper", ["first_logits_sha256", "completion_token_ids"])
@pytest.mark.slow
def test_rescore_of_a_compare_folder_rechecks_the_pairing_and_fails_on_a_tampered_row(tmp_path, tamper, capsys):
    result = _compare(tmp_path)
    compare_dir = next((tmp_path / "runs" / "compare").iterdir())
    assert _rescore(compare_dir) == 0
    out = capsys.readouterr().out
    assert "pairing recurring: 2/2" in out and "pairing held_out: 2/2" in out

    def change(row):
        if tamper == "first_logits_sha256":
            row["first_logits_sha256"] = "0" * 64
        else:
            row["completion_token_ids"] = [*row["completion_token_ids"], 7]

    _edit_first_row(Path(result.runs["graft (recurring)"]) / "outputs.jsonl", change)
    assert _rescore(compare_dir) == 1
    out = capsys.readouterr().out
    assert "graft (recurring) row differs from its twin incontext (recurring): problem_id='kvg-001', sample=0" in out
    assert ("first_logits_sha256" if tamper == "first_logits_sha256" else "completion token ids") in out


def test_a_graft_row_differing_from_its_incontext_twin_fails_the_job_loudly(tmp_path, monkeypatch, capsys):
    from harness.run.conditions import Baseline, InContext

    # a broken control: the query alone instead of the entry, so the twins cannot agree
    monkeypatch.setattr(InContext, "context", lambda self, problem: Baseline.context(self, problem))
    with pytest.raises(SystemExit) as exc:
        _compare(tmp_path)
    assert exc.value.code == 1
    err = capsys.readouterr().err
    assert "row(s) differ from their twin" in err and "graft (recurring) problem_id='kvg-001', sample=0" in err
    written = json.loads(next((tmp_path / "runs" / "compare").glob("*/comparison.json")).read_text())
    assert written["pairs"]["recurring"]["differing_rows"] == 2  # written before the job fails
