"""determinism.batch_invariant in the harness (issue 52, the exact default): on by default where the setup has the
mode (transformers on the CPU in float32), and then recorded; off by default where it has none (llama.cpp, vLLM, the
fake, a GPU, bfloat16), which records nothing, as those runs did before; refused in one line where it is asked for
and cannot be had. Off (given) records what every run made before the setting existed recorded, so their keys do
not move (tests/harness/test_identity_golden.py pins them)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.config.exact import EXACT_DEFAULT, given, mode_missing
from harness.config.schema import compose_config, recorded, typed
from harness.errors import ConfigError

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
