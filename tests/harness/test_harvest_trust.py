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

REPO = Path(__file__).resolve().parents[2]


def _run(tmp: Path, model: str, be=None):
    cfg = compose_config([f"model={model}", f"project_root={REPO}", f"runs_dir={tmp}/runs-{model}", "dataset.limit=3",
                          "decoding.max_new_tokens=4", "prompt.stop=[]", "tracking=off"])
    folder, _ = run(cfg, fm=be, progress=False)
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
