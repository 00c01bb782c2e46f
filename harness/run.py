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
from datetime import UTC, datetime
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.table import Table
from tqdm import tqdm

from harness.answers import score
from harness.conditions import build_condition
from harness.config import Config, load_model, typed
from harness.distributed import completer
from harness.energy import make_meter
from harness.hashing import sha256_json
from harness.problems import load_problems
from harness.record import STOP_REASONS, Row, Summary
from harness.run_folder import RunFolder
from harness.tracking import default_tracking_uri, try_log_run_dir
from kvstore import FrozenModel, environment_fingerprint

__all__ = ["comparable_key", "load_model", "print_summary", "run", "run_rows"]

console = Console(width=None if sys.stdout.isatty() else 140)  # logs and pipes get full tables
NOT_EXACT = ("not guaranteed exact: determinism.allow_environment_mismatch=true lets grafts of artifacts deposited "
             "in another compute environment through")


def comparable_key(cfg: DictConfig | Config, fm: FrozenModel) -> str:
    """Runs with the same key differ only in condition/library: same model, data, prompt, decoding (batch size
    included: a batch need not give the bits of single rows), settings. batch_size 1 is left out of the key, so
    runs from before it existed keep theirs."""
    c = dataclasses.asdict(typed(cfg))
    if c["decoding"].get("batch_size") == 1:
        del c["decoding"]["batch_size"]
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
    folder, summary, _ = run_rows(cfg, folder, fm, progress, build_library_if_missing)
    return folder, summary


def run_rows(
    cfg: DictConfig,
    folder: RunFolder | str | Path | None = None,
    fm: FrozenModel | None = None,
    progress: bool = True,
    build_library_if_missing: bool = False,
) -> tuple[RunFolder, Summary, list[Row]]:
    """`run`, also returning the rows in memory (the compare job pairs graft and incontext rows from them)."""
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
    t_run, started_at = time.perf_counter(), datetime.now(UTC).isoformat()
    run_meter.start()
    n, bs = c.decoding.n_samples, c.decoding.batch_size
    jobs = [(p, list(range(s, min(s + bs, n)))) for p in problems for s in range(0, n, bs)]
    # scale-out hook: execution=ray computes the same jobs on Ray actors, handed back in this order
    complete = completer(c, condition, fm, problems, jobs, build_library_if_missing)
    bar = tqdm(total=len(problems) * n, desc=f"{condition.name} {d.name}", unit="sample", disable=not progress)
    tokens = tqdm(total=len(problems) * n * c.decoding.max_new_tokens, desc="tokens (at most)", unit="tok",
                  disable=not progress, leave=False)  # fmt: skip
    for i, (problem, samples) in enumerate(jobs):
        if i + 1 < len(jobs) and jobs[i + 1][0] is not problem:
            condition.upcoming(jobs[i + 1][0])  # its artifact is read while this problem decodes
        w0, c0 = time.perf_counter(), time.process_time()
        meter.start()
        completions = complete(problem, samples, on_token=tokens.update)
        energy = meter.stop()
        # a batch's cost is shared evenly by its rows (their sums are the batch's cost)
        k = len(completions)
        wall, cpu = (time.perf_counter() - w0) / k, (time.process_time() - c0) / k
        joules = energy.joules / k if energy.joules is not None else None
        for sample, completion in zip(samples, completions, strict=True):
            row = Row.scored(
                problem.id, sample, condition.name, condition.group(completion), completion, problem.answer,
                score(completion.text, problem.answer), wall_s=round(wall, 6), cpu_s=round(cpu, 6),
                energy_j=joules, energy_status=energy.status,
            )  # fmt: skip
            rows.append(row)
            folder.append(row)  # nothing lost if the run is interrupted: rows so far stay on disk
        bar.update(k)
        bar.set_postfix(correct=f"{sum(r.correct for r in rows)}/{len(rows)}")
    tokens.close()
    bar.close()
    condition.close()
    run_energy = run_meter.stop()

    summary = Summary.of(
        rows, condition=condition.name, model=fm.name, dataset=d.name, run_dir=str(folder.path),
        comparable_key=comparable_key(cfg, fm), run_wall_s=time.perf_counter() - t_run,
        energy_status=run_energy.status, energy_j=run_energy.joules, grouped=condition.uses_library,
        started_at=started_at, finished_at=datetime.now(UTC).isoformat(),
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
        _track(folder, uri, c.tracking.experiment, None)  # tracking names it: condition, group, data, model
    print_summary(summary, folder)
    return folder, summary, rows


def _track(folder: RunFolder, uri: str, experiment: str, run_name: str | None) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_id = try_log_run_dir(folder.path, tracking_uri=uri, experiment=experiment, run_name=run_name)
    for w in caught:
        if issubclass(w.category, RuntimeWarning):
            console.print(f"[yellow]warning:[/] {w.message}")
    if run_id:
        console.print(f"MLflow: run {run_id} in {uri} (experiment {experiment})")


def stops_text(stop_reasons: dict[str, int] | None) -> str:
    """"eos/stop/length" counts, e.g. "0/5/1"; "n/a" for a summary written before stop reasons were counted."""
    if not stop_reasons:
        return "n/a"
    return "/".join(str(stop_reasons.get(k, 0)) for k in STOP_REASONS)


def print_summary(summary: Summary, folder: RunFolder) -> None:
    s, t, e = summary.scores, summary.tokens, summary.energy
    table = Table(title=f"{summary.condition} on {summary.dataset} ({summary.model})")
    for col in ("problems", "accuracy [95% CI]", "prompt tok", "prefill tok", "grafted tok", "decode tok",
                "TTFT s (mean)", "stops eos/stop/length", "wall s", "cpu s", "energy"):  # fmt: skip
        table.add_column(col)
    table.add_row(
        str(s["n_problems"]),
        f"{s['accuracy']:.3f} [{s['accuracy_ci_low']:.3f}, {s['accuracy_ci_high']:.3f}]",
        str(t["prompt"]),
        str(t["prefill"]),
        str(t["grafted"]),
        str(t["decode"]),
        f"{summary.time.get('ttft_s', 0.0) / max(s['n_rows'], 1):.3f}",
        stops_text(summary.stop_reasons),
        f"{summary.time['wall_s']:.1f}",
        f"{summary.time['cpu_s']:.1f}",
        f"{e['joules']:.1f} J" if e["joules"] is not None else "unavailable",
    )
    console.print(table)
    hit = (summary.stop_reasons or {}).get("length", 0)
    if hit:
        console.print(f"[yellow]{hit} of {s['n_rows']} rows hit the token budget (decoding.max_new_tokens): their "
                      "answers were cut off[/]")  # fmt: skip
    console.print(f"energy: {e['status']}")
    if summary.exactness:
        console.print(f"[yellow]{summary.exactness}[/]")
    console.print(f"run folder: {folder.path}   (re-check: make rescore RUN={folder.path})")
