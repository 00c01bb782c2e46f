"""Typed config schema of the harness, registered with Hydra's ConfigStore so a misspelt key is an error.

One dataclass per config group (configs/<group>/*.yaml); `Config` ties them together. `run(cfg)` in
harness/run/loop.py takes the composed config (`compose_config` here, or Hydra's in `python -m harness`);
`typed(cfg)` turns it into these dataclasses, the pieces conditions are built from, and refuses values that
cannot work (one ConfigError line naming the key and what it may be) before any model loads; `load_model(cfg)`
checks the device, then loads the backend it names (model.backend: transformers, the default, or llamacpp with
model.llamacpp's settings; docs/backends.md) with its frozen model.

`check_overrides(args)` refuses a misspelt override in one line with the near miss ("did you mean
decoding.max_new_tokens?"); every entry point runs it (`python -m harness` before Hydra, `compose_config` for
`python -m harness.compare` and `python -m harness.library`). Closed choices are enums, refused at composition;
ranges (`bounded`) and model.device's form are declared on the fields too, and `validate` checks every declared
field in one walk over the schema (`check_fields`); only the rules between fields are written out in `validate`.

A leaf of the harness: it imports no harness module but the exception family (harness.errors), the execution
schema (harness.config.execution), the field declarations with their checking walk (harness.config.fields) and the
run identity's recorded-config rules (harness.config.identity), each itself a leaf; the `kvgraft.claim_dir` resolver,
which creates Hydra's run or sweep folder exclusively (harness.record.folder.claim), lives with the Hydra app in
harness/__main__.py. `typed` is `OmegaConf.to_object`
over the schema (no hand-written conversion).

Over 400 lines for a reason: it is the whole schema (one dataclass per config group, the closed choices as enums,
the ranges on the fields) with the composition and override checks that read it; moving `compose_config` /
`check_overrides` out would make every caller (tests, scripts, entry points) import a second module for one
concept. The generic field walk is harness/config/fields.py.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from harness.config.exact import EXACT_DEFAULT, ConfigFiles
from harness.config.exact import resolve as resolve_exact_default
from harness.config.execution import ExecutionConfig
from harness.config.fields import bounded, check_choice, check_fields, choice, field_note
from harness.config.identity import recorded_config
from harness.errors import ConfigError
from kvstore import Backend, Determinism, KVStoreError, backend_class, backend_missing, backend_names, settings_class

DEFAULT_EXPERIMENT = "kvgraft-aime"  # the one default MLflow experiment name (tracking.experiment, log_run)

# Closed choices are enums: OmegaConf refuses any other value when the config is composed, in one line naming the
# key and the allowed values (`compose_config` turns it into a ConfigError). StrEnum members equal their strings,
# so comparisons, JSON (comparable_key, resume key, manifest) and config.yaml read and hash exactly as before;
# member names are the values, so OmegaConf writes them unchanged.
Strategy = StrEnum("Strategy", "greedy sample")  # StrEnum's functional form: each member's value is its name
LibrarySource = StrEnum("LibrarySource", "dataset harvest")
Retrieval = StrEnum("Retrieval", "bm25 none random")
Meter = StrEnum("Meter", "auto measured nvml rapl codecarbon none")
ContextOverflow = StrEnum("ContextOverflow", "refuse truncate")
# model.backend: every backend kvstore's registry holds (kvstore.backends; transformers, the default, first)
ModelBackend = StrEnum("ModelBackend", " ".join(backend_names()))
KVType = StrEnum("KVType", "float16 float32 bfloat16")  # llama.cpp KV cache types an artifact can store

BACKENDS = tuple(b.value for b in ModelBackend)  # model.backend's values, as plain strings
CONTEXT_OVERFLOW = tuple(o.value for o in ContextOverflow)


#: model.device's forms (a torch device type, then :N its index); check_device asks torch whether it exists.
DEVICE_FIELD = {
    "pattern": r"(cpu|cuda|mps|xpu)(:\d+)?",
    "forms": "cpu, cuda, cuda:N, mps, xpu, xpu:N",
    "hint": "a torch device, :N its index; whether this machine has it is checked when the model loads",
}


def settings_schema(backend: str, name: str, fields: dict[str, Any], skip: tuple[str, ...] = ("model_name",)) -> type:
    """`model.<backend>`'s schema, generated from the backend's own Settings dataclass (kvstore.settings_class): the
    same fields, types and defaults, so the config and the engine cannot drift apart; `fields` adds the harness's
    declarations (ranges, closed choices) by name; `skip` leaves out what the harness sets itself (model_name is
    model.name)."""
    cls = settings_class(backend)
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        if f.name in fields:
            kind, spec = fields[f.name]
            out.append((f.name, kind, spec))
        else:
            default = (field(default_factory=f.default_factory) if f.default_factory is not dataclasses.MISSING
                       else field(default=f.default))
            out.append((f.name, hints[f.name], default))
    schema = dataclasses.make_dataclass(name, out)
    schema.__module__ = __name__
    globals()[name] = schema  # importable by its name (pickled by reference to Ray workers and Hydra's launchers)
    return schema


#: model.llamacpp (kvstore.backends.llamacpp.settings.LlamaCppSettings) with the harness's ranges and choices
LlamaCppConfig = settings_schema("llamacpp", "LlamaCppConfig", {
    "n_ctx": (int, bounded(4096, at_least=1, hint="the context size: prompt + decoding.max_new_tokens must fit")),
    "n_batch": (int, bounded(512, at_least=1, hint="the prefill schedule: chunks of n_batch tokens")),
    "n_ubatch": (int, bounded(512, at_least=1, hint="llama.cpp's physical batch size")),
    "threads": (int, bounded(2, at_least=1, hint="llama.cpp threads, decode and batch")),
    "type_k": (KVType, choice(KVType.float16, "the KV cache type; quantized KV caches are not stored as artifacts")),
    "type_v": (KVType, choice(KVType.float16, "the KV cache type; quantized KV caches are not stored as artifacts")),
})

#: Backends whose settings the harness does not spell out: transformers (model.source / model.device and the
#: determinism group are its settings) and llama.cpp (its section above, in every resolved config since it was added).
_OWN_SECTIONS = ("transformers", "llamacpp")


@dataclass
class ModelBase:
    name: str = "gemma3-270m"
    source: str = "gemma3-270m"  # "gemma3-270m" (bundled GGUF), "tiny-gemma3", a local folder or a hub id
    device: str = field(default="cpu", metadata=DEVICE_FIELD)  # checked against this machine by check_device
    backend: ModelBackend = choice(ModelBackend.transformers, "the generation engine; configs/model/*.yaml, e.g. "
                                   "model=gemma3_270m_llamacpp; docs/backends.md")
    llamacpp: LlamaCppConfig = field(default_factory=LlamaCppConfig)  # model.backend=llamacpp's settings
    # null: the prompt as written (base models); "model": inside the model's own chat template (harness/task/chat.py)
    chat: typing.Optional[str] = None  # noqa: UP045  (OmegaConf's spelling)
    # null: the whole completion is scored; "think" (<think> ... </think>), "model" (read from the chat template) or
    # "OPEN CLOSE": the answer follows the reasoning trace's closing delimiter (harness/task/trace.py)
    trace: typing.Optional[str] = None  # noqa: UP045


#: model: the fields above, then one optional section per other registered backend (`model.<name>`, None unless a
#: config gives it; a None section is left out of the recorded config, so registering a backend moves no hash).
ModelConfig = dataclasses.make_dataclass(
    "ModelConfig",
    [(name, typing.Optional[settings_schema(name, f"{name.capitalize()}Config", {})], field(default=None))  # noqa: UP045
     for name in backend_names() if name not in _OWN_SECTIONS],
    bases=(ModelBase,),
)
ModelConfig.__module__ = __name__


#: The determinism schema is generated from the engine's own dataclass (kvstore.Determinism: the same fields, types
#: and defaults, but mutable, as a Hydra schema must be), so the config and the engine cannot drift apart; the
#: harness's own ranges are added here, and `validate` also runs the engine's checks on it (a bad value is its
#: SettingsError as one ConfigError line).
_DETERMINISM_BOUNDS = {
    "threads": {"at_least": 1, "hint": "torch intra-op threads"},
    "prefill_chunk": {"at_least": 1, "hint": "tokens per prefill step"},
}
#: The harness's own defaults where they differ from the engine's: the batch-invariant mode is on (the exact default,
#: issue 52: harness.config.exact; kvstore.Determinism keeps false, the value an artifact's absent setting means).
_HARNESS_DEFAULTS = {"batch_invariant": EXACT_DEFAULT}
DeterminismConfig = dataclasses.make_dataclass(
    "DeterminismConfig",
    [(f.name, typing.get_type_hints(Determinism)[f.name],
      bounded(f.default, **_DETERMINISM_BOUNDS[f.name]) if f.name in _DETERMINISM_BOUNDS
      else field(default=_HARNESS_DEFAULTS.get(f.name, f.default)))
     for f in dataclasses.fields(Determinism)],
)
DeterminismConfig.__module__ = __name__


@dataclass
class DatasetConfig:
    name: str = "kvgraft_original"
    path: str | None = None  # local jsonl/json/csv/parquet file (relative to the project root)
    hub_id: str | None = None  # a Hugging Face dataset id (read from the local cache when offline)
    subset: str | None = None  # the hub dataset's config name
    split: str = "train"
    # our field -> dataset column; every field is listed so `dataset.columns={id: ID, ...}` overrides it as written
    columns: dict[str, str] = field(
        default_factory=lambda: {"id": "id", "problem": "problem", "answer": "answer", "solution": "solution"}
    )
    limit: int | None = bounded(None, at_least=1, hint="the first N problems; null takes them all")


@dataclass
class PromptConfig:
    name: str = "answer"
    template: str = "Problem: {problem}\nGive the answer as an integer from 0 to 999.\nFinal answer:"
    stop: list[str] = field(default_factory=lambda: ["\n"])


@dataclass
class DecodingConfig:
    strategy: Strategy = Strategy.greedy  # greedy | sample
    max_new_tokens: int = bounded(64, at_least=1, hint="the token budget of each answer")
    n_samples: int = bounded(1, at_least=1, hint="samples per problem")
    temperature: float = bounded(0.7, at_least=0, hint="sampling needs > 0; greedy decoding ignores it")
    top_p: float = bounded(0.95, above=0, at_most=1, hint="1 keeps every token; 0 keeps none")
    seed: int = 0  # sample s samples with seed + s
    # samples of a problem decoded together (1: one at a time); part of comparable_key
    batch_size: int = bounded(1, at_least=1, hint="1 decodes one sample at a time")


@dataclass
class ConditionConfig:
    name: str = "baseline"  # baseline | graft | incontext | ... (harness.run.conditions.CONDITIONS)
    # the condition's own settings (its Settings dataclass, harness/run/conditions/; configs/condition/<name>.yaml)
    settings: dict[str, Any] = field(default_factory=dict)


@dataclass
class LibraryConfig:
    name: str = "kvgraft_original"
    version: int = 2
    source: LibrarySource = LibrarySource.dataset  # dataset (reference solutions) | harvest (a run's correct outputs)
    dataset: DatasetConfig = field(default_factory=lambda: DatasetConfig(path="problems/kvgraft_original.jsonl"))
    harvest_run: str | None = None  # run folder to harvest when source=harvest
    # The entry restates the problem as the answer prompt asks it, then the verified answer, then the worked
    # solution: a query that repeats the problem continues where the entry did, at "Final answer:".
    entry_template: str = (
        "Problem: {problem}\nGive the answer as an integer from 0 to 999.\nFinal answer: {answer}\n\n"
        "Solution: {solution}\n\n"
    )
    root: str = "runs/library"  # libraries live in <root>/<name>-v<version>-<model fingerprint[:12]>/
    store: str = "runs/store"  # the artifact store the library's artifacts go to
    exclude_self: bool = False  # true: the evaluated problem never reaches the context (held-out)
    retrieval: Retrieval = Retrieval.bm25  # how a non-exact match is found: bm25 | none | random (a random other entry)
    prefetch_mb: int = 1024  # read + verify the next problem's artifact in the background, within this budget (0: off)


@dataclass
class TrackingConfig:
    enabled: bool = True
    uri: str | None = None  # default: sqlite:////<abs>/runs/mlflow.db
    experiment: str = DEFAULT_EXPERIMENT
    traces: bool = True  # one MLflow trace per attempt (spans + score feedback), built from the run's rows
    http_retries: int = 2  # an http(s) tracking URI: retries per request (MLflow's default, 7, waits ~250 s)
    http_timeout_s: int = 10  # an http(s) tracking URI: seconds per request


@dataclass
class EnergyConfig:
    # auto (a meter, else CodeCarbon's estimate) | measured (never an estimate) | nvml | rapl | codecarbon | none
    meter: Meter = Meter.auto


@dataclass
class RunConfig:
    """How a run starts and what it does with input it cannot take whole (not part of comparable_key)."""

    fresh: bool = False  # true: start over in a new folder instead of resuming an interrupted run of the same config
    # a prompt (+ decoding.max_new_tokens) longer than the model's context: refuse (error naming the problem) or
    # truncate the problem text to fit (recorded in problems.jsonl's source and on screen)
    context_overflow: ContextOverflow = ContextOverflow.refuse
    # problems in flight: the jobs of up to N problems decode together in one engine batch (vLLM: submitted at once;
    # transformers: rows of different problems left-padded in one batch; llama.cpp decodes one context: 1). Rows are
    # written in problem order, one wave of N problems at a time. Left out of recorded configs at 1.
    in_flight: int = bounded(1, at_least=1, hint="how many problems decode together in the engine")


@dataclass
class CompareRunConfig:
    """One run of the compare job: a condition and, for a condition with a library, its group."""

    condition: str = "graft"
    group: str | None = None  # recurring | held-out (library.exclude_self=false | true); null without a library


@dataclass
class CompareConfig:
    """What the compare job (make aime-graft) runs and checks (configs/compare/; harness.compare.comparison.Plan): the
    baseline every factor is against, the other runs in table order, and the pairs whose rows must be identical."""

    baseline: str = "baseline"
    runs: list[CompareRunConfig] = field(default_factory=list)
    identical: list[list[str]] = field(default_factory=list)  # [run label, its twin's label], e.g. graft (recurring)


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    determinism: DeterminismConfig = field(default_factory=DeterminismConfig)
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    prompt: PromptConfig = field(default_factory=PromptConfig)
    decoding: DecodingConfig = field(default_factory=DecodingConfig)
    condition: ConditionConfig = field(default_factory=ConditionConfig)
    library: LibraryConfig = field(default_factory=LibraryConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    energy: EnergyConfig = field(default_factory=EnergyConfig)
    run: RunConfig = field(default_factory=RunConfig)
    execution: ExecutionConfig = field(default_factory=ExecutionConfig)  # execution=ray: harness/run/distributed.py
    compare: CompareConfig = field(default_factory=CompareConfig)  # the compare job's runs (configs/compare/)
    runs_dir: str = "runs"  # relative: under project_root (run folders, resume, MLflow's default store)
    project_root: str = "."  # relative paths in the config resolve against this


def typed(cfg: DictConfig | Config) -> Config:
    """The composed config as the typed `Config` (resolved), and checked (`validate`): a value that cannot work
    is a ConfigError naming the key and what it may be, raised before any model loads."""
    if isinstance(cfg, Config):
        c = cfg
    else:  # OmegaConf builds the dataclasses (resolved); the schema merge refuses an unknown key, a wrong type or
        # a value that is not a member of its enum
        from omegaconf.errors import OmegaConfBaseException

        try:
            c = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Config), cfg))
        except OmegaConfBaseException as exc:
            raise ConfigError(f"config: {_one_line(exc)}; see harness/config/schema.py") from None
    validate(c)
    return c


def validate(c: Config) -> None:
    """Refuse settings that cannot work, one ConfigError line each: every field's own range, enum or form as the
    schema declares it (`check_fields`), then the rules between fields (llama.cpp on the CPU, greedy decoding with
    one sample, temperature > 0 for sampling) and the engine's checks of the determinism settings. The condition
    name is checked against the registry by harness.run.loop (harness.run.conditions imports this module), also before
    the
    model loads."""
    check_fields(c)
    check_backend(c.model, c.determinism.batch_invariant, c.run.in_flight, c.decoding.batch_size)
    d = c.decoding
    if d.strategy == "greedy" and d.n_samples > 1:
        raise ConfigError("greedy decoding with n_samples > 1 repeats one answer; use decoding=sample")
    if d.strategy == "sample" and d.temperature <= 0:
        raise ConfigError(f"decoding.temperature={d.temperature}: sampling needs temperature > 0 (0 is greedy "
                          "decoding: use decoding=greedy, whose rows are recorded as greedy)")
    if c.run.in_flight > 1 and c.execution.name != "local":
        raise ConfigError(f"run.in_flight={c.run.in_flight} with execution={c.execution.name}: problems in flight "
                          "share one engine, the workers of execution=ray each decode their own jobs; use one of them "
                          "(run.in_flight=1 with execution=ray)")
    if c.execution.workers < 1:  # before the model loads (issue 41, finding 7)
        raise ConfigError(f"execution.workers={c.execution.workers}: a run needs at least 1 worker; use "
                          "execution.workers=N with N >= 1")
    try:  # the engine's own checks of its settings (dtype, attention, profile, ...), before the model loads
        Determinism(**dataclasses.asdict(c.determinism))
    except KVStoreError as exc:
        raise ConfigError(str(exc)) from None


def check_backend(m: ModelConfig, batch_invariant: bool = False, in_flight: int = 1, batch_size: int = 1) -> None:
    """A backend whose settings take no `device` (llama.cpp, vLLM's CPU build, the fake) runs on the CPU here:
    model.device=cpu, a ConfigError naming model.device otherwise, before anything loads. Asked of the backend's
    Settings class (`takes_device()`), no backend named. run.in_flight > 1 and decoding.batch_size > 1 on a backend
    whose class decodes one context, one row at a time (llama.cpp) are refused here too, read off its class's
    capabilities (the registry), before anything loads.
    (model.backend's values and each section's ranges and choices are the schema's: `check_fields`, and OmegaConf at
    composition.)"""
    name = str(m.backend)
    cls = backend_class(name)  # the registry's class: everything below is its answer, nothing loaded
    refusal = cls.batch_invariant_refusal() if batch_invariant else None
    if refusal:  # the backend's own word on why it cannot, before anything loads
        raise ConfigError(refusal)
    if m.device != "cpu" and not cls.settings_class.takes_device():
        raise ConfigError(f"model.device={m.device!r}: the {name} backend runs on the CPU here; use model.device=cpu")
    missing = backend_missing(name)  # an engine this Python lacks (vLLM outside .venv-vllm): one line, no load
    if missing:
        raise ConfigError(f"model.backend={name}: {missing}")
    check_capabilities(cls, batch_size, in_flight)


def check_capabilities(cls: type[Backend], batch_size: int, in_flight: int) -> None:
    """What a run asks of a backend class (the registry's before anything loads; a loaded backend's `type(be)` for
    a direct caller of harness.run.decode): several problems in flight (run.in_flight > 1) and several rows of a
    problem together (decoding.batch_size > 1); a ConfigError naming the key otherwise, in the class's own words
    (`Backend.in_flight_refusal`, `Backend.batched_rows_refusal`). The one place these refusals are worded."""
    refused = cls.in_flight_refusal(in_flight)
    if refused:
        raise ConfigError(f"run.in_flight={in_flight}: {refused}; set run.in_flight=1")
    refused = cls.batched_rows_refusal(batch_size)
    if refused:
        raise ConfigError(f"decoding.batch_size={batch_size}: {refused}; set decoding.batch_size=1")


def recorded(cfg: DictConfig | Config) -> dict[str, Any]:
    """The resolved config as a run records and hashes it (config.yaml, the resume key): each setting at the value
    runs had before it existed left out, and a backend section no config gave (None), so a newly registered backend
    changes no earlier run's hashes (the rules: harness.config.identity.RECORDED_ABSENT)."""
    config = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dataclasses.asdict(cfg)
    sections = tuple(name for name in backend_names() if name not in _OWN_SECTIONS)
    return recorded_config(config, sections)


def register() -> None:
    """Register the schema as `base_config`: configs/config.yaml lists it first, so every group file is
    merged into a typed node and an unknown key fails composition."""
    ConfigStore.instance().store(name="base_config", node=Config)


register()


CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"


def _job_name(overrides: str) -> str:
    """`${kvgraft.job_name:${hydra.job.override_dirname}}`: a sweep job's overrides as one folder name. A value
    holding a path (dataset.path=/data/x.jsonl) must not nest folders, and a long list must fit a file name: `/`
    becomes `_`, and past 120 characters the name is cut and ends in a hash of the whole list (still distinct)."""
    import hashlib

    name = overrides.replace("/", "_").replace("\\", "_")
    if len(name) > 120:
        name = f"{name[:100]}~{hashlib.sha256(overrides.encode()).hexdigest()[:12]}"
    return name


OmegaConf.register_new_resolver("kvgraft.job_name", _job_name, replace=True)


def _under(root: str, path: str) -> str:
    """`${kvgraft.under:${project_root},${runs_dir}}`: where a run's folder goes, resolved as the run loop resolves
    runs_dir (`Path(project_root) / runs_dir`): under project_root when relative, as given when absolute. With the
    default project_root `.` it is runs_dir itself, so Hydra's folder and the folder a resume looks in agree."""
    return str(Path(root) / path)


OmegaConf.register_new_resolver("kvgraft.under", _under, replace=True)


def _keys(cls: type, prefix: str = "") -> tuple[set[str], set[str]]:
    """Every dotted key of the schema `cls`, and the keys of its free-form mappings (dataset.columns)."""
    keys, mappings = set(), set()
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = prefix + f.name
        keys.add(key)
        kind = hints[f.name]
        if typing.get_origin(kind) in (typing.Union, types.UnionType):  # an optional section: model.<backend>
            kind = next((a for a in typing.get_args(kind) if a is not type(None)), kind)
        sub = kind if dataclasses.is_dataclass(kind) else None
        if sub is not None:
            k, m = _keys(sub, key + ".")
            keys |= k
            mappings |= m
        elif typing.get_origin(kind) is dict:
            mappings.add(key)
    return keys, mappings


def _groups() -> dict[str, list[str]]:
    """Config groups (configs/<group>/) and their options."""
    return {d.name: sorted(p.stem for p in d.glob("*.yaml")) for d in CONFIG_DIR.iterdir() if d.is_dir()}


def _near(word: str, choices: list[str]) -> str:
    near = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f"did you mean {near[0]}? " if near else ""


def check_overrides(args: list[str]) -> None:
    """Refuse, in one ConfigError line with the near miss, an override whose key the schema does not have
    (`decoding.max_new_token=8`: did you mean decoding.max_new_tokens?) or a group option that does not exist
    (`condition=graf`), or a value a closed choice does not have (`energy.meter=bogus`: use one of auto, nvml,
    rapl, none). Hydra flags, `hydra.*` and `~key` deletions are left to Hydra."""
    keys, mappings = _keys(Config)
    groups = _groups()
    for arg in args:
        if arg.startswith("-") or arg.startswith("~") or "=" not in arg:
            continue
        key, _, value = arg.lstrip("+").partition("=")
        if key.startswith("hydra") or "/" in key or "@" in key:
            continue
        if key in groups:
            for option in value.split(","):  # a sweep lists several
                option = option.strip()
                if option not in groups[key] and option != "null":
                    raise ConfigError(f"{key}={option}: no such option in configs/{key}/; {_near(option, groups[key])}"
                                      f"the options are {', '.join(groups[key])}")
            continue
        if key in keys or any(key.startswith(m + ".") for m in mappings):
            check_choice(Config, key, [v.strip() for v in value.split(",")])  # a closed choice, before Hydra runs
            continue
        hint = _near(key, sorted(keys))
        raise ConfigError(f"{arg}: no config key {key!r}; {hint}the keys are in harness/config/schema.py "
                          "(python -m harness --cfg job lists them)")


def _one_line(exc: Exception) -> str:
    """Hydra's / OmegaConf's message in one line: their first line (and their cause's), the key it names when the
    line does not, and that field's range and hint from the schema (`_field_note`)."""
    text = str(exc).strip().splitlines()
    first = text[0] if text else type(exc).__name__
    cause = exc.__cause__
    if cause is not None and str(cause).strip():
        first = f"{first} ({str(cause).strip().splitlines()[0]})"
    key = next((k for k in (getattr(e, "full_key", None) for e in (exc, cause)) if isinstance(k, str) and k), None)
    if key is None:
        return first
    return f"{first if key in first else f'{key}: {first}'}{_field_note(key)}"


def _field_note(key: str) -> str:
    """What the schema declares for the field at dotted `key` (harness.config.fields.field_note on `Config`)."""
    return field_note(Config, key)


def compose_config(overrides: list[str] | None = None, config_name: str = "config",
                   notes: list[str] | None = None):
    """Compose the config tree without Hydra's app runner (for library/compare CLIs and tests). A bad override
    is one ConfigError line (with the near miss for a misspelt key), never a traceback. The exact default is decided
    here (harness.config.exact.resolve: off where the mode cannot hold, a ConfigError where it was asked for there);
    its one line, when there is one, is appended to `notes` for the entry point to print (once, after its profile
    re-execution: harness.config.exact.print_note)."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import open_dict
    from omegaconf.errors import OmegaConfBaseException

    overrides = list(overrides or [])
    check_overrides(overrides)
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3", job_name="kvgraft"):
            cfg = compose(config_name=config_name, overrides=overrides, return_hydra_config=True)
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(f"bad override in {' '.join(overrides) or '(none)'}: {_one_line(exc)}") from None
    files = ConfigFiles.of_hydra(cfg.hydra)  # which files it read: one that sets the mode asks for it
    with open_dict(cfg):
        del cfg["hydra"]
    note = resolve_exact_default(cfg, overrides, files)
    if note and notes is not None:
        notes.append(note)
    return cfg
