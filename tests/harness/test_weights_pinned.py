"""Weights pinned for a run (issue 31, finding 4): a model file changed under a running model stops the run with one
line naming the file before another row is written under the fingerprint taken at load; a truncated checkpoint is
one line with the loader's own reason.

- transformers: a saved tiny-gemma3 checkpoint (model=hf), its model.safetensors rewritten in place (same size)
  once the run has written a row;
- llama.cpp: a copy of the bundled GGUF, cut to half in place once the run has written a row (it used to die with
  SIGBUS, exit 135, no message: the file was mapped)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from harness.config.schema import compose_config
from harness.run.loop import run
from kvstore import ModelChangedError, ModelLoadError
from kvstore.backends.transformers import load_frozen_model

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("ckpt") / "tiny"
    fm = load_frozen_model("tiny-gemma3")
    fm.model.save_pretrained(folder)
    fm.tokenizer.save_pretrained(folder)
    return folder


def _when_a_row_is_written(runs: Path, then) -> threading.Thread:
    def watch() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            found = list(runs.glob("*/*/outputs.partial.jsonl"))
            if found and found[0].read_text().count("\n") >= 1:
                then()
                return
            time.sleep(0.01)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


def test_a_checkpoint_rewritten_under_a_running_model_stops_the_run_in_one_line(checkpoint, tmp_path):
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(checkpoint, folder)
    weights = folder / "model.safetensors"
    size = weights.stat().st_size

    def rewrite() -> None:  # same size, other bytes near the end (the last tensors)
        with open(weights, "r+b") as f:
            f.seek(size - 4096)
            f.write(os.urandom(4096))

    cfg = compose_config(["model=hf", f"model.source={folder}", "condition=baseline", "dataset.limit=8",
                          "decoding.max_new_tokens=40", "prompt.stop=[]", "tracking=off", f"project_root={REPO}",
                          f"runs_dir={tmp_path}/runs"])
    watcher = _when_a_row_is_written(tmp_path / "runs", rewrite)
    with pytest.raises(ModelChangedError) as err:
        run(cfg, progress=False)
    watcher.join(5)
    message = str(err.value)
    assert message.startswith(f"{weights}: the model file changed while the model was running (it was rewritten "
                              "in place)") and "\n" not in message, message
    (partial,) = (tmp_path / "runs").glob("baseline/*/outputs.partial.jsonl")
    assert 1 <= partial.read_text().count("\n") < 8  # the rows before the change, none after it
    assert not list((tmp_path / "runs").glob("baseline/*/manifest.json"))


def test_a_truncated_checkpoint_is_one_line_with_the_loaders_reason(checkpoint, tmp_path):
    import shutil

    folder = tmp_path / "cut"
    shutil.copytree(checkpoint, folder)
    with open(folder / "model.safetensors", "r+b") as f:
        f.truncate(f.seek(0, 2) // 2)
    with pytest.raises(ModelLoadError) as err:
        load_frozen_model(str(folder))
    message = str(err.value)
    assert str(folder / "model.safetensors") in message and "SafetensorError" in message, message
    assert "incomplete metadata, file not fully covered" in message and "\n" not in message


@pytest.mark.slow
def test_a_gguf_cut_short_under_a_running_llamacpp_model_stops_the_run_in_one_line(tmp_path):
    pytest.importorskip("llama_cpp", reason="the llama.cpp backend needs llama-cpp-python")
    import shutil

    from kvstore.backends.packaged import BUNDLED, gguf_path

    gguf = tmp_path / "model.gguf"
    shutil.copyfile(gguf_path(BUNDLED), gguf)
    runs = tmp_path / "runs"
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", "model=gemma3_270m_llamacpp", f"model.llamacpp.gguf={gguf}",
         "condition=baseline", "dataset.limit=10", "decoding.max_new_tokens=48", "prompt.stop=[]", "tracking=off",
         f"project_root={REPO}", f"runs_dir={runs}"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)

    def cut() -> None:
        with open(gguf, "r+b") as f:
            f.truncate(f.seek(0, 2) // 2)

    watcher = _when_a_row_is_written(runs, cut)
    _, err = proc.communicate(timeout=600)
    watcher.join(5)
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert proc.returncode == 1, (proc.returncode, err[-2000:])
    assert len(lines) == 1 and f"{gguf}: the model file changed while the model was running (its size changed" in \
        lines[0], err[-2000:]
    assert "Traceback" not in err
    (partial,) = runs.glob("baseline/*/outputs.partial.jsonl")
    assert 1 <= partial.read_text().count("\n") < 10
