"""One harness run: problems -> condition -> decode -> score -> run folder (outputs, summary, manifest) ->
MLflow. `run(cfg)` takes a composed config and returns (RunFolder, Summary); `python -m harness`
(harness/__main__.py) is the Hydra entry; the graft-vs-baseline comparison is harness/compare.py.

The run folder format is harness/RUN_FORMAT.md. Everything is written locally before tracking is tried,
so an unreachable MLflow never loses a run.
"""

from __future__ import annotations

import dataclasses
import sys
import time
import warnings
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.table import Table
from tqdm import tqdm

from harness.answers import score
from harness.conditions import build_condition
from harness.config import Config, load_model, typed
from harness.energy import make_meter
from harness.hashing import sha256_json
from harness.problems import load_problems
from harness.record import Row, Summary
from harness.run_folder import RunFolder
from harness.tracking import default_tracking_uri, try_log_run_dir
from kvstore import FrozenModel, environment_fingerprint

__all__ = ["comparable_key", "load_model", "print_summary", "run"]

console = Console(width=None if sys.stdout.isatty() else 140)  # logs and pipes get full tables
NOT_EXACT = ("not guaranteed exact: determinism.allow_environment_mismatch=true lets grafts of artifacts deposited "
             "in another compute environment through")


def comparable_key(cfg: DictConfig | Config, fm: FrozenModel) -> str:
    """Runs with the same key differ only in condition/library: same model, data, prompt, decoding, settings."""
    c = dataclasses.asdict(typed(cfg))
    return sha256_json(
        {
            "model": fm.fingerprint,
            "tokenizer": fm.tokenizer_fingerprint,
            **{k: c[k] for k in ("dataset", "prompt", "decoding", "determinism")},
        }
    )


def run(
    cfg: DictConfig,
    folder: RunFolder | str | Path | None = None,
    fm: FrozenModel | None = None,
    progress: bool = True,
    build_library_if_missing: bool = False,
) -> tuple[RunFolder, Summary]:
    """Run the configured condition over the configured problems, write the run folder (a new one under
    `runs_dir` unless `folder` is given), log it to MLflow if tracking is on; return the folder and summary."""
    c = typed(cfg)
    root = Path(c.project_root)
    if folder is None:
        folder = RunFolder.new(root / c.runs_dir, c.condition.name)
    elif not isinstance(folder, RunFolder):
        folder = RunFolder(folder)
    d = c.dataset
    problems = load_problems(
        str(root / d.path) if d.path else None, d.hub_id, d.subset, d.split, dict(d.columns), d.limit
    )
    fm = fm or load_model(c)
    condition = build_condition(
        c.condition.name, fm, c.prompt, c.decoding, c.library, root, build_library_if_missing=build_library_if_missing
    )
    meter, run_meter = make_meter(c.energy.meter), make_meter(c.energy.meter)

    folder.begin()
    rows: list[Row] = []
    t_run = time.perf_counter()
    run_meter.start()
    jobs = [(p, s) for p in problems for s in range(c.decoding.n_samples)]
    bar = tqdm(jobs, desc=f"{condition.name} {d.name}", unit="sample", disable=not progress)
    for problem, sample in bar:
        w0, c0 = time.perf_counter(), time.process_time()
        meter.start()
        completion = condition.complete(problem, sample)
        energy = meter.stop()
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        row = Row.scored(
            problem.id, sample, condition.name, condition.group(completion), completion, problem.answer,
            score(completion.text, problem.answer), wall_s=round(wall, 6), cpu_s=round(cpu, 6),
            energy_j=energy.joules, energy_status=energy.status,
        )  # fmt: skip
        rows.append(row)
        folder.append(row)  # nothing lost if the run is interrupted: rows so far stay on disk
        bar.set_postfix(correct=f"{sum(r.correct for r in rows)}/{len(rows)}")
    run_energy = run_meter.stop()

    summary = Summary.of(
        rows, condition=condition.name, model=fm.name, dataset=d.name, run_dir=str(folder.path),
        comparable_key=comparable_key(cfg, fm), run_wall_s=time.perf_counter() - t_run,
        energy_status=run_energy.status, energy_j=run_energy.joules, grouped=condition.uses_library,
    )  # fmt: skip
    exactness = NOT_EXACT if fm.determinism.allow_environment_mismatch else None
    if exactness:
        summary = dataclasses.replace(summary, exactness=exactness)
    desc = condition.describe()
    folder.finish(
        config=OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dataclasses.asdict(c),
        problems=[p.to_row() for p in problems],
        rows=rows,
        summary=summary,
        prompt_template=c.prompt.template,
        model_fingerprint=fm.fingerprint,
        tokenizer_fingerprint=fm.tokenizer_fingerprint,
        determinism=fm.determinism.to_dict(),
        environment=environment_fingerprint(fm.device),
        library={k: desc["library"][k] for k in ("name", "version", "manifest_sha256")} if "library" in desc else None,
        exactness=exactness,
    )
    if c.tracking.enabled:
        uri = c.tracking.uri or default_tracking_uri((root / c.runs_dir).resolve())
        _track(folder, uri, c.tracking.experiment, f"{condition.name}-{folder.name}")
    print_summary(summary, folder)
    return folder, summary


def _track(folder: RunFolder, uri: str, experiment: str, run_name: str) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_id = try_log_run_dir(folder.path, tracking_uri=uri, experiment=experiment, run_name=run_name)
    for w in caught:
        if issubclass(w.category, RuntimeWarning):
            console.print(f"[yellow]warning:[/] {w.message}")
    if run_id:
        console.print(f"MLflow: run {run_id} in {uri} (experiment {experiment})")


def print_summary(summary: Summary, folder: RunFolder) -> None:
    s, t, e = summary.scores, summary.tokens, summary.energy
    table = Table(title=f"{summary.condition} on {summary.dataset} ({summary.model})")
    for col in ("problems", "accuracy [95% CI]", "prompt tok", "prefill tok", "grafted tok", "decode tok", "wall s",
                "cpu s", "energy"):  # fmt: skip
        table.add_column(col)
    table.add_row(
        str(s["n_problems"]),
        f"{s['accuracy']:.3f} [{s['accuracy_ci_low']:.3f}, {s['accuracy_ci_high']:.3f}]",
        str(t["prompt"]),
        str(t["prefill"]),
        str(t["grafted"]),
        str(t["decode"]),
        f"{summary.time['wall_s']:.1f}",
        f"{summary.time['cpu_s']:.1f}",
        f"{e['joules']:.1f} J" if e["joules"] is not None else "unavailable",
    )
    console.print(table)
    console.print(f"energy: {e['status']}")
    if summary.exactness:
        console.print(f"[yellow]{summary.exactness}[/]")
    console.print(f"run folder: {folder.path}   (re-check: make rescore RUN={folder.path})")
