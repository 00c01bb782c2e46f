"""Typed config schema of the harness, registered with Hydra's ConfigStore so a misspelt key is an error.

One dataclass per config group (configs/<group>/*.yaml); `Config` ties them together. `run(cfg)` in
harness/run.py takes the composed config (`compose_config` here, or Hydra's in `python -m harness`);
`typed(cfg)` turns it into these dataclasses, the pieces conditions are built from; `load_model(cfg)` loads
the frozen model it names.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from harness.errors import ConfigError
from harness.execution import ExecutionConfig
from harness.tracking import DEFAULT_EXPERIMENT
from kvstore import Determinism, FrozenModel, load_frozen_model

D = TypeVar("D")


@dataclass
class ModelConfig:
    name: str = "gemma3-270m"
    source: str = "gemma3-270m"  # "gemma3-270m" (bundled GGUF), "tiny-gemma3", a local folder or a hub id
    device: str = "cpu"


@dataclass
class DeterminismConfig:  # mirrors kvstore.Determinism
    threads: int = 2
    deterministic_algorithms: bool = True
    attn_implementation: str = "sdpa"
    dtype: str = "float32"
    prefill_chunk: int = 512
    profile: str = "native"  # kernel paths: native | portable (kvstore/environment.py)
    allow_environment_mismatch: bool = False  # graft artifacts from another compute environment (not guaranteed exact)


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
    limit: int | None = None  # take the first N problems


@dataclass
class PromptConfig:
    name: str = "answer"
    template: str = "Problem: {problem}\nGive the answer as an integer from 0 to 999.\nFinal answer:"
    stop: list[str] = field(default_factory=lambda: ["\n"])


@dataclass
class DecodingConfig:
    strategy: str = "greedy"  # greedy | sample
    max_new_tokens: int = 64
    n_samples: int = 1
    temperature: float = 0.7
    top_p: float = 0.95
    seed: int = 0  # sample s samples with seed + s
    batch_size: int = 1  # samples of a problem decoded together (1: one at a time); part of comparable_key


@dataclass
class ConditionConfig:
    name: str = "baseline"  # baseline | graft | incontext (harness.conditions.CONDITIONS)


@dataclass
class LibraryConfig:
    name: str = "kvgraft_original"
    version: int = 2
    source: str = "dataset"  # dataset (reference solutions) | harvest (a previous run's correct outputs)
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
    retrieval: str = "bm25"  # how a non-exact match is found: bm25 | none
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
    meter: str = "auto"  # auto | nvml | rapl | none


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
    execution: ExecutionConfig = field(default_factory=ExecutionConfig)  # execution=ray: harness/distributed.py
    runs_dir: str = "runs"
    project_root: str = "."  # relative paths in the config resolve against this


def _as(cls: type[D], data: Any) -> D:
    """`data` (a mapping) as the dataclass `cls`, nested dataclass fields included; unknown keys are errors."""
    if dataclasses.is_dataclass(data):
        return data  # type: ignore[return-value]
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"config section {cls.__name__}: unknown key(s) {unknown}; see harness/config.py")
    values = {}
    for name, value in data.items():
        sub = _SECTIONS.get((cls, name))
        values[name] = _as(sub, value) if sub is not None and value is not None else value
    return cls(**values)


def typed(cfg: DictConfig | Config) -> Config:
    """The composed config as the typed `Config` (resolved), and checked: decoding settings that cannot work
    are a ConfigError naming the key."""
    c = cfg if isinstance(cfg, Config) else _as(Config, OmegaConf.to_container(cfg, resolve=True))
    d = c.decoding
    if d.strategy not in ("greedy", "sample"):
        raise ConfigError(f"decoding.strategy={d.strategy!r}: use 'greedy' or 'sample' (configs/decoding/)")
    if d.n_samples < 1 or d.max_new_tokens < 1:
        raise ConfigError("decoding.n_samples and decoding.max_new_tokens must be >= 1")
    if d.batch_size < 1:
        raise ConfigError(f"decoding.batch_size={d.batch_size}: use 1 (one sample at a time) or more")
    if d.strategy == "greedy" and d.n_samples > 1:
        raise ConfigError("greedy decoding with n_samples > 1 repeats one answer; use decoding=sample")
    return c


def load_model(cfg: DictConfig | Config) -> FrozenModel:
    """The frozen model the config names, under its pinned determinism settings."""
    c = typed(cfg)
    det = Determinism(**dataclasses.asdict(c.determinism))
    return load_frozen_model(c.model.source, det, device=c.model.device)


def register() -> None:
    """Register the schema as `base_config`: configs/config.yaml lists it first, so every group file is
    merged into a typed node and an unknown key fails composition."""
    ConfigStore.instance().store(name="base_config", node=Config)


_SECTIONS: dict[tuple[type, str], type] = {
    (Config, "model"): ModelConfig, (Config, "determinism"): DeterminismConfig, (Config, "dataset"): DatasetConfig,
    (Config, "prompt"): PromptConfig, (Config, "decoding"): DecodingConfig, (Config, "condition"): ConditionConfig,
    (Config, "library"): LibraryConfig, (Config, "tracking"): TrackingConfig, (Config, "energy"): EnergyConfig,
    (LibraryConfig, "dataset"): DatasetConfig, (Config, "execution"): ExecutionConfig,
}  # fmt: skip
register()


CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"


def compose_config(overrides: list[str] | None = None, config_name: str = "config"):
    """Compose the config tree without Hydra's app runner (for library/compare CLIs and tests)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3", job_name="kvgraft"):
        return compose(config_name=config_name, overrides=list(overrides or []))
