"""Every config in configs/ composes against the typed schema, and a misspelt key is an error."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.config.schema import CONFIG_DIR, check_overrides, compose_config
from harness.errors import ConfigError

GROUPS = sorted(p.name for p in CONFIG_DIR.iterdir() if p.is_dir())


def test_default_config_composes_to_the_bundled_model_and_problems():
    cfg = compose_config()
    assert cfg.model.source == "gemma3-270m"
    assert cfg.dataset.path == "problems/kvgraft_original.jsonl"
    assert cfg.condition.name == "baseline"
    assert cfg.decoding.strategy == "greedy"


@pytest.mark.parametrize("group,option", [(g, p.stem) for g in GROUPS for p in sorted((CONFIG_DIR / g).glob("*.yaml"))])
def test_every_group_option_composes(group: str, option: str):
    if "@package _global_" in (CONFIG_DIR / group / f"{option}.yaml").read_text():  # an experiment: +experiment=x
        base = compose_config()
        cfg = compose_config([f"+{group}={option}"])
        assert cfg != base  # it sets keys across the groups
        return
    cfg = compose_config([f"{group}={option}"])
    assert cfg[group] is not None


@pytest.mark.parametrize("override,near", [
    ("decoding.max_new_tokns=5", "decoding.max_new_tokens"), ("dataset.limt=3", "dataset.limit"),
    ("model.sorce=x", "model.source"), ("+decoding.max_new_token=8", "decoding.max_new_tokens"),
    ("condition=graf", "graft"), ("decoding=sampel", "sample"), ("run.frsh=true", "run.fresh"),
])
def test_a_misspelt_key_is_one_line_naming_the_near_miss(override: str, near: str):
    with pytest.raises(ConfigError, match=f"did you mean {near}\\?") as caught:
        compose_config([override])
    assert "\n" not in str(caught.value) and override.lstrip("+").split("=")[0] in str(caught.value)


def test_a_key_with_no_near_miss_and_a_bad_value_are_still_one_line():
    with pytest.raises(ConfigError, match="no config key 'zzz'") as caught:
        compose_config(["zzz=1"])
    assert "did you mean" not in str(caught.value)
    with pytest.raises(ConfigError, match="bad override") as caught:
        compose_config(["decoding.max_new_tokens=["])
    assert "\n" not in str(caught.value)
    with pytest.raises(ConfigError, match="decoding.max_new_tokens") as caught:
        compose_config(["decoding.max_new_tokens=many"])
    assert "\n" not in str(caught.value)


def test_overrides_the_schema_allows_pass_the_check():
    check_overrides(["-m", "--cfg", "job", "decoding.max_new_tokens=3,5", "dataset.columns.id=ID", "hydra.verbose=true",
                     "~tracking.uri", "condition=baseline,graft", "model=null", "library.dataset.limit=2"])


@pytest.mark.parametrize(("override", "line"), [
    ("energy.meter=bogus", "energy.meter=bogus: use one of auto, measured, nvml, rapl, codecarbon, none"),
    ("decoding.strategy=greedy,sampl", "decoding.strategy=sampl: use one of greedy, sample"),  # a sweep's value
    ("model.llamacpp.type_k=q8_0", "model.llamacpp.type_k=q8_0: use one of float16, float32, bfloat16"),
])
def test_a_closed_choice_is_refused_before_hydra_runs(override, line):
    """`python -m harness` checks overrides before Hydra composes, so a bad enum value is one line, not Hydra's
    multi-line merge error."""
    with pytest.raises(ConfigError) as caught:
        check_overrides([override, "energy.meter=none", "decoding.strategy=sample"])
    assert str(caught.value).startswith(line) and "\n" not in str(caught.value)


def test_the_entry_point_prints_one_line_for_a_bad_choice(repo_root):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "harness", "energy.meter=bogus", "tracking=off"], cwd=repo_root,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode != 0, done.stdout
    assert done.stderr.strip().splitlines() == ["error: energy.meter=bogus: use one of auto, measured, nvml, rapl, codecarbon, none"]


def test_config_groups_mirror_the_harness_concepts():
    assert set(GROUPS) >= {"model", "dataset", "condition", "decoding", "library", "tracking", "energy", "prompt"}
    assert Path(CONFIG_DIR / "config.yaml").is_file()


def test_dataset_columns_override_works_as_documented(tmp_path):
    from harness.task.problems import load_problems

    data = tmp_path / "my.jsonl"
    data.write_text('{"ID": "q1", "Problem": "What is $2+3$?", "Answer": "5"}\n')
    cfg = compose_config(["dataset=file", f"dataset.path={data}", "dataset.columns={id: ID, problem: Problem, answer: Answer}"])
    assert dict(cfg.dataset.columns) == {"id": "ID", "problem": "Problem", "answer": "Answer", "solution": "solution"}
    [p] = load_problems(cfg.dataset.path, columns=dict(cfg.dataset.columns))
    assert (p.id, p.problem, p.answer) == ("q1", "What is $2+3$?", "5")


def test_default_experiment_is_defined_once():
    from harness.config.schema import DEFAULT_EXPERIMENT

    assert compose_config().tracking.experiment == DEFAULT_EXPERIMENT
    lines = (CONFIG_DIR / "tracking" / "mlflow.yaml").read_text().splitlines()
    assert not any(line.startswith("experiment:") for line in lines)


def test_a_harness_error_at_an_entry_point_is_one_line_without_traceback(tmp_path):
    import os
    import subprocess
    import sys

    missing = tmp_path / "nope.jsonl"
    cmd = [sys.executable, "-m", "harness", "model=tiny_gemma3", "dataset=file", f"dataset.path={missing}",
           "tracking=off", f"runs_dir={tmp_path}/runs"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    env.pop("KVGRAFT_DEBUG", None)
    out = subprocess.run(cmd, cwd=CONFIG_DIR.parent, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: dataset file {missing} does not exist") and "dataset.path" in last, out.stderr
    assert "Traceback" not in out.stderr
    debug = subprocess.run(cmd, cwd=CONFIG_DIR.parent, env={**env, "KVGRAFT_DEBUG": "1", "HYDRA_FULL_ERROR": "1"},
                           capture_output=True, text=True, timeout=300)
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "ProblemError" in debug.stderr


@pytest.mark.parametrize("experiment,model,chat,in_flight", [
    ("transfer_cot", "qwen2.5-coder-1.5b-instruct-vllm", "model", 25),
    ("transfer_cot_270m", "gemma3-270m", None, 16),
])
def test_the_cot_transfer_design_is_the_one_its_table_reports(experiment, model, chat, in_flight):
    """docs/models.md "Chain-of-thought transfer": the design was fixed before the runs; these configs must keep
    giving it (the first 100 problems, the same 100 in the library, the cot prompt, greedy, 1,024 tokens, the
    in-flight setting the rows depend on)."""
    c = compose_config([f"+experiment={experiment}"])
    assert (c.dataset.name, c.dataset.limit, c.library.dataset.limit) == ("aime_1983_2023", 100, 100)
    assert (c.prompt.name, c.decoding.strategy, c.decoding.max_new_tokens) == ("cot", "greedy", 1024)
    assert (c.model.name, c.model.chat, c.model.trace, c.run.in_flight) == (model, chat, None, in_flight)
    assert (c.model.vllm.max_num_seqs if c.model.vllm else None) == (25 if chat else None)
