"""Choosing a backend is a config choice (model.backend): checked before anything loads, mapped onto the llama.cpp
settings, and part of a run's comparable and resume keys (the transformers backend adds nothing, so runs from
before the seam keep their keys). No model is loaded here (the scripted fake backend stands in)."""

from __future__ import annotations

import pytest

from harness.config.identity import RunIdentity
from harness.config.model import load_model, model_settings
from harness.config.schema import Config, ModelConfig, compose_config, typed
from harness.errors import ConfigError
from harness.run.loop import comparable_key, resume_key
from kvstore.backends.fake import FakeBackend


def test_an_unknown_backend_is_one_config_error_before_any_load() -> None:
    # model.backend is an enum: the override check refuses it before composing, naming the key, the allowed values
    # and the field's hint
    says = r"model.backend=sglang: use one of transformers, fake, llamacpp, vllm \("
    with pytest.raises(ConfigError, match=says + "the generation engine"):
        load_model(typed(compose_config(["model.backend=sglang"])))
    with pytest.raises(ConfigError, match=r"model.backend='sglang': use one of transformers, fake, llamacpp, vllm"):
        typed(Config(model=ModelConfig(backend="sglang")))  # a Config built in Python: the schema walk refuses it


@pytest.mark.parametrize(("override", "message"), [
    ("model.llamacpp.n_ctx=0", r"model.llamacpp.n_ctx=0: must be an integer >= 1"),
    ("model.llamacpp.type_k=q8_0", r"model.llamacpp.type_k=q8_0: use one of float16, float32, bfloat16 "
                                   r"\(.*quantized KV caches are not stored"),
    ("model.device=cuda", r"model.device='cuda': the llamacpp backend runs on the CPU"),
])
def test_llamacpp_settings_that_cannot_work_are_refused_naming_the_key(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        typed(compose_config(["model=gemma3_270m_llamacpp", override]))


def test_the_llamacpp_model_config_maps_onto_llamacpp_settings() -> None:
    from kvstore.backends.llamacpp.settings import LlamaCppSettings

    c = typed(compose_config(["model=gemma3_270m_llamacpp", "model.llamacpp.n_ctx=1024", "model.llamacpp.threads=1"]))
    assert model_settings(c) == LlamaCppSettings(gguf="", n_ctx=1024, threads=1, model_name="gemma3-270m-gguf")
    other = typed(compose_config(["model=gemma3_270m_llamacpp", "model.source=/models/x.gguf"]))
    assert model_settings(other).gguf == "/models/x.gguf"  # a GGUF path as the source


def test_the_backend_and_its_settings_are_in_the_run_keys() -> None:
    cfg = compose_config(["dataset.limit=1"])
    a, b = FakeBackend(margin=8.0), FakeBackend(margin=4.0)
    assert RunIdentity(a).backend_record() == {"backend": "fake", "settings": a.settings()}
    assert comparable_key(typed(cfg), a) != comparable_key(typed(cfg), b)  # another setting: not comparable
    assert comparable_key(typed(cfg), a) == comparable_key(typed(cfg), FakeBackend(margin=8.0))
    assert resume_key({}, [], a, None) != resume_key({}, [], b, None)
    assert a.context_size() is None  # the fake says no context size: nothing to fit


def test_a_named_row_schedule_is_in_the_run_keys_and_none_leaves_them_as_before() -> None:
    # vLLM's greedy rows became one request (kvstore.backends.vllm.backend.ROW_SCHEDULE): a backend naming its row
    # schedule gets other comparable and resume keys, one naming none (every other backend) keeps its keys
    class Scheduled(FakeBackend):
        def row_schedule(self) -> str | None:
            return "one request per row"

    cfg = typed(compose_config(["dataset.limit=1"]))
    plain, scheduled = FakeBackend(margin=8.0), Scheduled(margin=8.0)
    assert plain.row_schedule() is None  # and a row schedule is not a library key:
    assert RunIdentity(plain).backend_record() == RunIdentity(scheduled).backend_record()
    assert comparable_key(cfg, plain) != comparable_key(cfg, scheduled)
    assert resume_key({}, [], plain, None) != resume_key({}, [], scheduled, None)


def test_the_manifest_records_a_named_row_schedule_and_nothing_otherwise() -> None:
    from harness.record.hashing import jsonl_bytes
    from harness.record.manifest import build_manifest

    def manifest(**kw: object) -> dict:
        return build_manifest(problems=[], prompt_template="", config={}, model_fingerprint="m",
                              tokenizer_fingerprint="t", determinism={}, environment={}, rows=[],
                              outputs_bytes=jsonl_bytes([]), summary={}, **kw)

    assert "row_schedule" not in manifest()["inputs"]
    assert manifest(row_schedule="one request per row")["inputs"]["row_schedule"] == "one request per row"
