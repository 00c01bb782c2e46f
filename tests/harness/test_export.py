"""`python -m harness.export RUN --format lm-eval|every-eval-ever` on a real run folder (fake backend, 2 samples per
problem): lm-eval's own readers find and load the samples file (lm_eval.utils' file-name helpers and the `datasets`
JSON loader its EvaluationTracker reads samples with; lm-eval 0.4.13 installed --no-deps into a cache folder when
it is not importable; a registry that cannot be reached fails the test, saying so: a reader that is not there is no
evidence), the Every Eval Ever records validate against its published schema (tests/cases/every_eval_ever/), and
every hash matches the run's manifest. An edited run folder is refused before anything is written (it is audited as
`make rescore` audits it), and a dataset name with `/` is one file name, not a path."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.config.schema import compose_config
from harness.export import export_run
from harness.export.__main__ import main as export_main
from harness.record.folder import RunFolder
from harness.record.hashing import sha256_json
from harness.run.loop import run
from kvstore.backends.fake import FakeBackend

REPO = Path(__file__).resolve().parents[2]
LM_EVAL = "lm-eval==0.4.13"
SCHEMA = REPO / "tests" / "cases" / "every_eval_ever" / "instance_level_eval.schema.json"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("export")
    cfg = compose_config(["model=fake", f"project_root={REPO}", f"runs_dir={tmp}", "dataset.limit=3",
                          "decoding=sample", "decoding.n_samples=2", "decoding.max_new_tokens=8", "tracking=off",
                          "energy.meter=none"])
    folder, _ = run(cfg, be=FakeBackend({"Final answer:": " 12"}), progress=False)
    return folder.path


def _lm_eval_path() -> str:
    """A folder holding lm_eval (empty when the running Python imports it): `pip install --no-deps --target` into
    the user's cache once; the test fails when the registry cannot be reached (never skips: no reader, no check)."""
    try:
        import lm_eval.utils  # noqa: F401

        return ""
    except ImportError:
        pass
    target = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kvgraft" / "test-lm-eval-0.4.13"
    if not (target / "lm_eval" / "utils.py").is_file():
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--target",
                               str(target), LM_EVAL], capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            pytest.fail(f"{LM_EVAL} not installable here ({done.stderr.strip().splitlines()[-1:]}): the export is not "
                        "checked against lm-eval's own readers; reach the package registry (make setup does) and re-run")
    return str(target)


READ_WITH_LM_EVAL = """
import json, sys
from datasets import load_dataset
from lm_eval.utils import get_file_datetime, get_file_task_name, get_sample_results_filenames, hash_string
found = get_sample_results_filenames(sys.argv[1:])
rows = load_dataset("json", data_files=found, split="train").to_list()
name = found[0].rsplit("/", 1)[1]
print(json.dumps({"task": get_file_task_name(name), "datetime": get_file_datetime(name), "rows": rows,
                  "prompt_hashes": [hash_string(r["arguments"]["gen_args_0"]["arg_0"]) for r in rows],
                  "target_hashes": [hash_string(r["target"]) for r in rows]}))
"""


def test_lm_eval_reads_the_export_back_and_every_hash_is_the_manifests(run_dir: Path, tmp_path: Path) -> None:
    [path] = export_run(run_dir, "lm-eval", tmp_path / "lm")
    folder = RunFolder(run_dir)
    manifest, summary = folder.read_manifest(), folder.read_summary()
    assert path.name == f"samples_kvgraft_original-baseline_{summary.finished_at.replace(':', '-')}.jsonl"
    extra = _lm_eval_path()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (extra, str(REPO)) if p), "HF_DATASETS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", READ_WITH_LM_EVAL, str(path), str(tmp_path / "results_x.json")],
                          capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    read = json.loads(done.stdout.strip().splitlines()[-1])
    assert read["task"] == "kvgraft_original-baseline" and read["datetime"] == summary.finished_at.replace(":", "-")
    rows, entries = read["rows"], manifest["outputs"]["rows"]
    assert [r["doc_id"] for r in rows] == [0, 1, 2] and all(len(r["resps"][0]) == 2 for r in rows)
    assert [r["prompt_hash"] for r in rows] == read["prompt_hashes"]
    assert [r["target_hash"] for r in rows] == read["target_hashes"]
    for r in rows:
        assert r["doc_hash"] == manifest["inputs"]["problems"][r["doc"]["id"]] == sha256_json(r["doc"])
        assert r["metrics"] == ["exact_match", "maj@2"] and r["maj@2"] in (0.0, 1.0)
    exported = [(k["problem_id"], k["sample"], k["row_sha256"], k["completion_sha256"], k["token_ids_sha256"])
                for r in rows for k in r["kvgraft"]]
    assert exported == [(e["problem_id"], e["sample"], e["row_sha256"], e["completion_sha256"], e["token_ids_sha256"])
                        for e in entries]
    texts = [t for r in rows for t in r["resps"][0]]
    assert [hashlib.sha256(t.encode()).hexdigest() for t in texts] == [e["completion_sha256"] for e in entries]
    assert {k["manifest_sha256"] for r in rows for k in r["kvgraft"]} == {manifest["manifest_sha256"]}


def test_every_eval_ever_records_validate_against_the_published_schema(run_dir: Path, tmp_path: Path) -> None:
    import jsonschema

    out = tmp_path / "eee"
    assert export_main([str(run_dir), "--format", "every-eval-ever", "--out", str(out)]) == 0
    [path] = list(out.iterdir())
    assert path.name.endswith("_samples.jsonl") and len(path.name.split("_")[0]) == 36
    validator = jsonschema.Draft7Validator(json.loads(SCHEMA.read_text()))
    records = [json.loads(line) for line in path.read_text().splitlines()]
    manifest = RunFolder(run_dir).read_manifest()
    assert len(records) == len(manifest["outputs"]["rows"]) == 6
    for rec, entry in zip(records, manifest["outputs"]["rows"], strict=True):
        errors = sorted(validator.iter_errors(rec), key=str)
        assert not errors, [e.message for e in errors]
        meta = rec["metadata"]
        assert (meta["row_sha256"], meta["completion_sha256"]) == (entry["row_sha256"], entry["completion_sha256"])
        assert hashlib.sha256(rec["output"]["raw"][0].encode()).hexdigest() == entry["completion_sha256"]
        assert rec["evaluation_id"] == manifest["manifest_sha256"] and rec["sample_id"] == entry["problem_id"]
    bad = {**records[0], "evaluation": {"score": 1.0}}  # the schema is really checked: is_correct is required
    assert any("is_correct" in e.message for e in validator.iter_errors(bad))


def test_an_unfinished_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "half").mkdir()
    assert export_main([str(tmp_path / "half"), "--format", "lm-eval", "--out", str(tmp_path / "o")]) == 2


def _edited_copy(run_dir: Path, tmp_path: Path) -> Path:
    """A copy of the run with the first row's `correct` flipped (issue 51's probe: the row hash not re-sealed)."""
    import shutil

    copy = tmp_path / "edited"
    shutil.copytree(run_dir, copy)
    lines = (copy / "outputs.jsonl").read_text().splitlines()
    row = json.loads(lines[0])
    row["correct"] = not row["correct"]
    lines[0] = json.dumps(row)
    (copy / "outputs.jsonl").write_text("\n".join(lines) + "\n")
    return copy


@pytest.mark.parametrize("fmt", ["lm-eval", "every-eval-ever"])
def test_an_edited_run_is_refused_before_anything_is_written(run_dir: Path, tmp_path: Path, fmt: str,
                                                            capsys: pytest.CaptureFixture) -> None:
    edited = _edited_copy(run_dir, tmp_path)
    out = tmp_path / "out"
    assert export_main([str(edited), "--format", fmt, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "does not re-check" in err and "outputs.jsonl line 1" in err and "make rescore" in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()


def test_a_dataset_name_with_a_slash_is_one_file_name(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    cfg = compose_config(["model=fake", f"project_root={REPO}", f"runs_dir={tmp_path}/runs", "dataset.limit=2",
                          "dataset.name=org/aime", "decoding.max_new_tokens=4", "tracking=off", "energy.meter=none"])
    folder, _ = run(cfg, be=FakeBackend({"Final answer:": " 12"}), progress=False)
    capsys.readouterr()
    out = tmp_path / "lm"
    assert export_main([str(folder.path), "--format", "lm-eval", "--out", str(out)]) == 0
    [path] = list(out.iterdir())  # one file, in --out: the `/` did not make a folder
    assert path.name.startswith("samples_org_aime-baseline_") and path.suffix == ".jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 2 and capsys.readouterr().out.strip() == str(path)
