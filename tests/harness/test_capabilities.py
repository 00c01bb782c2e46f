"""The harness picks its decoding path by what a backend declares (kvstore.Stepwise, kvstore.InEngineDecoding), never
by its name: the fake backend gains the in-engine capability by one setting in its own module
(kvstore/backends/fake.py, `model.fake.in_engine=true`) and the harness hands it whole rows, as it does vLLM, with the
rows the step-wise loop gives (greedy)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.config.model import load_model
from harness.config.schema import compose_config, typed
from harness.errors import HarnessError
from harness.run.decode import Sampling, generate_batch
from harness.run.loop import run_rows
from kvstore import InEngineDecoding, Stepwise

REPO = Path(__file__).resolve().parents[2]
SCRIPT = "+model.fake.script.Solution=' 42 is the answer.\n\nmore'"


def _fake(in_engine: bool):  # noqa: ANN202
    return load_model(typed(compose_config(["model=fake", SCRIPT, f"model.fake.in_engine={str(in_engine).lower()}"])))


def test_the_capability_is_declared_by_the_fake_alone_and_read_by_isinstance() -> None:
    stepwise, in_engine = _fake(False), _fake(True)
    assert isinstance(stepwise, Stepwise) and not isinstance(stepwise, InEngineDecoding)
    assert isinstance(in_engine, InEngineDecoding) and stepwise.name == in_engine.name == "fake"


def test_the_harness_hands_an_in_engine_backend_whole_rows_with_the_stepwise_rows() -> None:
    rows = {}
    for flag in (False, True):
        be = _fake(flag)
        ids = be.encode("Problem: what is 6 * 7? Solution")
        rows[flag] = generate_batch(be, ids, 2, [0, 1], Sampling(32, ("\n\n",), "greedy"))
        if flag:  # the engine continued both rows; no step was driven from here
            assert be.calls["continue_rows"] == 2 and be.calls["steps"] == 0
        else:
            assert be.calls["steps"] > 0 and "continue_rows" not in be.calls
    assert [(g.token_ids, g.text, g.stop_reason, g.first_logits_sha256) for g in rows[False]] == \
           [(g.token_ids, g.text, g.stop_reason, g.first_logits_sha256) for g in rows[True]]
    assert rows[True][0].text == " 42 is the answer." and rows[True][0].stop_reason == "stop"


def test_a_run_on_the_in_engine_fake_goes_through_its_engine(tmp_path: Path) -> None:
    cfg = compose_config(["model=fake", SCRIPT, "model.fake.in_engine=true", "dataset.limit=2", "tracking=off",
                          "energy=none", "decoding.max_new_tokens=8", f"project_root={REPO}",
                          f"runs_dir={tmp_path}/runs"])
    be = load_model(typed(cfg))
    finished, _ = run_rows(cfg, be=be, progress=False)
    assert be.calls["continue_rows"] == 2 and be.calls["steps"] == 0
    assert len(finished.rows) == 2


def test_a_backend_without_a_decoding_capability_is_named() -> None:
    class CoreOnly:  # the core's verbs delegated, no decoding capability
        def __init__(self, be) -> None:  # noqa: ANN001
            self._be = be

        def __getattr__(self, name: str):  # noqa: ANN204
            if name in ("new_state", "forward", "step", "repeat_rows", "keep_rows", "continue_rows"):
                raise AttributeError(name)
            return getattr(self._be, name)

    be = CoreOnly(_fake(False))
    with pytest.raises(HarnessError, match="neither decodes in its engine .* nor step by step"):
        generate_batch(be, be.encode("x"), 1, [0], Sampling(4))
