"""Every config in configs/ composes against the typed schema, and a misspelt key is an error."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ConfigKeyError

from harness.config import CONFIG_DIR, compose_config

GROUPS = sorted(p.name for p in CONFIG_DIR.iterdir() if p.is_dir())


def test_default_config_composes_to_the_bundled_model_and_problems():
    cfg = compose_config()
    assert cfg.model.source == "gemma3-270m"
    assert cfg.dataset.path == "problems/kvgraft_original.jsonl"
    assert cfg.condition.name == "baseline"
    assert cfg.decoding.strategy == "greedy"


@pytest.mark.parametrize("group,option", [(g, p.stem) for g in GROUPS for p in sorted((CONFIG_DIR / g).glob("*.yaml"))])
def test_every_group_option_composes(group: str, option: str):
    cfg = compose_config([f"{group}={option}"])
    assert cfg[group] is not None


@pytest.mark.parametrize("override", ["decoding.max_new_tokns=5", "dataset.limt=3", "model.sorce=x"])
def test_a_misspelt_key_is_an_error(override: str):
    with pytest.raises((ConfigCompositionException, ConfigKeyError)):
        compose_config([override])


def test_config_groups_mirror_the_harness_concepts():
    assert set(GROUPS) >= {"model", "dataset", "condition", "decoding", "library", "tracking", "energy", "prompt"}
    assert Path(CONFIG_DIR / "config.yaml").is_file()
