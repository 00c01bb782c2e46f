"""One harness run: problems -> condition -> decode -> score -> run folder (outputs, summary, manifest) ->
MLflow. `run(cfg)` takes a composed config; `python -m harness` (harness/__main__.py) is the Hydra entry.

The run folder format is harness/RUN_FORMAT.md. Everything is written locally before tracking is tried,
so an unreachable MLflow never loses a run.
"""

from __future__ import annotations

import sys
import time
import warnings
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.table import Table
from tqdm import tqdm

from harness.answers import score
from harness.conditions import CONDITIONS
from harness.energy import make_meter
from harness.errors import ConfigError
from harness.hashing import jsonl_bytes, sha256_json, write_json, write_jsonl
from harness.manifest import build_manifest
from harness.metrics import summarize_groups, summarize_scores
from harness.problems import load_problems
from harness.tracking import default_tracking_uri, try_log_run_dir
from kvstore import Determinism, FrozenModel, environment_fingerprint, load_frozen_model

SUMMARY_FORMAT = "kvgraft-summary/1"
console = Console(width=None if sys.stdout.isatty() else 140)  # logs and pipes get full tables


def load_model(cfg: DictConfig) -> FrozenModel:
    det = Determinism(**OmegaConf.to_container(cfg.determinism, resolve=True))
    return load_frozen_model(cfg.model.source, det, device=cfg.model.device)


def comparable_key(cfg: DictConfig, fm: FrozenModel) -> str:
    """Runs with the same key differ only in condition/library: same model, data, prompt, decoding, settings."""
    c = OmegaConf.to_container(cfg, resolve=True)
    return sha256_json(
        {
            "model": fm.fingerprint,
            "tokenizer": fm.tokenizer_fingerprint,
            "dataset": c["dataset"],
            "prompt": c["prompt"],
            "decoding": c["decoding"],
            "determinism": c["determinism"],
        }
    )


def _totals(rows: list[dict]) -> dict[str, Any]:
    return {
        "tokens": {k: sum(r[f"{k}_tokens"] for r in rows) for k in ("prompt", "prefill", "grafted", "decode")},
        "time": {"wall_s": sum(r["wall_s"] for r in rows), "cpu_s": sum(r["cpu_s"] for r in rows)},
    }


def compare_summaries(baseline: dict, other: dict) -> dict[str, Any]:
    """Side-by-side figures of a run against its matching baseline (factors are baseline / other)."""

    def factor(a: float | None, b: float | None) -> float | None:
        return (a / b) if a is not None and b not in (None, 0) else None

    be, oe = baseline["energy"], other["energy"]
    both_measured = be.get("joules") is not None and oe.get("joules") is not None
    return {
        "baseline_run": baseline.get("run_dir"),
        "baseline_accuracy": baseline["scores"]["accuracy"],
        "baseline_accuracy_ci_low": baseline["scores"]["accuracy_ci_low"],
        "baseline_accuracy_ci_high": baseline["scores"]["accuracy_ci_high"],
        "accuracy": other["scores"]["accuracy"],
        "accuracy_delta": other["scores"]["accuracy"] - baseline["scores"]["accuracy"],
        "baseline_decode_tokens": baseline["tokens"]["decode"],
        "decode_tokens": other["tokens"]["decode"],
        "token_reduction": factor(baseline["tokens"]["decode"], other["tokens"]["decode"]),
        "wall_factor": factor(baseline["time"]["wall_s"], other["time"]["wall_s"]),
        "cpu_factor": factor(baseline["time"]["cpu_s"], other["time"]["cpu_s"]),
        "energy_factor": factor(be["joules"], oe["joules"]) if both_measured else None,
        "energy_status": "measured" if both_measured else f"unavailable ({oe.get('status')})",
    }


def run(
    cfg: DictConfig,
    run_dir: str | Path,
    fm: FrozenModel | None = None,
    baseline_summary: dict | None = None,
    progress: bool = True,
) -> Path:
    """Run the configured condition over the configured problems and write the run folder."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    root = Path(cfg.project_root)
    if cfg.condition.name not in CONDITIONS:
        raise ConfigError(f"condition={cfg.condition.name!r} is not one of {sorted(CONDITIONS)} (configs/condition/)")
    if cfg.decoding.n_samples < 1 or cfg.decoding.max_new_tokens < 1:
        raise ConfigError("decoding.n_samples and decoding.max_new_tokens must be >= 1")
    if cfg.decoding.strategy == "greedy" and cfg.decoding.n_samples > 1:
        raise ConfigError("greedy decoding with n_samples > 1 repeats one answer; use decoding=sample")
    d = cfg.dataset
    problems = load_problems(
        str(root / d.path) if d.path else None, d.hub_id, d.subset, d.split, dict(d.columns), d.limit
    )
    fm = fm or load_model(cfg)
    condition = CONDITIONS[cfg.condition.name](cfg, fm, root)
    meter, run_meter = make_meter(cfg.energy.meter), make_meter(cfg.energy.meter)

    rows: list[dict] = []
    partial = run_dir / "outputs.partial.jsonl"
    partial.unlink(missing_ok=True)
    t_run = time.perf_counter()
    run_meter.start()
    jobs = [(p, s) for p in problems for s in range(cfg.decoding.n_samples)]
    bar = tqdm(jobs, desc=f"{cfg.condition.name} {cfg.dataset.name}", unit="sample", disable=not progress)
    for problem, sample in bar:
        w0, c0 = time.perf_counter(), time.process_time()
        meter.start()
        a = condition.attempt(problem, sample)
        energy = meter.stop()
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        sc = score(a.generation.text, problem.answer)
        rows.append(
            {
                "problem_id": problem.id,
                "sample": sample,
                "condition": cfg.condition.name,
                "prompt": a.prompt,
                "prompt_token_ids": a.context_ids,
                "completion": a.generation.text,
                "completion_token_ids": a.generation.token_ids,
                "stop_reason": a.generation.stop_reason,
                "gold_answer": problem.answer,
                "extracted": sc.extracted,
                "answer": sc.answer,
                "correct": sc.correct,
                "prompt_tokens": len(a.context_ids),
                "prefill_tokens": a.generation.prefill_tokens,
                "grafted_tokens": a.grafted_tokens,
                "decode_tokens": a.generation.decode_tokens,
                "wall_s": round(wall, 6),
                "cpu_s": round(cpu, 6),
                "energy_j": energy.joules,
                "energy_status": energy.status,
                "entry_id": a.entry_id,
                "artifact_id": a.artifact_id,
                "similarity": a.similarity,
                "match": a.match,
            }
        )
        with partial.open("ab") as f:  # nothing lost if the run is interrupted: rows so far stay on disk
            f.write(jsonl_bytes(rows[-1:]))
        bar.set_postfix(correct=f"{sum(r['correct'] for r in rows)}/{len(rows)}")
    run_energy = run_meter.stop()
    run_wall = time.perf_counter() - t_run

    summary: dict[str, Any] = {
        "format": SUMMARY_FORMAT,
        "condition": cfg.condition.name,
        "model": fm.name,
        "dataset": cfg.dataset.name,
        "run_dir": str(run_dir),
        "comparable_key": comparable_key(cfg, fm),
        "scores": summarize_scores(rows),
        **_totals(rows),
        "energy": {"status": run_energy.status, "joules": run_energy.joules},
    }
    summary["time"]["run_wall_s"] = round(run_wall, 3)
    if cfg.condition.name == "graft":
        summary["groups"] = summarize_groups(rows)
    if baseline_summary is not None:
        summary["comparison"] = compare_summaries(baseline_summary, summary)

    config = OmegaConf.to_container(cfg, resolve=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    problem_rows = [p.to_row() for p in problems]
    write_jsonl(run_dir / "problems.jsonl", problem_rows)
    outputs = jsonl_bytes(rows)
    write_jsonl(run_dir / "outputs.jsonl", rows)
    write_json(run_dir / "summary.json", summary)
    desc = condition.describe()
    manifest = build_manifest(
        problems=problem_rows,
        prompt_template=cfg.prompt.template,
        config=config,
        model_fingerprint=fm.fingerprint,
        tokenizer_fingerprint=fm.tokenizer_fingerprint,
        determinism=fm.determinism.to_dict(),
        environment=environment_fingerprint(fm.device),
        rows=rows,
        outputs_bytes=outputs,
        summary=summary,
        library={k: desc["library"][k] for k in ("name", "version", "manifest_sha256")} if "library" in desc else None,
    )
    write_json(run_dir / "manifest.json", manifest)
    partial.unlink()

    if cfg.tracking.enabled:
        uri = cfg.tracking.uri or default_tracking_uri((root / cfg.runs_dir).resolve())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run_id = try_log_run_dir(
                run_dir,
                tracking_uri=uri,
                experiment=cfg.tracking.experiment,
                run_name=f"{cfg.condition.name}-{run_dir.name}",
            )
        for w in caught:
            if issubclass(w.category, RuntimeWarning):
                console.print(f"[yellow]warning:[/] {w.message}")
        if run_id:
            console.print(f"MLflow: run {run_id} in {uri} (experiment {cfg.tracking.experiment})")
    print_summary(summary, run_dir)
    return run_dir


def print_summary(summary: dict, run_dir: Path) -> None:
    s, t = summary["scores"], summary["tokens"]
    table = Table(title=f"{summary['condition']} on {summary['dataset']} ({summary['model']})")
    for col in (
        "problems",
        "accuracy [95% CI]",
        "prompt tok",
        "prefill tok",
        "grafted tok",
        "decode tok",
        "wall s",
        "cpu s",
        "energy",
    ):
        table.add_column(col)
    e = summary["energy"]
    table.add_row(
        str(s["n_problems"]),
        f"{s['accuracy']:.3f} [{s['accuracy_ci_low']:.3f}, {s['accuracy_ci_high']:.3f}]",
        str(t["prompt"]),
        str(t["prefill"]),
        str(t["grafted"]),
        str(t["decode"]),
        f"{summary['time']['wall_s']:.1f}",
        f"{summary['time']['cpu_s']:.1f}",
        f"{e['joules']:.1f} J" if e["joules"] is not None else "unavailable",
    )
    console.print(table)
    console.print(f"energy: {e['status']}")
    console.print(f"run folder: {run_dir}   (re-check: make rescore RUN={run_dir})")
