"""The compare job's one-page summary, ``summary.html``: headline figures per run, graft vs twin, the misses, the
per-problem table and the plots (embedded as data URIs, so the page is one self-contained file that MLflow's
artifact view renders). Written beside comparison.json and logged as the parent run's artifact; the run's
description links to it.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.compare.comparison import Comparison, VsBaseline
from harness.compare.views import load_warning
from harness.record.hashing import atomic_write_text

__all__ = ["SUMMARY_PAGE", "headline_rows", "write_summary_page"]

SUMMARY_PAGE = "summary.html"


def headline_rows(comparison: Comparison) -> list[dict[str, str]]:
    """One row per run: accuracy [95% CI], maj@k, overlong rows, decode tokens per problem, TTFT s per row, baseline /
    run factors."""
    out = []
    for label, s in comparison.summaries.items():
        sc, n, c = s.scores, max(s.scores.n_rows, 1), s.comparison

        def fx(value: float | None, c: VsBaseline | None = c) -> str:
            return "1" if c is None else ("n/a" if value is None else f"{value:.2f}")

        out.append({"run": label, "problems": str(sc.n_problems),
                    "accuracy [95% CI]": f"{sc.accuracy:.3f} [{sc.accuracy_ci_low:.3f}, {sc.accuracy_ci_high:.3f}]",
                    "maj@k": "n/a" if sc.maj() is None else f"{sc.maj()[1]:.3f} (k={sc.maj()[0]})",
                    "overlong": "n/a" if sc.overlong is None else f"{sc.overlong}/{sc.n_rows}",
                    "decode tokens / problem": f"{s.tokens.decode / n:.1f}",
                    "TTFT s / row": f"{(s.time.ttft_s or 0.0) / n:.3f}",
                    "baseline/run decode tokens": fx(c and c.token_reduction),
                    "baseline/run TTFT": fx(c and c.ttft_factor), "baseline/run wall": fx(c and c.wall_factor)})
    return out


def _table(rows: Sequence[Mapping[str, Any]]) -> str:
    if not rows:
        return "<p>(none)</p>"
    cols: list[str] = []
    for r in rows:
        cols += [k for k in r if k not in cols]
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{html.escape('' if r.get(c) is None else str(r.get(c)))}</td>"
                                    for c in cols) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def write_summary_page(out: Path, title: str, comparison: Comparison, per_problem: Sequence[Mapping[str, Any]],
                       misses: Sequence[str], plots: Sequence[Path]) -> Path:
    """Write the page (module docstring) to `out` and return it."""
    pairs, plan = comparison.pairs or {}, comparison.plan
    twin = [{"graft run": plan.pairs[g][0], "identical rows": f"{p.pairing.identical}/{p.rows}",
             **{f"incontext/graft {k.split('_')[0]}": ("n/a" if v is None else f"{v:.2f}")
                for k, v in (p.graft_vs_incontext.to_json() if p.graft_vs_incontext else {}).items()}}
            for g, p in pairs.items()]
    images = "".join(
        f'<figure><img alt="{html.escape(p.stem)}" src="data:image/png;base64,'
        f'{base64.b64encode(p.read_bytes()).decode()}"><figcaption>{html.escape(p.name)}</figcaption></figure>'
        for p in plots if p.exists()
    )
    warning = load_warning(comparison)
    lib = comparison.library
    lib_line = (f"<p>Library {html.escape(str(lib.name))} v{lib.version}: {lib.entries} entries, {lib.tokens} tokens, "
                f"{(lib.bytes or 0) / 1e6:.1f} MB; {'built' if lib.built else 'opened'} in {lib.seconds} s by this "
                "job.</p>" if lib is not None else "")
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:1.5em;max-width:70em}}table{{border-collapse:collapse;margin:.5em 0 1.2em}}
td,th{{border:1px solid #ccc;padding:.2em .5em;text-align:right}}th{{background:#f3f3f3}}
td:first-child,th:first-child{{text-align:left}}img{{max-width:32em}}figure{{display:inline-block;margin:.3em}}
.warn{{color:#a60}}</style></head><body>
<h1>{html.escape(title)}</h1>
<p>Factors are <b>baseline / run</b> (above 1: the run is faster or needs fewer tokens); graft vs twin factors are
<b>incontext / graft</b>.</p>
{f'<p class="warn">{html.escape(warning)}</p>' if warning else ''}
<h2>Runs</h2>{_table(headline_rows(comparison))}
<h2>Graft vs its in-context twin</h2>{_table(twin)}
{lib_line}
<h2>Misses ({len(misses)})</h2>{"".join(f"<div><code>{html.escape(m)}</code></div>" for m in misses) or "<p>none</p>"}
<h2>Per problem</h2>{_table(per_problem)}
<h2>Plots</h2>{images}
</body></html>
"""
    atomic_write_text(out, page)
    return out
