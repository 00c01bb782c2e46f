"""Out-of-range input is refused before the model loads, in one ConfigError line naming the key and what it may
be (harness.config.schema.validate, check_device); prompts longer than the model's context are refused or cut to fit as
a recorded choice (harness.run.loop.fit_context), never prefilled silently."""

from __future__ import annotations

import dataclasses
import json
import time
import typing
from enum import Enum
from pathlib import Path

import pytest

import harness.config.schema
from harness.config.model import load_model
from harness.config.schema import Config, DecodingConfig, compose_config, typed, validate
from harness.errors import ConfigError
from harness.record.audit import audit
from harness.run.loop import fit_context, run
from harness.task.problems import Problem
from kvstore import load_backend

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("overrides,names", [
    (["decoding=sample", "decoding.temperature=0"], "decoding.temperature=0"),
    (["decoding=sample", "decoding.temperature=-1"], "decoding.temperature=-1"),
    (["decoding.temperature=-0.5"], "decoding.temperature=-0.5"),
    (["decoding=sample", "decoding.temperature=nan"], "decoding.temperature=nan"),
    (["decoding.top_p=1.5"], "decoding.top_p=1.5"),
    (["decoding.top_p=0"], "decoding.top_p=0"),
    (["decoding=sample", "decoding.top_p=-0.1"], "decoding.top_p=-0.1"),
    (["decoding.max_new_tokens=0"], "decoding.max_new_tokens=0"),
    (["decoding=sample", "decoding.n_samples=0"], "decoding.n_samples=0"),
    (["decoding.batch_size=0"], "decoding.batch_size=0"),
    (["decoding.strategy=beam"], "decoding.strategy=beam: use one of greedy, sample"),
    (["energy.meter=zeus"], "energy.meter=zeus: use one of auto, measured, nvml, rapl, codecarbon, none"),
    (["library.retrieval=dense"], "library.retrieval=dense: use one of bm25, none"),
    (["decoding.n_samples=4"], "greedy decoding with n_samples > 1"),
    (["dataset.limit=0"], "dataset.limit=0"),
    (["dataset.limit=-2"], "dataset.limit=-2"),
    (["library.dataset.limit=0"], "library.dataset.limit=0"),
    (["determinism.threads=0"], "determinism.threads=0"),
    (["determinism.prefill_chunk=0"], "determinism.prefill_chunk=0"),
    (["run.context_overflow=ignore"], "run.context_overflow=ignore: use one of refuse, truncate"),
])
def test_each_out_of_range_value_is_one_line_naming_the_key(overrides, names):
    with pytest.raises(ConfigError) as caught:
        typed(compose_config(overrides))
    message = str(caught.value)
    assert names in message and "\n" not in message


def test_values_in_range_pass():
    typed(compose_config(["decoding=sample", "decoding.temperature=0.01", "decoding.top_p=1", "dataset.limit=1"]))
    typed(compose_config(["decoding.temperature=0"]))  # greedy ignores the temperature: 0 is no contradiction


@pytest.mark.parametrize("override,message", [
    ("decoding.max_new_tokens=0", "decoding.max_new_tokens=0: must be an integer >= 1 (the token budget of each answer)"),
    ("decoding.top_p=1.5", "decoding.top_p=1.5: must be a finite number in (0, 1] (1 keeps every token; 0 keeps none)"),
    ("decoding.temperature=-1",
     "decoding.temperature=-1.0: must be a finite number >= 0 (sampling needs > 0; greedy decoding ignores it)"),
    ("library.dataset.limit=0", "library.dataset.limit=0: must be an integer >= 1 (the first N problems; null takes them all)"),
    ("determinism.prefill_chunk=0", "determinism.prefill_chunk=0: must be an integer >= 1 (tokens per prefill step)"),
    ("model.llamacpp.threads=0", "model.llamacpp.threads=0: must be an integer >= 1 (llama.cpp threads, decode and batch)"),
    ("model.device=gpu", "model.device='gpu': use one of cpu, cuda, cuda:N, mps, xpu, xpu:N (a torch device, :N its "
                         "index; whether this machine has it is checked when the model loads)"),
])
def test_a_range_declared_on_a_field_is_one_line_naming_the_key_and_the_range(override, message, monkeypatch):
    """The ranges (and model.device's form) are the schema's field declarations, checked by one walk over the nested
    config dataclasses when the config is typed: before any model loads (loading it here would fail the test)."""

    def no_load(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(harness.config.model, "load_backend", no_load)
    cfg = compose_config([override])  # composes: the value has the field's type
    for attempt in (lambda: typed(cfg), lambda: load_model(typed(cfg))):
        with pytest.raises(ConfigError) as caught:
            attempt()
        assert str(caught.value) == message


def _enum_fields(cls: type = Config, prefix: str = "") -> list[tuple[str, type[Enum]]]:
    """Every schema key whose field is an enum, with the enum (read from the schema, so a new one is tested)."""
    found = []
    for name, kind in typing.get_type_hints(cls).items():
        if dataclasses.is_dataclass(kind):
            found += _enum_fields(kind, f"{prefix}{name}.")
        elif isinstance(kind, type) and issubclass(kind, Enum):
            found.append((prefix + name, kind))
    return found


def test_the_closed_choices_are_enums() -> None:
    keys = {key for key, _ in _enum_fields()}
    assert {"model.backend", "model.llamacpp.type_k", "model.llamacpp.type_v", "decoding.strategy",
            "run.context_overflow", "library.retrieval", "energy.meter", "library.source"} <= keys


@pytest.mark.parametrize(("key", "enum"), _enum_fields())
def test_a_value_outside_an_enum_fails_composition_naming_the_key_and_the_allowed_values(key, enum) -> None:
    allowed = ", ".join(m.value for m in enum)
    with pytest.raises(ConfigError) as caught:
        compose_config([f"{key}=nope"])  # refused by composition itself, before typed() or any model
    message = str(caught.value)
    assert message.startswith(f"{key}=nope: use one of {allowed}") and "\n" not in message


def test_a_config_built_in_python_is_held_to_the_same_declarations() -> None:
    """OmegaConf checks a composed config's enums; a Config built in Python is checked by the schema walk."""
    with pytest.raises(ConfigError, match=r"^decoding.strategy='beam': use one of greedy, sample$"):
        validate(Config(decoding=DecodingConfig(strategy="beam")))
    with pytest.raises(ConfigError, match=r"^decoding.n_samples=0: must be an integer >= 1 \(samples per problem\)$"):
        validate(Config(decoding=DecodingConfig(n_samples=0)))
    with pytest.raises(ConfigError, match=r"^decoding.max_new_tokens=True: must be an integer >= 1"):
        validate(Config(decoding=DecodingConfig(max_new_tokens=True)))
    validate(Config(decoding=DecodingConfig(strategy="sample", n_samples=2)))  # a plain string equal to a member


@pytest.mark.parametrize("device", ["cpu", "cuda", "cuda:1", "mps", "xpu:0"])
def test_each_device_form_composes(device) -> None:
    typed(compose_config([f"model.device={device}"]))  # whether this machine has it is check_device's question


@pytest.mark.parametrize("device", ["cuda:99", "xpu:7", "mps", "gpu"])
def test_a_device_this_machine_lacks_is_refused_before_the_model_loads(device):
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match=f"model.device={device!r}"):
        load_model(compose_config(["model=tiny_gemma3", f"model.device={device}"]))
    assert time.perf_counter() - t0 < 5  # no model was loaded


@pytest.mark.parametrize(
    "name,says",
    [
        ("grft", "condition.name='grft': did you mean graft?"),
        ("nothing", "condition.name='nothing': use one of baseline, graft, incontext"),
    ],
)
def test_an_unknown_condition_fails_before_the_model_loads(tmp_path, name, says):
    cfg = compose_config([f"condition.name={name}", f"runs_dir={tmp_path}", "tracking=off"])  # the real model
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match=says):
        run(cfg)
    assert time.perf_counter() - t0 < 5 and not any(tmp_path.iterdir())


@pytest.fixture(scope="module")
def short_fm():
    """The tiny model, told its context is 256 positions (its weights take far more, so a cut prompt still runs)."""
    fm = load_backend("transformers", source="tiny-gemma3")
    fm.fm.config.max_position_embeddings = 256
    return fm


def _long(words: int) -> Problem:
    return Problem("long-1", " ".join(["seven"] * words) + " What is 3+4?", "7")


def test_a_prompt_longer_than_the_context_is_refused_by_default(short_fm):
    c = typed(compose_config(["model=tiny_gemma3", "decoding.max_new_tokens=8"]))
    ok = Problem("short-1", "What is 1+1?", "2")
    assert fit_context([ok], short_fm, c) == [ok]
    with pytest.raises(ConfigError, match="problem long-1: its prompt is [0-9,]+ tokens") as caught:
        fit_context([ok, _long(200)], short_fm, c)
    assert "context of 256" in str(caught.value) and "run.context_overflow=truncate" in str(caught.value)


def test_truncate_cuts_the_problem_to_fit_and_records_it(short_fm, tmp_path):
    overrides = ["model=tiny_gemma3", "decoding.max_new_tokens=8", "run.context_overflow=truncate",
                 "determinism.batch_invariant=false"]  # the fixture's mode
    c = typed(compose_config(overrides))
    (p,) = fit_context([_long(200)], short_fm, c)
    info = p.source["context_overflow"]
    assert info["prompt_tokens"] > 256 and 0 < info["kept_problem_tokens"] < 200
    assert len(short_fm.encode(c.prompt.template.format(problem=p.problem))) + 8 <= 256
    assert p.problem.startswith("seven seven")

    data = tmp_path / "long.jsonl"
    data.write_text(json.dumps({"id": "long-1", "problem": _long(200).problem, "answer": "7"}) + "\n")
    cfg = compose_config([*overrides, "dataset=file", f"dataset.path={data}", "tracking=off", f"runs_dir={tmp_path}/r"])
    folder, _ = run(cfg, be=short_fm, progress=False)
    (row,) = folder.read_problems()
    assert row["source"]["context_overflow"] == info  # recorded in problems.jsonl, so in the manifest's hashes
    (out,) = folder.read_rows()
    assert len(out.completion.context_ids) + out.completion.decode_tokens <= 256
    assert audit(folder).ok
