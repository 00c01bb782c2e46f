"""The `truncated` condition (harness/run/conditions/truncated.py): the retrieved entry's first `settings.tokens`
tokens as plain text before the query, no graft; its settings come from configs/condition/truncated.yaml and a
bad one is a ConfigError naming the key. Tiny random-weight model: plumbing, not accuracy."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.config.schema import compose_config, typed
from harness.errors import ConfigError
from harness.library.build import build_library
from harness.record.rows import Group
from harness.run.conditions import CONDITIONS, build_condition
from harness.task.problems import load_problems
from kvstore import load_backend

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("truncated")
    c = typed(compose_config([
        "model=tiny_gemma3", "condition=truncated", f"project_root={REPO}", "decoding.max_new_tokens=2",
        f"library.root={tmp}/library", f"library.store={tmp}/store", "tracking=off", "dataset.limit=2",
    ]))
    fm = load_backend("transformers", source="tiny-gemma3")
    build_library(c.library, fm, REPO, progress=False)
    return c, fm, load_problems(str(REPO / "problems/kvgraft_original.jsonl"), limit=2)


def _build(c, fm, **settings):
    return build_condition("truncated", fm, c.prompt, c.decoding, c.library, REPO,
                           settings={**c.condition.settings, **settings})


def test_its_settings_come_from_its_config(setup) -> None:
    c, fm, _ = setup
    assert "truncated" in CONDITIONS and c.condition.settings == {"tokens": 32}
    cond = _build(c, fm)
    assert cond.settings.tokens == 32 and cond.describe()["settings"] == {"tokens": 32}
    assert cond.group is Group.RECURRING


def test_the_prompt_holds_the_entry_cut_to_its_first_tokens_and_nothing_is_grafted(setup) -> None:
    c, fm, problems = setup
    cond = _build(c, fm, tokens=5)
    own = {e.problem_id: e for e in cond.library.entries}[problems[0].id]
    entry_ids = cond.library.store.get(own.artifact_id).token_ids
    done = cond.complete(problems[0], 0)
    assert done.context_ids[:5] == entry_ids[:5] and done.context_ids[5:] == fm.encode(done.prompt, add_bos=False)
    assert done.grafted_tokens == 0 and done.prefill_tokens == len(done.context_ids)
    assert done.retrieval is not None and done.retrieval.match == "exact" and done.retrieval.entry_id == own.entry_id
    assert done.extra == {"kept_entry_tokens": 5}
    longer = _build(c, fm, tokens=7).complete(problems[0], 0)
    assert len(longer.context_ids) == len(done.context_ids) + 2


@pytest.mark.parametrize(("settings", "message"), [
    ({"tokens": 0}, r"condition.settings of truncated: tokens=0: must be an integer >= 1"),
    ({"tokns": 5}, r"condition.settings.tokns: not a setting of truncated; allowed: \['tokens'\]"),
])
def test_a_bad_setting_is_a_config_error_naming_the_key(setup, settings, message) -> None:
    c, fm, _ = setup
    with pytest.raises(ConfigError, match=message):
        build_condition("truncated", fm, c.prompt, c.decoding, c.library, REPO, settings=settings)
