"""Typed config schema of the harness, registered with Hydra's ConfigStore so a misspelt key is an error.

One dataclass per config group (configs/<group>/*.yaml); `Config` ties them together. `run(cfg)` in
harness/run.py takes the composed config; `python -m harness` is the Hydra entry point.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from hydra.core.config_store import ConfigStore


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


@dataclass
class DatasetConfig:
    name: str = "kvgraft_original"
    path: str | None = None  # local jsonl/json/csv/parquet file (relative to the project root)
    hub_id: str | None = None  # a Hugging Face dataset id (read from the local cache when offline)
    subset: str | None = None  # the hub dataset's config name
    split: str = "train"
    columns: dict[str, str] = field(default_factory=dict)  # our field -> dataset column (id, problem, answer, solution)
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
    seed: int = 0


@dataclass
class ConditionConfig:
    name: str = "baseline"  # baseline | graft (harness.conditions.CONDITIONS)


@dataclass
class LibraryConfig:
    name: str = "kvgraft_original"
    version: int = 1
    source: str = "dataset"  # dataset (reference solutions) | harvest (a previous run's correct outputs)
    dataset: DatasetConfig = field(default_factory=lambda: DatasetConfig(path="problems/kvgraft_original.jsonl"))
    harvest_run: str | None = None  # run folder to harvest when source=harvest
    entry_template: str = "Problem: {problem}\n\nSolution: {solution}\n\nFinal answer: {answer}\n\n"
    root: str = "runs/library"  # libraries live in <root>/<name>-v<version>-<model fingerprint[:12]>/
    store: str = "runs/store"  # the artifact store the library's artifacts go to
    exclude_self: bool = False  # true: the evaluated problem never reaches the context (held-out)
    retrieval: str = "bm25"  # how a non-exact match is found: bm25 | none


@dataclass
class TrackingConfig:
    enabled: bool = True
    uri: str | None = None  # default: sqlite:////<abs>/runs/mlflow.db
    experiment: str = "kvgraft-aime"


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
    runs_dir: str = "runs"
    project_root: str = "."  # relative paths in the config resolve against this


def register() -> None:
    """Register the schema as `base_config`: configs/config.yaml lists it first, so every group file is
    merged into a typed node and an unknown key fails composition."""
    ConfigStore.instance().store(name="base_config", node=Config)


register()


CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"


def compose_config(overrides: list[str] | None = None, config_name: str = "config"):
    """Compose the config tree without Hydra's app runner (for library/compare CLIs and tests)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3", job_name="kvgraft"):
        return compose(config_name=config_name, overrides=list(overrides or []))
