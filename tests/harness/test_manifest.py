"""Manifests and re-scoring: an untouched run verifies; every kind of tampering is caught and named."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from harness.errors import ManifestError, RunFolderError
from harness.record.audit import audit
from harness.record.folder import RunFolder
from harness.record.hashing import (
    atomic_write_bytes,
    canonical_json,
    sha256_hex,
    sha256_json,
    write_json,
    write_jsonl,
)
from harness.record.manifest import build_manifest


def _audit(run_dir: Path):
    return audit(RunFolder(run_dir))


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _edit_row(run_dir: Path, index: int, **changes: Any) -> None:
    rows = _read_jsonl(run_dir / "outputs.jsonl")
    rows[index].update(changes)
    write_jsonl(run_dir / "outputs.jsonl", rows)


def _rescore(repo_root: Path, run_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(repo_root / "scripts" / "rescore.py"), str(run_dir), *extra],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


# --- hashing helpers --------------------------------------------------------------------------------


def test_canonical_json_is_sorted_compact_utf8() -> None:
    assert canonical_json({"b": 1, "a": ["é", None]}) == '{"a":["é",null],"b":1}'.encode()
    assert sha256_json({"a": 1, "b": 2}) == sha256_json({"b": 2, "a": 1})
    assert sha256_hex(b"") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def test_atomic_write_leaves_old_file_and_no_temp_on_failure(tmp_path: Path) -> None:
    target = tmp_path / "x.json"
    write_json(target, {"v": 1})
    with pytest.raises(TypeError):
        write_json(target, {"v": object()})  # fails while encoding: nothing is replaced
    atomic_write_bytes(tmp_path / "y.bin", b"abc")
    assert json.loads(target.read_text()) == {"v": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json", "y.bin"]


# --- build_manifest ---------------------------------------------------------------------------------


def test_manifest_has_the_run_format_fields(fake_run: Path, fakerun: ModuleType) -> None:
    manifest = json.loads((fake_run / "manifest.json").read_text())
    assert manifest["format"] == "kvgraft-manifest/1"
    inputs, outputs = manifest["inputs"], manifest["outputs"]
    assert set(inputs) >= {
        "problems", "prompt_template", "config", "model_fingerprint", "tokenizer_fingerprint",
        "code", "packages", "environment", "determinism", "artifacts",
    }
    assert inputs["problems"] == {p["id"]: sha256_json(p) for p in fakerun.PROBLEMS}
    assert inputs["prompt_template"] == sha256_hex(fakerun.PROMPT_TEMPLATE.encode())
    assert set(inputs["code"]) == {"commit", "dirty"}
    assert "torch" in inputs["packages"] and "mlflow" in inputs["packages"]
    assert inputs["artifacts"] == []
    assert outputs["outputs_sha256"] == sha256_hex((fake_run / "outputs.jsonl").read_bytes())
    assert [(r["problem_id"], r["sample"]) for r in outputs["rows"]] == [
        ("toy-1", 0),
        ("toy-1", 1),
        ("toy-2", 0),
    ]
    assert [r["correct"] for r in outputs["rows"]] == [True, False, True]
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    assert manifest["manifest_sha256"] == sha256_json(body)


def test_build_manifest_rejects_bytes_that_are_not_the_rows(fakerun: ModuleType) -> None:
    rows = [r.to_json() for r in fakerun.make_rows()]
    with pytest.raises(ManifestError, match="outputs_bytes"):
        build_manifest(
            problems=fakerun.PROBLEMS, prompt_template="t", config={}, model_fingerprint="m",
            tokenizer_fingerprint="t", determinism={}, environment={}, rows=rows,
            outputs_bytes=b"not the rows\n", summary={},
        )


# --- audit -------------------------------------------------------------------------------------------


def test_untouched_run_verifies(fake_run: Path) -> None:
    check = _audit(fake_run)
    assert check.ok, check.findings
    assert check.findings == []
    assert check.n_rows == 3
    assert check.scores["accuracy"] == pytest.approx(0.75)
    assert check.scores == check.recorded_scores


def test_one_changed_byte_in_a_completion_is_caught_and_the_row_named(fake_run: Path) -> None:
    path = fake_run / "outputs.jsonl"
    data = bytearray(path.read_bytes())
    line2 = data.index(b"\n") + 1
    i = data.index(b'"completion":"', line2) + len(b'"completion":"') + 3  # "Add" -> "Adx"
    data[i] = ord("x")
    path.write_bytes(bytes(data))
    check = _audit(fake_run)
    assert not check.ok
    text = "\n".join(check.findings)
    assert "outputs.jsonl: SHA-256" in text
    row_msgs = [p for p in check.findings if p.startswith("outputs.jsonl line 2 ")]
    assert row_msgs, check.findings
    assert all("problem_id='toy-1'" in m and "sample=1" in m for m in row_msgs)
    assert any("completion_sha256" in m for m in row_msgs)
    assert not any("line 1 " in p or "line 3 " in p for p in check.findings)


def test_edited_correct_flag_is_caught(fake_run: Path) -> None:
    _edit_row(fake_run, 1, correct=True)  # the wrong sample claims to be right
    check = _audit(fake_run)
    assert not check.ok
    assert any("line 2" in p and "'correct'" in p and "re-scoring" in p for p in check.findings), (
        check.findings
    )
    assert any("row_sha256" in p for p in check.findings)


def test_edited_summary_accuracy_is_caught(fake_run: Path) -> None:
    summary = json.loads((fake_run / "summary.json").read_text())
    summary["scores"]["accuracy"] = 1.0
    write_json(fake_run / "summary.json", summary)
    check = _audit(fake_run)
    assert not check.ok
    assert any("summary.json: scores.accuracy is 1.0" in p for p in check.findings), check.findings
    assert any("summary_sha256" in p for p in check.findings)
    assert check.scores["accuracy"] == pytest.approx(0.75)


def test_edited_problem_answer_is_caught(fake_run: Path) -> None:
    problems = _read_jsonl(fake_run / "problems.jsonl")
    problems[1]["answer"] = "10"
    write_jsonl(fake_run / "problems.jsonl", problems)
    check = _audit(fake_run)
    assert not check.ok
    assert any(p.startswith("problems.jsonl line 2 (id='toy-2')") for p in check.findings), check.findings
    assert any("gold_answer" in p and "toy-2" in p for p in check.findings)


def test_manifest_self_hash_tamper_is_caught(fake_run: Path) -> None:
    manifest = json.loads((fake_run / "manifest.json").read_text())
    manifest["inputs"]["model_fingerprint"] = "c" * 64
    write_json(fake_run / "manifest.json", manifest)
    check = _audit(fake_run)
    assert not check.ok
    assert any(p.startswith("manifest.json: manifest_sha256") for p in check.findings), check.findings


def test_edited_config_is_caught(fake_run: Path) -> None:
    text = (fake_run / "config.yaml").read_text().replace("max_new_tokens: 64", "max_new_tokens: 65")
    (fake_run / "config.yaml").write_text(text)
    check = _audit(fake_run)
    assert [p for p in check.findings if p.startswith("config.yaml")], check.findings


def test_measured_energy_without_joules_is_caught(fake_run: Path) -> None:
    _edit_row(fake_run, 0, energy_status="measured:nvml", energy_j=None)
    check = _audit(fake_run)
    assert any("line 1" in p and "energy" in p and "estimated under its method's name" in p for p in check.findings)


def test_an_estimate_under_another_name_is_caught_and_a_labelled_one_passes(fake_run: Path) -> None:
    _edit_row(fake_run, 0, energy_status="guessed:about 3 W", energy_j=1.0)
    assert any("line 1" in p and "'estimated:<method>'" in p for p in _audit(fake_run).findings)
    _edit_row(fake_run, 0, energy_status="estimated:codecarbon 3.3.2 cpu_load: TDP 8 W", energy_j=1.0)
    assert not any("energy status" in p for p in _audit(fake_run).findings)


def test_missing_file_raises_run_folder_error_naming_it(fake_run: Path) -> None:
    (fake_run / "summary.json").unlink()
    with pytest.raises(RunFolderError, match="summary.json"):
        _audit(fake_run)


# --- scripts/rescore.py -----------------------------------------------------------------------------


def test_rescore_script_exit_codes(fake_run: Path, repo_root: Path, tmp_path: Path) -> None:
    clean = _rescore(repo_root, fake_run)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "OK: 3 rows re-scored, all hashes match" in clean.stdout

    as_json = _rescore(repo_root, fake_run, "--json")
    assert as_json.returncode == 0
    assert json.loads(as_json.stdout)["ok"] is True

    _edit_row(fake_run, 2, completion="So the answer is \\boxed{8}.")
    tampered = _rescore(repo_root, fake_run)
    assert tampered.returncode == 1, tampered.stdout + tampered.stderr
    assert "outputs.jsonl line 3" in tampered.stdout and "toy-2" in tampered.stdout

    missing = _rescore(repo_root, tmp_path / "no-such-run")
    assert missing.returncode == 2
    assert "no-such-run" in missing.stderr
