"""The harvest loop checks the run it harvests (issue 41, finding 3): a harvest run whose outputs.jsonl was edited
(a completion set to the gold answer and marked correct, not re-sealed) is refused by the library build, naming
`make rescore`; a harvest run made with another model is refused naming the fingerprint; an intact run of the same
model builds. Real run folders of the tiny random-weight model (and of the scripted fake model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.config.model import load_model
from harness.config.schema import compose_config, typed
from harness.errors import LibraryError
from harness.library.build import build_library
from harness.run.loop import run
from harness.task.answers import score
from kvstore.backends.fake import FakeBackend

REPO = Path(__file__).resolve().parents[2]


def _run(tmp: Path, model: str, be=None):
    cfg = compose_config([f"model={model}", f"project_root={REPO}", f"runs_dir={tmp}/runs-{model}", "dataset.limit=3",
                          "decoding.max_new_tokens=4", "prompt.stop=[]", "tracking=off"])
    folder, _ = run(cfg, be=be, progress=False)
    return folder.path


def _lib(tmp: Path, harvest: Path):
    return typed(compose_config(["model=tiny_gemma3", f"project_root={REPO}", "library=harvest",
                                 f"library.harvest_run={harvest}", f"library.root={tmp}/library",
                                 f"library.store={tmp}/store", "tracking=off"]))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("harvest")
    cfg = _lib(tmp, tmp)
    return tmp, load_model(cfg)


def test_an_edited_harvest_run_is_refused(tiny):
    tmp, be = tiny
    path = _run(tmp, "tiny_gemma3", be)
    rows = [json.loads(x) for x in (path / "outputs.jsonl").read_text().splitlines()]
    r = rows[0]
    text = " " + r["gold_answer"]
    s = score(text, r["gold_answer"])
    r.update(completion=text, extracted=s.extracted, answer=s.answer, correct=True)
    (path / "outputs.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
    cfg = _lib(tmp, path)
    with pytest.raises(LibraryError, match=r"does not re-check .*make rescore RUN="):
        build_library(cfg.library, be, REPO, progress=False)


def test_a_harvest_run_of_another_model_is_refused(tiny):
    tmp, be = tiny
    path = _run(tmp, "fake")  # an intact run (it re-checks) of the scripted fake model
    cfg = _lib(tmp, path)
    with pytest.raises(LibraryError, match=r"its model_fingerprint .* is not the library model's"):
        build_library(cfg.library, be, REPO, progress=False)


# --- issue 51, item 9: the fingerprints a run records are under manifest.json `inputs`; none there, no harvest -------

def _fake_run(tmp: Path, be, name: str) -> Path:
    cfg = compose_config(["model=fake", f"project_root={REPO}", f"runs_dir={tmp}/{name}", "dataset.limit=3",
                          "decoding.max_new_tokens=4", "tracking=off"])
    folder, _ = run(cfg, be=be, progress=False)
    return folder.path


def _fake_lib(tmp: Path, harvest: Path):
    return typed(compose_config(["model=fake", f"project_root={REPO}", "library=harvest",
                                 f"library.harvest_run={harvest}", f"library.root={tmp}/library",
                                 f"library.store={tmp}/store", "tracking=off"]))


def _reseal(path: Path, edit) -> None:
    """`edit(manifest)`, then the manifest's own hash recomputed: a consistent forgery that re-checks."""
    from harness.record.hashing import sha256_json

    manifest = json.loads((path / "manifest.json").read_text())
    edit(manifest)
    manifest.pop("manifest_sha256")
    manifest["manifest_sha256"] = sha256_json(manifest)
    (path / "manifest.json").write_text(json.dumps(manifest, indent=2))


def test_an_intact_harvest_run_of_the_same_model_builds_its_library(tmp_path):
    """At 7dbda8d every intact run was refused ("its model_fingerprint None": the check read the manifest's top
    level): the harvest loop could not run at all."""
    from harness.library.build import Library

    be = FakeBackend({"Final answer:": " 324"})  # kvg-001's answer: one correct row to harvest
    path = _fake_run(tmp_path, be, "runs")
    out = build_library(_fake_lib(tmp_path, path).library, be, REPO, progress=False)
    assert [e.problem_id for e in Library(out, None).entries] == ["kvg-001"]


def test_a_run_of_another_model_resealed_with_the_library_models_fingerprints_on_top_is_refused(tmp_path):
    be = FakeBackend({"Final answer:": " 324"})
    other = _fake_run(tmp_path, FakeBackend({"Final answer:": " 324"}, margin=4.0), "other")

    def claim(m):  # what the build read: the library model's fingerprints at the top level
        m["model_fingerprint"], m["tokenizer_fingerprint"] = be.fingerprint, be.tokenizer_fingerprint
    _reseal(other, claim)
    with pytest.raises(LibraryError, match=r"its model_fingerprint \w+ \(manifest.json inputs.model_fingerprint\) is "
                                           r"not the library model's"):
        build_library(_fake_lib(tmp_path, other).library, be, REPO, progress=False)


def test_a_run_that_records_no_fingerprint_is_refused(tmp_path):
    be = FakeBackend({"Final answer:": " 324"})
    path = _fake_run(tmp_path, be, "runs")
    _reseal(path, lambda m: m["inputs"].pop("model_fingerprint"))
    with pytest.raises(LibraryError, match=r"inputs.model_fingerprint is missing, so the model that wrote its rows "
                                           r"cannot be told"):
        build_library(_fake_lib(tmp_path, path).library, be, REPO, progress=False)
