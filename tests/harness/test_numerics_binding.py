"""An artifact binds the numerics it was computed under (issue 41, finding 0): the library build records the
numerics fingerprint of the depositing process beside each artifact (a store tag, so artifact ids do not move), a
graft under another numerics fingerprint is refused naming both (environment records equal), the build does not
reuse such an artifact, and `--redeposit` re-deposits it. The tiny random-weight model, 2 entries."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.config.model import load_model
from harness.config.schema import compose_config, typed
from harness.errors import LibraryError
from harness.library.build import build_library, open_library, redeposit_library
from harness.run.conditions import build_condition
from harness.task.problems import load_problems
from kvstore import EnvironmentMismatchError, check_numerics, numerics_of_tags, open_store

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def setup(tmp_path):
    cfg = typed(compose_config(["model=tiny_gemma3", f"project_root={REPO}", f"library.root={tmp_path}/library",
                                f"library.store={tmp_path}/store", "library.dataset.limit=2", "dataset.limit=2",
                                "decoding.max_new_tokens=2", "tracking=off"]))
    be = load_model(cfg)
    build_library(cfg.library, be, REPO, progress=False)
    return cfg, be


def test_an_artifact_deposited_under_other_numerics_is_refused_naming_them(setup):
    cfg, be = setup
    store = open_store(cfg.library.store)
    entries = open_library(cfg.library, be, REPO).entries
    here = be.numerics()
    assert len(here) == 64
    for e in entries:  # recorded beside each artifact
        assert numerics_of_tags(store.info(e.artifact_id).tags) == [here]
    check_numerics(store.info(entries[0].artifact_id).tags, be)  # same numerics: admitted
    problems = load_problems(str(REPO / cfg.dataset.path), limit=2)
    cond = build_condition("graft", be, cfg.prompt, cfg.decoding, cfg.library, REPO)
    cond.context(problems[0])  # grafts here
    cond.close()

    be.fm.__dict__["numerics"] = "f" * 64  # another machine: same environment record, other bits
    with pytest.raises(EnvironmentMismatchError, match=f"numerics_sha256: artifact {here[:16]}, this process ffff"):
        check_numerics(store.info(entries[0].artifact_id).tags, be, "entry")
    cond = build_condition("graft", be, cfg.prompt, cfg.decoding, cfg.library, REPO)
    with pytest.raises(LibraryError, match="numerics_sha256: artifact .* --redeposit"):
        cond.context(problems[0])
    cond.close()
    with pytest.warns(RuntimeWarning, match="grafted across numerics"):
        check_numerics(store.info(entries[0].artifact_id).tags, be, allow_environment_mismatch=True)
    # --redeposit re-deposits what this process cannot graft exactly (here: the same bytes, tagged with both)
    out = redeposit_library(cfg.library, be, REPO, progress=False)
    assert out["redeposited"] == 2 and all("numerics_sha256" in d[0] for d in out["differences"].values())
    assert "f" * 64 in numerics_of_tags(store.info(entries[0].artifact_id).tags)
    check_numerics(store.info(entries[0].artifact_id).tags, be)
    del be.fm.__dict__["numerics"]


def test_an_artifact_without_the_tag_is_not_compared_on_it(setup):
    cfg, be = setup
    store = open_store(cfg.library.store)
    aid = open_library(cfg.library, be, REPO).entries[0].artifact_id
    tags = [t for t in store.info(aid).tags if not t.startswith("numerics:")]
    be.fm.__dict__["numerics"] = "f" * 64
    try:
        check_numerics(tags, be)  # deposited before the fingerprint existed: not compared on it
    finally:
        del be.fm.__dict__["numerics"]
