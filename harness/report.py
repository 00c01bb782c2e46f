"""Tables and plots over finished run folders: the compare job's plots and the report across a Hydra sweep.

    make report RUN=runs/multirun/<stamp>          # or any folder holding run folders (runs/)
    python -m harness.report RUN [--out DIR] [--tracking-uri URI] [--experiment NAME] [--no-mlflow]

:func:`sweep_table` reads every complete run folder under RUN (``RunFolder.find``) into one pandas table, one
row per run: the config keys that differ between the runs (the sweep's axes), condition and group, accuracy
with its 95% interval, tokens, time and energy (``NaN`` + status where energy was unavailable, never 0).
:func:`write_report` writes ``report.csv``, ``report.md`` and four plots (accuracy with intervals, decode
tokens per attempt, wall time per attempt, energy) into ``<RUN>/report/`` (or --out), then logs them to
MLflow as a run named ``report | <RUN>`` with the table as ``report_table.json``.
:func:`comparison_plots` draws the compare job's plots (accuracy with 95% intervals per condition, decode
tokens per problem, TTFT distribution); ``harness.tracking.log_comparison`` logs them.
Plots use matplotlib's Agg backend (no display needed).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.errors import HarnessError, RunFolderError, exit_on_error
from harness.record import Row
from harness.run_folder import RunFolder

__all__ = ["comparison_plots", "main", "sweep_table", "write_report"]

_IGNORED_KEYS = ("runs_dir", "project_root", "tracking.")  # differ between sweeps, say nothing about a config


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _accuracy_plot(path: Path, labels: Sequence[str], acc: Sequence[float], low: Sequence[float],
                   high: Sequence[float], title: str) -> Path:  # fmt: skip
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6, 2.2 * len(labels)), 4.5))
    yerr = [[a - lo for a, lo in zip(acc, low, strict=True)], [hi - a for a, hi in zip(acc, high, strict=True)]]
    ax.errorbar(range(len(labels)), acc, yerr=yerr, fmt="o", capsize=6)
    ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right")
    ax.set_ylim(-0.02, 1.02)
    ax.set_ylabel("accuracy (95% interval)")
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def comparison_plots(rows: Mapping[str, Sequence[Row]], comparison: dict[str, Any], out_dir: Path) -> list[Path]:
    """The compare job's plots, written into `out_dir`: ``accuracy.png`` (accuracy with 95% intervals per
    condition, from comparison.json), ``decode_tokens.png`` (decode tokens per problem and sample, one bar per
    condition) and ``ttft.png`` (time to first token per condition; a note when no row recorded it)."""
    plt = _pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    summaries = comparison.get("summaries") or {}
    labels = list(summaries)
    scores = [summaries[k].get("scores") or {} for k in labels]
    acc = [float(s.get("accuracy", math.nan)) for s in scores]
    paths = [_accuracy_plot(out_dir / "accuracy.png", labels, acc,
                            [float(s.get("accuracy_ci_low", a)) for s, a in zip(scores, acc, strict=True)],
                            [float(s.get("accuracy_ci_high", a)) for s, a in zip(scores, acc, strict=True)],
                            "accuracy per condition")]  # fmt: skip

    keys = sorted({(r.problem_id, r.sample) for rs in rows.values() for r in rs})
    fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(keys) * max(1, len(rows))), 4))
    width = 0.8 / max(1, len(rows))
    for i, (label, rs) in enumerate(rows.items()):
        by_key = {(r.problem_id, r.sample): r.completion.decode_tokens for r in rs}
        ax.bar([j + i * width for j in range(len(keys))], [by_key.get(k, 0) for k in keys], width, label=label)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(keys))],
                  [p if s == 0 else f"{p}#{s}" for p, s in keys], rotation=45, ha="right", fontsize=8)  # fmt: skip
    ax.set_ylabel("decode tokens")
    ax.set_title("decode tokens per problem")
    if rows:
        ax.legend()
    fig.tight_layout()
    fig.savefig(out_dir / "decode_tokens.png", dpi=100)
    plt.close(fig)
    paths.append(out_dir / "decode_tokens.png")

    fig, ax = plt.subplots(figsize=(6, 4))
    ttfts = {label: [r.completion.ttft_s for r in rs if r.completion.ttft_s is not None] for label, rs in rows.items()}
    shown = {k: v for k, v in ttfts.items() if v}
    if shown:
        ax.boxplot(list(shown.values()), showfliers=True)
        for i, values in enumerate(shown.values(), start=1):
            ax.scatter([i] * len(values), values, s=12, alpha=0.6)
        ax.set_xticks(range(1, len(shown) + 1), list(shown), rotation=20, ha="right")
        ax.set_yscale("log")
        ax.set_ylabel("time to first token, s (log)")
    else:
        ax.text(0.5, 0.5, "no row recorded ttft_s", ha="center", va="center")
    ax.set_title("time to first token")
    fig.tight_layout()
    fig.savefig(out_dir / "ttft.png", dpi=100)
    plt.close(fig)
    paths.append(out_dir / "ttft.png")
    return paths


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
                             "runs folder, e.g. make report RUN=runs/multirun/<stamp>")  # fmt: skip
    configs = [_flat(f.read_config()) for f in folders]
    keys = sorted({k for c in configs for k in c})
    varying = [k for k in keys if not k.startswith(_IGNORED_KEYS)
               and len({repr(c.get(k)) for c in configs}) > 1]  # fmt: skip
    records = []
    for folder, config in zip(folders, configs, strict=True):
        s = folder.read_summary()
        n = max(1, int(s.scores.get("n_rows") or 0))
        joules = s.energy.get("joules")
        library = config.get("library.exclude_self") if s.groups is not None else None
        records.append({
            "run": folder.path.relative_to(root).as_posix() if folder.path != root else folder.name,
            **{k: config.get(k) for k in varying},
            "condition": s.condition,
            "group": None if library is None else ("held-out" if library else "recurring"),
            "n": s.scores.get("n_rows"), "accuracy": s.scores.get("accuracy"),
            "ci_low": s.scores.get("accuracy_ci_low"), "ci_high": s.scores.get("accuracy_ci_high"),
            "decode_tokens": s.tokens.get("decode"), "decode_per_attempt": (s.tokens.get("decode") or 0) / n,
            "prefill_tokens": s.tokens.get("prefill"), "grafted_tokens": s.tokens.get("grafted"),
            "wall_s": s.time.get("wall_s"), "wall_per_attempt_s": (s.time.get("wall_s") or 0.0) / n,
            "run_wall_s": s.time.get("run_wall_s"),
            "energy_j": math.nan if joules is None else joules, "energy_status": s.energy.get("status"),
        })  # fmt: skip
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


def _bar(path: Path, labels: list[str], values: list[float], ylabel: str, title: str, note: str = "") -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6, 2.2 * len(labels)), 4.5))
    shown = [0.0 if math.isnan(v) else v for v in values]
    ax.bar(range(len(labels)), shown)
    ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if note:
        ax.text(0.5, 0.5, note, ha="center", va="center", transform=ax.transAxes, wrap=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_report(root: Path, out: Path | None = None) -> tuple[Any, list[Path]]:
    """Write the sweep's table (report.csv, report.md) and plots into `out` (default ``<root>/report``)."""
    df = sweep_table(root)
    out = out or root / "report"
    out.mkdir(parents=True, exist_ok=True)
    files = [out / "report.csv", out / "report.md"]
    df.to_csv(files[0], index=False)
    files[1].write_text(f"# Report: {root}\n\n" + _markdown(df), encoding="utf-8")
    axes = [c for c in df.columns if c not in ("run", "n") and c in df.columns[: list(df.columns).index("condition")]]
    labels = [", ".join(f"{a.split('.')[-1]}={row[a]}" for a in axes) + f" {row['condition']}" +
              (f" {row['group']}" if row["group"] else "") for _, row in df.iterrows()]  # fmt: skip
    files.append(_accuracy_plot(out / "accuracy.png", labels, list(df["accuracy"]), list(df["ci_low"]),
                                list(df["ci_high"]), "accuracy per config"))  # fmt: skip
    files.append(_bar(out / "decode_tokens.png", labels, list(df["decode_per_attempt"]), "decode tokens / attempt",
                      "decode tokens per config"))  # fmt: skip
    files.append(_bar(out / "wall_time.png", labels, list(df["wall_per_attempt_s"]), "wall s / attempt",
                      "time per config"))  # fmt: skip
    energy = list(df["energy_j"])
    note = "" if any(not math.isnan(v) for v in energy) else f"energy unavailable: {df['energy_status'].iloc[0]}"
    files.append(_bar(out / "energy.png", labels, energy, "energy, J", "energy per config", note))
    return df, files


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    """`make report RUN=...`: write the report, log it to MLflow (unless --no-mlflow); print the table."""
    from harness.tracking import DEFAULT_EXPERIMENT, default_tracking_uri, log_report

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
    print(_markdown(df))
    print("written:", *[str(f) for f in files], sep="\n  ")
    if not args.no_mlflow:
        uri = args.tracking_uri or default_tracking_uri(Path(__file__).resolve().parents[1] / "runs")
        run_id = log_report(args.run, df, files, tracking_uri=uri, experiment=args.experiment)
        print(f"MLflow: report logged as run {run_id} in {uri}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
