"""RunFolder and the typed record: write, read back, audit; partial rows survive; tampering with the
recurring/held-out split is caught; the folder name has one spelling."""

from __future__ import annotations

import dataclasses
import json
import re
from datetime import datetime
from pathlib import Path
from types import ModuleType

import pytest

from harness.config.schema import CONFIG_DIR
from harness.errors import RunFolderError
from harness.record.audit import audit
from harness.record.folder import MANIFEST, OUTPUTS, PARTIAL, STAMP_FORMAT, RunFolder
from harness.record.hashing import write_jsonl
from harness.record.rows import (
    Completion,
    Group,
    Retrieval,
    Row,
    Summary,
    group_for,
    group_note,
    legacy_row_group,
    run_group,
)

# outputs.jsonl keys as harness/RUN_FORMAT.md documents them
ROW_KEYS = {
    "problem_id", "sample", "condition", "group", "prompt", "prompt_token_ids", "completion", "completion_token_ids",
    "stop_reason", "gold_answer", "extracted", "answer", "correct", "prompt_tokens", "prefill_tokens",
    "grafted_tokens", "decode_tokens", "first_logits_sha256", "ttft_s", "seed", "wall_s", "cpu_s", "energy_j",
    "energy_status", "entry_id", "artifact_id", "similarity", "match",
}


def test_a_row_keeps_the_documented_keys_and_round_trips(fakerun: ModuleType) -> None:
    for row in fakerun.make_rows():
        d = row.to_json()
        assert set(d) == ROW_KEYS
        assert d["prompt_tokens"] == len(d["prompt_token_ids"])
        assert Row.from_json(json.loads(json.dumps(d))) == row


def test_folder_reads_back_the_records_it_wrote(fake_run: Path, fakerun: ModuleType) -> None:
    folder = RunFolder(fake_run)
    assert folder.is_complete() and not folder.file(PARTIAL).exists()
    assert folder.read_rows() == fakerun.make_rows()
    summary = folder.read_summary()
    assert isinstance(summary, Summary) and summary.scores.correct == 2 and summary.tokens.grafted == 0
    assert folder.read_config()["decoding"]["max_new_tokens"] == 64
    assert [p["id"] for p in folder.read_problems()] == ["toy-1", "toy-2"]


def test_rows_appended_before_an_interrupt_are_on_disk(tmp_path: Path, fakerun: ModuleType) -> None:
    folder = RunFolder(tmp_path / "r")
    folder.begin()
    rows = fakerun.make_rows()[:2]
    for row in rows:
        folder.append(row)
    assert RunFolder(tmp_path / "r").read_rows(partial=True) == rows  # e.g. the process died here
    assert not folder.is_complete()
    folder.begin()  # a new attempt in the same folder starts clean
    assert not folder.file(PARTIAL).exists()


def test_the_manifest_is_written_last(tmp_path: Path, fakerun: ModuleType, monkeypatch) -> None:
    import harness.record.folder as rf

    order: list[str] = []
    for name in ("write_json", "write_jsonl", "atomic_write_text"):
        real = getattr(rf, name)
        monkeypatch.setattr(rf, name, lambda path, obj, _real=real: (order.append(Path(path).name), _real(path, obj)))
    fakerun.build_fake_run(tmp_path / "r")
    assert order[-1] == MANIFEST and order.count(MANIFEST) == 1
    assert set(order) == {"config.yaml", "problems.jsonl", "outputs.jsonl", "summary.json", MANIFEST}


def test_reading_a_damaged_row_names_file_line_and_field(fake_run: Path) -> None:
    rows = [json.loads(x) for x in (fake_run / OUTPUTS).read_text().splitlines()]
    del rows[1]["decode_tokens"]
    write_jsonl(fake_run / OUTPUTS, rows)
    with pytest.raises(RunFolderError, match=r"outputs.jsonl, line 2: field 'decode_tokens' is missing"):
        RunFolder(fake_run).read_rows()


def test_one_group_rule_for_the_run_and_its_rows() -> None:
    assert group_for(False) is Group.RECURRING and group_for(True) is Group.HELD_OUT
    assert Group.parse("held-out") is Group.HELD_OUT and Group.parse("held_out") is Group.HELD_OUT
    assert Group.HELD_OUT.label == "held-out" and Group.HELD_OUT.value == "held_out"
    with pytest.raises(ValueError, match="'held' is not one of recurring, held-out"):
        Group.parse("held")
    # folders written before the run's group was recorded: the old per-row rule, for their audit only
    assert legacy_row_group("exact") is Group.RECURRING and legacy_row_group("bm25") is Group.HELD_OUT


def _graft_run(tmp_path: Path, fakerun: ModuleType, *, exclude_self: bool, match: str | list[str]) -> RunFolder:
    """A fake graft run folder whose rows carry `match` (one per row, or the same for all) and its run's group."""
    rows = []
    group = group_for(exclude_self)
    for i, r in enumerate(fakerun.make_rows("graft")):
        c = r.completion
        m = match if isinstance(match, str) else match[i]
        grafted = Completion(c.prompt, [7, 7, *c.context_ids], c.text, c.token_ids, c.stop_reason, c.prefill_tokens, 2,
                             c.decode_tokens, retrieval=Retrieval("e1", "f" * 64, 1.0, m))
        rows.append(Row(r.problem_id, r.sample, "graft", group.value, grafted, r.gold, r.extracted, r.answer,
                        r.correct, r.wall_s, r.cpu_s, r.energy_j, r.energy_status))
    summary = Summary.of(rows, condition="graft", model="toy", dataset="toy", run_dir=str(tmp_path), comparable_key="k",
                         run_wall_s=1.0, energy_status="unavailable:test", energy_j=None, group=group)
    config = {**fakerun.CONFIG, "library": {"exclude_self": exclude_self}}
    folder = RunFolder(tmp_path / f"graft-{match}-{exclude_self}")
    folder.finish(config=config, problems=fakerun.PROBLEMS, rows=rows, summary=summary, prompt_template="t",
                  model_fingerprint="a" * 64, tokenizer_fingerprint="b" * 64, determinism={}, environment={})
    return folder


def test_a_recurring_run_whose_library_lacks_a_problem_says_so(tmp_path: Path, fakerun: ModuleType) -> None:
    folder = _graft_run(tmp_path, fakerun, exclude_self=False, match=["exact", "bm25", "exact"])
    assert audit(folder).ok, audit(folder).findings
    s = folder.read_summary()
    assert s.group == "recurring" and s.own_entry_rows == 2 and set(s.groups or {}) == {"recurring"}
    assert "1 of 3 rows found no library entry of their own" in (group_note(s) or "")
    assert run_group(s) is Group.RECURRING


def test_a_graft_run_with_groups_audits_clean(tmp_path: Path, fakerun: ModuleType) -> None:
    folder = _graft_run(tmp_path, fakerun, exclude_self=False, match="exact")
    check = audit(folder)
    assert check.ok, check.findings
    assert set(folder.read_summary().groups or {}) == {"recurring"}
    assert group_note(folder.read_summary()) is None


def test_a_row_moved_to_the_other_group_is_caught(tmp_path: Path, fakerun: ModuleType) -> None:
    folder = _graft_run(tmp_path, fakerun, exclude_self=True, match="bm25")
    rows = [json.loads(x) for x in folder.file(OUTPUTS).read_text().splitlines()]
    rows[0]["group"] = "recurring"
    write_jsonl(folder.file(OUTPUTS), rows)
    findings = audit(folder).findings
    assert any("line 1" in f and "group 'recurring' but the run's group" in f for f in findings), findings
    assert any("groups.held_out" in f or "groups.recurring" in f for f in findings), findings


def test_a_held_out_run_that_matched_its_own_problem_is_caught(tmp_path: Path, fakerun: ModuleType) -> None:
    folder = _graft_run(tmp_path, fakerun, exclude_self=True, match="exact")  # as if exclude_self was ignored
    findings = audit(folder).findings
    assert len([f for f in findings if "library.exclude_self=true but the match is 'exact'" in f]) == 3, findings


def test_a_new_folder_name_follows_the_one_stamp_format(tmp_path: Path) -> None:
    folder = RunFolder.new(tmp_path, "graft", "held_out")
    assert folder.path.parent == tmp_path / "graft"
    stamp, label = folder.name.rsplit("-", 1)
    assert label == "held_out"
    datetime.strptime(stamp, STAMP_FORMAT)
    hydra_dir = re.search(r"dir: \$\{kvgraft.claim_dir:\$\{kvgraft.under:\$\{project_root\},\$\{runs_dir\}\}/"
                          r"\$\{condition.name\},\$\{now:(.+)\}\}",
                          (CONFIG_DIR / "config.yaml").read_text())
    assert hydra_dir and hydra_dir.group(1) == STAMP_FORMAT


def test_find_lists_complete_run_folders_only(tmp_path: Path, fakerun: ModuleType) -> None:
    done = fakerun.build_fake_run(tmp_path / "runs" / "baseline" / "a")
    fakerun.build_fake_run(tmp_path / "runs" / "mlartifacts" / "x" / "a")  # MLflow's copy: not a run
    RunFolder(tmp_path / "runs" / "baseline" / "b").begin()  # interrupted: no manifest
    assert list(RunFolder.find(tmp_path / "runs")) == [RunFolder(done)]


def test_resume_drops_a_last_line_the_kill_cut_off_and_rewrites_the_file(tmp_path: Path, fakerun: ModuleType) -> None:
    rows = fakerun.make_rows()
    folder = RunFolder(tmp_path / "r")
    folder.begin("key-1", "2026-01-01T00:00:00+00:00")
    for r in rows[:2]:
        folder.append(r)
    torn = json.dumps(rows[2].to_json())[:40].encode()  # killed in the middle of the third row's write
    with folder.file(PARTIAL).open("ab") as f:
        f.write(torn)
    folder.release()
    again = RunFolder(folder.path)
    assert again.resume() == rows[:2]
    assert folder.file(PARTIAL).read_bytes().endswith(b"}\n") and folder.file(PARTIAL).read_bytes().count(b"\n") == 2
    again.release()


def test_a_bad_line_inside_the_partial_rows_is_named(tmp_path: Path, fakerun: ModuleType) -> None:
    folder = RunFolder(tmp_path / "r")
    folder.begin("k")
    folder.file(PARTIAL).write_bytes(b'{"not": "a row"}\n' + json.dumps(fakerun.make_rows()[0].to_json()).encode() + b"\n")
    folder.release()
    with pytest.raises(RunFolderError, match=r"outputs.partial.jsonl, line 1: .*run.fresh=true"):
        RunFolder(folder.path).resume()


def test_a_folder_whose_writer_lives_is_never_resumed_and_never_shared(tmp_path: Path) -> None:
    live = RunFolder(tmp_path / "runs" / "a")
    live.begin("same-key")  # holds run.lock, as a running process does
    assert RunFolder.find_resumable(tmp_path / "runs", "same-key") is None
    with pytest.raises(RunFolderError, match="another process is writing this run folder"):
        RunFolder(live.path).begin("same-key")
    live.release()  # the writer died: its flock is gone with it
    found = RunFolder.find_resumable(tmp_path / "runs", "same-key")
    assert found == live and RunFolder.find_resumable(tmp_path / "runs", "other-key") is None
    found.release()


def test_discard_removes_a_folder_without_rows_and_keeps_one_with_rows(tmp_path: Path, fakerun: ModuleType) -> None:
    empty = RunFolder(tmp_path / "empty")
    empty.begin("k")
    (empty.path / ".hydra").mkdir()
    (empty.path / "__main__.log").write_text("")
    assert empty.discard() and not empty.path.exists()
    with_rows = RunFolder(tmp_path / "rows")
    with_rows.begin("k")
    with_rows.append(fakerun.make_rows()[0])
    assert not with_rows.discard() and with_rows.file(PARTIAL).is_file()
    foreign = RunFolder(tmp_path / "foreign")
    foreign.begin("k")
    (foreign.path / "notes.txt").write_text("mine")
    assert not foreign.discard() and (foreign.path / "notes.txt").is_file()


def test_a_folder_written_before_the_run_group_still_audits_by_the_old_row_rule(tmp_path: Path,
                                                                                fakerun: ModuleType) -> None:
    matches = ["exact", "bm25", "exact"]
    rows = []
    for r, m in zip(fakerun.make_rows("graft"), matches, strict=True):
        c = dataclasses.replace(r.completion, retrieval=Retrieval("e1", "f" * 64, 1.0, m))
        rows.append(dataclasses.replace(r, condition="graft", group=legacy_row_group(m).value, completion=c))
    summary = Summary.of(rows, condition="graft", model="toy", dataset="toy", run_dir=str(tmp_path), comparable_key="k",
                         run_wall_s=1.0, energy_status="unavailable:test", energy_j=None, group=Group.RECURRING)
    summary = dataclasses.replace(summary, group=None, own_entry_rows=None)  # as written before they existed
    folder = RunFolder(tmp_path / "old")
    folder.finish(config={**fakerun.CONFIG, "library": {"exclude_self": False}}, problems=fakerun.PROBLEMS, rows=rows,
                  summary=summary, prompt_template="t", model_fingerprint="a" * 64, tokenizer_fingerprint="b" * 64,
                  determinism={}, environment={})
    assert audit(folder).ok, audit(folder).findings
    assert set(folder.read_summary().groups or {}) == {"recurring", "held_out"}
    assert run_group(folder.read_summary(), {"library": {"exclude_self": False}}) is Group.RECURRING
