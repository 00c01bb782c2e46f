"""A run handed a loaded model (`be=`: the compare job's, a Ray actor's, a caller's) refuses one whose settings are
not the ones its config records, before anything is written: the manifest, comparable and resume keys would
otherwise name a computation that did not happen (a config in the exact default, rows computed without the mode).
Found when the default flipped (issue 52): 25 tests handed a default-mode model to a config in the mode."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.config.schema import compose_config
from harness.errors import ConfigError
from harness.run.loop import run
from kvstore import Determinism, load_backend

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def default_mode():
    return load_backend("transformers", source="tiny-gemma3", determinism=Determinism())


def _cfg(tmp: Path, *extra: str):
    return compose_config(["model=tiny_gemma3", f"project_root={REPO}", f"runs_dir={tmp}/runs", "dataset.limit=1",
                           "decoding.max_new_tokens=2", "tracking=off", *extra])


def test_a_config_in_the_mode_refuses_a_model_without_it_and_writes_nothing(default_mode, tmp_path):
    cfg = _cfg(tmp_path)  # the exact default: determinism.batch_invariant resolves to true here
    assert cfg.determinism.batch_invariant is True
    with pytest.raises(ConfigError, match=r"determinism\.batch_invariant=true, the backend given runs without the mode")\
            as e:
        run(cfg, tmp_path / "runs" / "baseline" / "r", be=default_mode, progress=False)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "runs").exists()


def test_a_model_in_the_mode_refuses_a_config_without_it(tmp_path):
    mode = load_backend("transformers", source="tiny-gemma3", determinism=Determinism(batch_invariant=True))
    with pytest.raises(ConfigError, match=r"determinism\.batch_invariant=false, the backend given runs the mode"):
        run(_cfg(tmp_path, "determinism.batch_invariant=false"), tmp_path / "r", be=mode, progress=False)


def test_any_other_pinned_setting_that_differs_is_named(default_mode, tmp_path):
    cfg = _cfg(tmp_path, "determinism.batch_invariant=false", "determinism.prefill_chunk=7")
    with pytest.raises(ConfigError, match=r"determinism\.prefill_chunk=7, the backend given has 512"):
        run(cfg, tmp_path / "r", be=default_mode, progress=False)


def test_a_matching_model_runs(default_mode, tmp_path):
    folder, summary = run(_cfg(tmp_path, "determinism.batch_invariant=false"), tmp_path / "r", be=default_mode,
                          progress=False)
    manifest = (folder.path / "manifest.json").read_text()
    assert summary.tokens.decode > 0 and '"batch_invariant"' not in manifest  # recorded as computed: the mode off
