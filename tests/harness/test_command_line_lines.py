"""One line for each command-line mistake of issue 41, finding 7, before any model loads: a mistyped value
(`model.llamacpp.threads=abc`), bad override syntax, `execution.workers=-1`, and a vLLM model run from a Python
without vLLM (the project's .venv)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import harness.run.loop as loop
from harness.__main__ import _check_command_line
from harness.config.schema import compose_config
from harness.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("args,says", [
    (["model=tiny_gemma3", "model.llamacpp.threads=abc"], "model.llamacpp.threads: an integer >= 1"),
    (["decoding.max_new_tokens=["], "no viable alternative at input '['"),
    (["execution=ray", "execution.workers=-1"], "execution.workers=-1: a run needs at least 1 worker"),
])
def test_a_bad_command_line_is_one_error_line(args, says, capsys):
    with pytest.raises(SystemExit) as stop:
        _check_command_line(args)
    assert stop.value.code == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and says in err


def test_workers_below_one_is_refused_before_the_model_loads(monkeypatch, tmp_path):
    def no_load(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(loop, "load_model", no_load)
    cfg = compose_config(["model=tiny_gemma3", f"project_root={REPO}", f"runs_dir={tmp_path}", "execution=ray",
                          "execution.workers=-1", "tracking=off"])
    with pytest.raises(ConfigError, match="execution.workers=-1"):
        loop.run(cfg)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="this Python has vLLM")
def test_a_vllm_model_from_a_python_without_vllm_is_one_line(capsys):
    with pytest.raises(SystemExit):
        _check_command_line(["model=gemma3_270m_vllm"])
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "does not have" in err and "vllm" in err and ".venv-vllm" in err and "make" in err
