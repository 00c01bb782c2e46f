"""Tables and plots over finished run folders: the compare job's plots and the report across a Hydra sweep.

    make report RUN=runs/multirun/<stamp>          # or any folder holding run folders (runs/)
    python -m harness.compare.report RUN [--out DIR] [--tracking-uri URI] [--experiment NAME] [--no-mlflow]

:func:`sweep_table` reads every complete run folder under RUN (``RunFolder.find``) into one pandas table, one
row per run, each only after it re-checks (harness.record.audit.audited, the audit behind `make rescore`: an edited
folder stops the report, naming its first difference; no figure of it is reported): the config keys that differ
between the runs (the sweep's axes), condition and group, accuracy with its 95% interval, tokens, time and energy
(``NaN`` + status where energy was unavailable, never 0).
:func:`write_report` writes ``report.csv``, ``report.md`` and four plots (accuracy with intervals, decode
tokens per attempt, wall time per attempt, energy) into ``<RUN>/report/`` (or --out), then logs them to
MLflow as a run named ``report | <RUN>`` with the table as ``report_table.json``. A sweep whose multirun.yaml lists
jobs without a finished run is reported as partial, naming them (report.md's first line, and the terminal).
Plots use matplotlib's Agg backend (no display needed).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from harness.compare.plots import accuracy_plot, bar_plot
from harness.errors import HarnessError, RunFolderError, exit_on_error, plain
from harness.errors import console as terminal_console
from harness.record.audit import audited
from harness.record.folder import RunFolder
from harness.record.hashing import atomic_write_text
from harness.record.rows import run_group
from harness.record.sweep import MULTIRUN, sweep_plan

__all__ = ["main", "sweep_table", "write_report"]

_IGNORED_KEYS = ("runs_dir", "project_root", "tracking.")  # differ between sweeps, say nothing about a config


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix[:-1]: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) and v else {f"{prefix}{k}": v})
    return out


def sweep_table(root: Path) -> Any:
    """One row per complete run folder under `root`: the config keys that vary, then the figures."""
    import pandas as pd

    folders = list(RunFolder.find(root))
    if not folders:
        raise RunFolderError(f"{root}: no complete run folder (with manifest.json) under it; pass a multirun or "
                             "runs folder, e.g. make report RUN=runs/multirun/<stamp>")
    runs = [audited(f, "the report") for f in folders]  # re-checked, then read: one record per folder
    raw = [r.config for r in runs]
    configs = [_flat(c) for c in raw]
    keys = sorted({k for c in configs for k in c})
    varying = [k for k in keys if not k.startswith(_IGNORED_KEYS)
               and len({repr(c.get(k)) for c in configs}) > 1]
    records = []
    for folder, config, raw_config, run in zip(folders, configs, raw, runs, strict=True):
        s = run.summary
        n, joules, group = max(1, s.scores.n_rows), s.energy.joules, run_group(s, raw_config)
        records.append({
            "run": folder.path.relative_to(root).as_posix() if folder.path != root else folder.name,
            **{k: config.get(k) for k in varying},
            "condition": s.condition,
            "group": None if group is None else group.label,
            "n": s.scores.n_rows, "accuracy": s.scores.accuracy,
            "ci_low": s.scores.accuracy_ci_low, "ci_high": s.scores.accuracy_ci_high,
            "decode_tokens": s.tokens.decode, "decode_per_attempt": s.tokens.decode / n,
            "prefill_tokens": s.tokens.prefill, "grafted_tokens": s.tokens.grafted,
            "wall_s": s.time.wall_s, "wall_per_attempt_s": s.time.wall_s / n, "run_wall_s": s.time.run_wall_s,
            "energy_j": math.nan if joules is None else joules, "energy_kind": s.energy.kind,
            "energy_status": s.energy.status,
        })
    return pd.DataFrame.from_records(records)


def _markdown(df: Any) -> str:
    cols = list(df.columns)

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return "n/a" if math.isnan(v) else f"{v:.3f}".rstrip("0").rstrip(".")
        text = "-" if v is None else str(v)  # long statuses (energy) are cut here; report.csv has them whole
        return (text if len(text) <= 48 else text[:47] + "…").replace("|", "\\|")

    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def partial_note(root: Path) -> str | None:
    """For a Hydra sweep whose multirun.yaml lists jobs without a finished run: a line saying the report is partial
    and naming them (harness.record.sweep); None otherwise."""
    plan = sweep_plan(root)
    if plan is None or plan.jobs is None:
        return None
    missing = plan.missing()
    if not missing:
        return None
    return (f"partial: {len(plan.jobs) - len(missing)} of the {len(plan.jobs)} jobs {MULTIRUN} lists have a finished "
            f"run; missing {'; '.join(missing)}")


def write_report(root: Path, out: Path | None = None) -> tuple[Any, list[Path]]:
    """Write the sweep's table (report.csv, report.md) and plots into `out` (default ``<root>/report``); report.md
    opens with the `partial_note` when the sweep lacks jobs."""
    df = sweep_table(root)
    out = out or root / "report"
    out.mkdir(parents=True, exist_ok=True)
    files = [out / "report.csv", out / "report.md"]
    atomic_write_text(files[0], df.to_csv(index=False))
    note = partial_note(root)
    atomic_write_text(files[1], f"# Report: {root}\n\n" + (f"**{note}**\n\n" if note else "") + _markdown(df))
    axes = [c for c in df.columns if c not in ("run", "n") and c in df.columns[: list(df.columns).index("condition")]]
    labels = [", ".join(f"{a.split('.')[-1]}={row[a]}" for a in axes) + f" {row['condition']}" +
              (f" {row['group']}" if row["group"] else "") for _, row in df.iterrows()]
    files.append(accuracy_plot(out / "accuracy.png", labels, list(df["accuracy"]), list(df["ci_low"]),
                                list(df["ci_high"]), "accuracy per config"))
    files.append(bar_plot(out / "decode_tokens.png", labels, list(df["decode_per_attempt"]), "decode tokens / attempt",
                      "decode tokens per config"))
    files.append(bar_plot(out / "wall_time.png", labels, list(df["wall_per_attempt_s"]), "wall s / attempt",
                      "time per config"))
    energy, kinds = list(df["energy_j"]), set(df["energy_kind"]) - {"unavailable"}
    note = "" if any(not math.isnan(v) for v in energy) else str(df["energy_status"].iloc[0])
    if kinds == {"estimated"}:  # estimates only: the axis says so (a mixed sweep keeps each run's kind in the table)
        ylabel = "energy, J (estimated)"
        method = str(df["energy_status"][df["energy_kind"] == "estimated"].iloc[0]).split(":", 1)[1]
        note = note or f"estimated ({method})"
    else:
        ylabel = "energy, J" if kinds <= {"measured"} else "energy, J (measured and estimated: see energy_kind)"
    files.append(bar_plot(out / "energy.png", labels, energy, ylabel, "energy per config", note))
    return df, files


def print_table(df: Any, title: str) -> None:
    """The sweep in the terminal: one row per job with its headline figures (the whole table is report.md)."""
    from rich import box
    from rich.table import Table

    t = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True, title_justify="left",
              caption="per attempt; every column in report.md / report.csv", caption_justify="left")
    for name in ("job", "n", "accuracy [95% CI]", "decode", "wall s"):
        t.add_column(name, justify="left" if name == "job" else "right", overflow="fold")
    for r in df.to_dict("records"):
        job = str(r["run"]) + (f" ({r['group']})" if r.get("group") else "")
        t.add_row(job, str(r["n"]), f"{r['accuracy']:.2f} [{r['ci_low']:.2f}, {r['ci_high']:.2f}]",
                  f"{r['decode_per_attempt']:.1f}", f"{r['wall_per_attempt_s']:.2f}")
    terminal_console().print(t)


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    """`make report RUN=...`: write the report, log it to MLflow (unless --no-mlflow); print the table."""
    from harness.compare.mlflow_runs import log_report
    from harness.config.schema import DEFAULT_EXPERIMENT
    from harness.tracking.store import default_tracking_uri

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", type=Path, help="a multirun folder (runs/multirun/<stamp>) or any folder of run folders")
    p.add_argument("--out", type=Path, help="where to write (default: RUN/report)")
    p.add_argument("--tracking-uri", help="MLflow URI (default: sqlite store in <repo>/runs)")
    p.add_argument("--experiment", default=DEFAULT_EXPERIMENT)
    p.add_argument("--no-mlflow", action="store_true", help="write the files only")
    args = p.parse_args(argv)
    if not args.run.is_dir():
        raise HarnessError(f"{args.run}: not a folder; pass a multirun or runs folder (make report RUN=<dir>)")
    df, files = write_report(args.run, args.out)
    note = partial_note(args.run)
    print_table(df, f"report over {len(df)} jobs: {args.run}" + (" (PARTIAL)" if note else ""))
    if note:
        print(plain(note))
    print("written:", *[plain(str(f)) for f in files], sep="\n  ")
    if not args.no_mlflow:
        uri = args.tracking_uri or default_tracking_uri(Path(__file__).resolve().parents[2] / "runs")
        run_id = log_report(args.run, df, files, tracking_uri=uri, experiment=args.experiment)
        print(f"MLflow: report logged as run {run_id} in {uri}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
