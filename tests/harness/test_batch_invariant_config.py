"""determinism.batch_invariant in the harness (issue 52, the exact default): on by default where the setup has the
mode (transformers on the CPU in float32), and then recorded; off by default where it has none (llama.cpp, vLLM, the
fake, a GPU, bfloat16), which records nothing, as those runs did before; refused in one line where it is asked for
and cannot be had. Off (given) records what every run made before the setting existed recorded, so their keys do
not move (tests/harness/test_identity_golden.py pins them)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.config.exact import EXACT_DEFAULT, ConfigFiles, asking_file, given, mode_missing, resolve
from harness.config.schema import compose_config, recorded, typed
from harness.errors import ConfigError
from kvstore.backends.transformers import invariant

REPO = Path(__file__).resolve().parents[2]


def test_the_default_is_the_mode_and_is_recorded():
    assert EXACT_DEFAULT is True
    assert compose_config().determinism.batch_invariant is True
    assert recorded(compose_config())["determinism"]["batch_invariant"] is True
    assert recorded(typed(compose_config()))["determinism"]["batch_invariant"] is True


def test_off_records_what_runs_before_the_setting_recorded():
    """Absent means false (the value every run had before the setting existed): a run with the mode off records no
    batch_invariant, so its config.yaml, manifest and keys are those of a run made before."""
    off = recorded(compose_config(["determinism.batch_invariant=false"]))
    assert "batch_invariant" not in off["determinism"]
    on = recorded(compose_config())
    del on["determinism"]["batch_invariant"]
    assert on == off  # the setting is the only difference


@pytest.mark.parametrize("overrides, why", [
    (["model=gemma3_270m_llamacpp"], "the llamacpp backend has no batch-invariant mode"),
    (["model=gemma3_270m_vllm"], "the vllm backend has no batch-invariant mode"),
    (["model=fake"], "the fake backend has no batch-invariant mode"),
    (["determinism.dtype=bfloat16"], "determinism.dtype=bfloat16: the mode is measured for float32 only"),
    (["model.device=cuda"], "model.device=cuda: the mode is built and measured for the CPU"),
])
def test_where_the_setup_has_no_mode_the_default_is_off_as_before(overrides, why):
    cfg = compose_config(overrides)
    assert cfg.determinism.batch_invariant is False
    assert "batch_invariant" not in recorded(cfg)["determinism"]
    c = cfg.model
    assert mode_missing(c.backend, c.device, cfg.determinism.dtype) == why


@pytest.mark.parametrize("model", ["gemma3_270m_llamacpp", "gemma3_270m_vllm"])
def test_asked_for_where_it_cannot_be_had_is_refused_in_one_line(model):
    with pytest.raises(ConfigError, match="cannot offer a batch-invariant computation on the CPU") as e:
        typed(compose_config([f"model={model}", "determinism.batch_invariant=true"]))
    assert "\n" not in str(e.value)


def test_bfloat16_asked_for_the_mode_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="float32 only") as e:
        typed(compose_config(["determinism.dtype=bfloat16", "determinism.batch_invariant=true"]))
    assert "\n" not in str(e.value)


def test_given_reads_every_override_form():
    assert given(["determinism.batch_invariant=true"]) and given(["+determinism.batch_invariant=false"])
    assert given(["++determinism.batch_invariant=true"]) and given(["~determinism.batch_invariant"])
    assert not given(["determinism.dtype=float32", "model=fake", "determinism.batch_invariant_x=1"])


def test_a_run_on_a_backend_without_the_mode_records_it_off(tmp_path):
    """The command itself (Hydra's main, not compose_config): model=fake runs with the mode off by default and its
    config.yaml records nothing of it, as every fake run before the flip."""
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "model=fake", "dataset.limit=1", "decoding.max_new_tokens=2",
         "tracking=off", "energy=none", f"runs_dir={tmp_path}"],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (config,) = tmp_path.glob("baseline/*/config.yaml")
    assert "batch_invariant" not in yaml.safe_load(config.read_text())["determinism"]
    # issue 58: the run says so, in one line (why, and how to ask for it), once
    notes = [line for line in proc.stderr.splitlines() if line.startswith("note: determinism.batch_invariant")]
    assert notes == ["note: determinism.batch_invariant=false for this run: the fake backend has no batch-invariant "
                     "mode (the exact default holds for transformers on the CPU in float32 where the mode's kernel "
                     "runs; determinism.batch_invariant=true asks for it, and is refused where it cannot hold; "
                     "docs/exactness.md)"]
    # and the folder keeps it: summary.json and the manifest's inputs hold the same line (nothing only on stderr)
    (folder,) = {p.parent for p in tmp_path.glob("baseline/*/config.yaml")}
    summary = json.loads((folder / "summary.json").read_text())
    manifest = json.loads((folder / "manifest.json").read_text())
    assert summary["exact_default"] == manifest["inputs"]["exact_default"] == notes[0]


def test_a_run_whose_config_sets_the_mode_off_or_runs_it_records_no_note(tmp_path):
    """exact_default is only the default's note: a run that ran the mode, or whose config set it off, has none."""
    from harness.run.loop import run

    for name, overrides in (("mode", []), ("off", ["determinism.batch_invariant=false"])):
        notes: list[str] = []
        cfg = compose_config(["model=tiny_gemma3", "dataset.limit=1", "decoding.max_new_tokens=2", "tracking=off",
                              "energy=none", f"runs_dir={tmp_path / name}", *overrides], notes=notes)
        assert notes == []
        # a note handed to a run that ran the mode is not recorded (the folder never says off when it was on)
        folder, summary = run(cfg, progress=False, exact_default="note: stale" if name == "mode" else None)
        assert summary.exact_default is None
        assert "exact_default" not in json.loads((folder.path / "manifest.json").read_text())["inputs"]


# ------------------------------------------------------------------------ issue 58: decided once, at composition
def _files(tmp_path: Path, text: str, group: str = "experiment", option: str = "exact") -> ConfigFiles:
    (tmp_path / group).mkdir(parents=True, exist_ok=True)
    (tmp_path / group / f"{option}.yaml").write_text(text)
    return ConfigFiles("config", {group: option, "hydra/launcher": "basic"}, [tmp_path])


@pytest.mark.parametrize("text, group, asks", [
    ("# @package _global_\ndeterminism:\n  batch_invariant: true\n", "experiment", True),
    ("# an experiment\n# @package _global_\ndeterminism:\n  dtype: float32\n", "experiment", False),
    ("determinism:\n  batch_invariant: true\n", "model", False),  # package model: model.determinism, not it
    ("# @package determinism\nbatch_invariant: true\n", "custom", True),
    ("batch_invariant: false\n", "determinism", True),  # a determinism/ group writes under determinism
])
def test_a_config_file_that_sets_the_mode_asks_for_it(tmp_path, text, group, asks):
    found = asking_file(_files(tmp_path, text, group))
    assert (found == str(tmp_path / group / "exact.yaml")) if asks else found is None


def test_a_config_file_asking_for_the_mode_where_it_cannot_hold_is_refused_in_one_line(tmp_path):
    """Before issue 58 a config file that asked for the mode on llama.cpp had it turned off without a word."""
    cfg = compose_config(["model=gemma3_270m_llamacpp", "determinism.batch_invariant=false"])
    cfg.determinism.batch_invariant = True  # as the file below sets it
    files = _files(tmp_path, "# @package _global_\ndeterminism:\n  batch_invariant: true\n")
    with pytest.raises(ConfigError, match="cannot offer a batch-invariant computation on the CPU") as e:
        resolve(cfg, [], files)
    assert f"asked for by the config file {tmp_path / 'experiment' / 'exact.yaml'}" in str(e.value)
    assert "\n" not in str(e.value)
    note = resolve(cfg, [], _files(tmp_path / "other", "# @package _global_\nrun:\n  fresh: true\n"))
    assert cfg.determinism.batch_invariant is False and note.startswith("note: determinism.batch_invariant=false")


def test_where_the_modes_kernel_cannot_run_the_default_is_off_in_one_line_and_asking_is_refused(monkeypatch):
    """`kvstore.batch_invariant_unavailable` (the kernel's own word: no C compiler, a failed self-check) is asked at
    composition: the default goes off with one line for the entry point to print; asked for, one refusal."""
    asked = []
    monkeypatch.setattr(invariant, "unavailable", lambda: asked.append(1) or "no C compiler (cc: not found)")
    notes: list[str] = []
    cfg = compose_config([], notes=notes)
    assert cfg.determinism.batch_invariant is False and asked
    assert notes == ["note: determinism.batch_invariant=false for this run: no C compiler (cc: not found) (the exact "
                     "default holds for transformers on the CPU in float32 where the mode's kernel runs; "
                     "determinism.batch_invariant=true asks for it, and is refused where it cannot hold; "
                     "docs/exactness.md)"]
    assert "batch_invariant" not in recorded(cfg)["determinism"]  # recorded as the mode off always was
    with pytest.raises(ConfigError, match=r"determinism.batch_invariant=true \(asked for on the command line\): no C "
                                          r"compiler \(cc: not found\), so the mode cannot hold here") as e:
        compose_config(["determinism.batch_invariant=true"])
    assert "\n" not in str(e.value)
    asked.clear()
    compose_config(["model=fake"])  # a setup without the mode never asks the kernel
    compose_config(["determinism.batch_invariant=false"])
    assert not asked


def test_a_baseline_of_another_kernel_of_the_mode_is_not_reused(tmp_path, monkeypatch):
    """Issue 58: the comparable key of a run of the mode made before kernel versions does not move (the golden test),
    so the compare job reads the kernel its manifest records before reusing it."""
    from harness.compare.job import find_baseline
    from harness.run.loop import comparable_key, run
    from kvstore import UNVERSIONED_KERNEL, Determinism, load_backend

    monkeypatch.setattr(invariant, "KERNEL", UNVERSIONED_KERNEL)
    fm = load_backend("transformers", source="tiny-gemma3", determinism=Determinism(batch_invariant=True))
    cfg = compose_config(["model=tiny_gemma3", f"project_root={REPO}", f"runs_dir={tmp_path}/runs", "dataset.limit=1",
                          "decoding.max_new_tokens=2", "tracking=off", "energy=none"])
    folder, _ = run(cfg, tmp_path / "runs" / "baseline" / "b", be=fm, progress=False)
    key, said = comparable_key(typed(cfg), fm), []
    assert find_baseline(tmp_path / "runs", key, settings=fm.settings()) == folder
    new = {**fm.settings(), "batch_invariant_kernel": "fixed-dot16/1"}
    assert find_baseline(tmp_path / "runs", key, say=said.append, settings=new) is None
    assert said == [f"baseline {folder.path} not reused: computed by the mode's kernel {UNVERSIONED_KERNEL}, this "
                    "process runs fixed-dot16/1"]
