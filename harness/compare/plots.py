"""The plots of a comparison and of a sweep report (matplotlib, Agg backend: no display needed).

:func:`comparison_plots` draws the compare job's plots (accuracy with 95% intervals per condition, decode
tokens per problem, TTFT distribution); ``harness.tracking.log.log_comparison`` logs them. :func:`bar_plot` is one
bar chart of the sweep report (harness/compare/report.py).
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.compare.comparison import Comparison
from harness.record.hashing import atomic_write_bytes
from harness.record.rows import Row

__all__ = ["bar_plot", "comparison_plots"]


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt: Any, fig: Any, path: Path) -> Path:
    """Lay the figure out, write it as PNG through the one atomic write, and free it."""
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return path


def accuracy_plot(path: Path, labels: Sequence[str], acc: Sequence[float], low: Sequence[float],
                   high: Sequence[float], title: str) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6, 2.2 * len(labels)), 4.5))
    yerr = [[a - lo for a, lo in zip(acc, low, strict=True)], [hi - a for a, hi in zip(acc, high, strict=True)]]
    ax.errorbar(range(len(labels)), acc, yerr=yerr, fmt="o", capsize=6)
    ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right")
    ax.set_ylim(-0.02, 1.02)
    ax.set_ylabel("accuracy (95% interval)")
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    return _save(plt, fig, path)


def comparison_plots(rows: Mapping[str, Sequence[Row]], comparison: Comparison, out_dir: Path) -> list[Path]:
    """The compare job's plots, written into `out_dir`: ``accuracy.png`` (accuracy with 95% intervals per
    condition, from comparison.json), ``decode_tokens.png`` (decode tokens per problem and sample, one bar per
    condition) and ``ttft.png`` (time to first token per condition; a note when no row recorded it)."""
    plt = _pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    labels = list(comparison.summaries)
    scores = [comparison.summaries[k].scores for k in labels]
    paths = [accuracy_plot(out_dir / "accuracy.png", labels, [s.accuracy for s in scores],
                           [s.accuracy_ci_low for s in scores], [s.accuracy_ci_high for s in scores],
                           "accuracy per condition")]

    keys = sorted({(r.problem_id, r.sample) for rs in rows.values() for r in rs})
    fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(keys) * max(1, len(rows))), 4))
    width = 0.8 / max(1, len(rows))
    for i, (label, rs) in enumerate(rows.items()):
        by_key = {(r.problem_id, r.sample): r.completion.decode_tokens for r in rs}
        ax.bar([j + i * width for j in range(len(keys))], [by_key.get(k, 0) for k in keys], width, label=label)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(keys))],
                  [p if s == 0 else f"{p}#{s}" for p, s in keys], rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("decode tokens")
    ax.set_title("decode tokens per problem")
    if rows:
        ax.legend()
    paths.append(_save(plt, fig, out_dir / "decode_tokens.png"))

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
    paths.append(_save(plt, fig, out_dir / "ttft.png"))
    return paths


def bar_plot(path: Path, labels: list[str], values: list[float], ylabel: str, title: str, note: str = "") -> Path:
    """One bar per label, each annotated with its value (a zero bar still says 0). With no finite value at all
    (energy on a machine without a meter, say) the plot says "unavailable" in words, with `note` as the reason,
    instead of drawing an empty axis."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6, 2.2 * len(labels)), 4.5))
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        ax.set_axis_off()
        ax.text(0.5, 0.55, f"{ylabel}: unavailable", ha="center", va="center", fontsize=14, transform=ax.transAxes)
        if note:
            ax.text(0.5, 0.4, note, ha="center", va="center", fontsize=9, transform=ax.transAxes, wrap=True)
        ax.set_title(title)
    else:
        shown = [0.0 if math.isnan(v) else v for v in values]
        bars = ax.bar(range(len(labels)), shown)
        ax.bar_label(bars, labels=["n/a" if math.isnan(v) else f"{v:.3g}" for v in values], padding=2)
        ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{title}\n{note}" if note else title, fontsize=10)
    return _save(plt, fig, path)
