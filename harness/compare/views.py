"""How a comparison (comparison.json, harness/compare/comparison.py) reads in a terminal: the compare job prints it
when it
finishes and ``scripts/show_comparison.py runs/compare/<stamp>`` re-prints it from the folder (no model, no torch).

Below 150 columns (an 80-column terminal included) the figures are three narrow tables, one row per run: scores
and tokens, time (factors = baseline / run), graft vs its in-context twin (factors = incontext / graft); at 150 or
more, one side-by-side table. Each factor's direction is stated once, in the table's caption. Then the pairing
lines, the misses (harness/compare/per_problem.py), warnings (baseline cut at its token budget, a loaded machine) and
the
energy status.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from harness.compare.comparison import Comparison, Factors, PairResult, RunFigures
from harness.errors import console as terminal_console

__all__ = ["WIDE_COLUMNS", "load_warning", "print_comparison", "printable"]

WIDE_COLUMNS = 150  # the side-by-side table needs about this many columns
_MAX_MISSES = 20
_NARROW: dict[str, Any] = {"box": box.SIMPLE_HEAD, "show_edge": False, "pad_edge": False, "collapse_padding": True,
                           "title_justify": "left"}


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "n/a" if x is None else format(x, spec)


def _per_row(s: RunFigures, total: float | None) -> float:
    return (total or 0.0) / max(s.scores.n_rows, 1)


def _stops(s: RunFigures) -> str:
    r = s.stop_reasons or {}
    return "/".join(str(r.get(k, 0)) for k in ("eos", "stop", "length")) if r else "n/a"


def _energy(s: RunFigures) -> str:
    return s.energy.text()  # "12.3 J", "12.3 J est." or "unavailable"; the status in words is printed below


def _acc(s: RunFigures) -> str:
    sc = s.scores
    return f"{sc.accuracy:.2f} [{sc.accuracy_ci_low:.2f}, {sc.accuracy_ci_high:.2f}]"


def _maj(s: RunFigures) -> str:
    """maj@k (majority vote over the k samples of each problem) as "0.50@4"; "n/a" for a summary written before it."""
    maj = s.scores.maj()
    return "n/a" if maj is None else f"{maj[1]:.2f}@{maj[0]}"


def _overlong(s: RunFigures) -> str:
    """Rows cut by the budget inside a reasoning trace: "3 (12%)"; "n/a" for a summary written before it."""
    sc = s.scores
    return "n/a" if sc.overlong is None else f"{sc.overlong} ({sc.overlong_rate or 0.0:.0%})"


_TWIN_FACTORS = (("prefill_factor", "prefill"), ("ttft_factor", "TTFT"), ("wall_factor", "wall"), ("cpu_factor", "CPU"))


def _twin_factors(p: PairResult) -> list[float | None]:
    f = p.graft_vs_incontext or Factors()
    return [getattr(f, k) for k, _ in _TWIN_FACTORS]


def _narrow(console: Console, title: str, result: Comparison) -> None:
    runs = result.summaries
    same = result.identical()
    n = next(iter(runs.values())).scores.n_problems
    t = Table(title=f"scores and tokens, {n} problems: {title}", **_NARROW,
              caption="decode, prefill, graft: tokens per row; stops: rows ending at eos/stop/length; twin: "
                      "rows identical to the incontext run of the same group", caption_justify="left")
    for name, justify in (("run", "left"), ("accuracy [95% CI]", "right"), ("decode", "right"),
                          ("prefill", "right"), ("graft", "right"), ("stops", "right"), ("twin", "right")):
        t.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for label, s in runs.items():
        tk = s.tokens
        t.add_row(label, _acc(s), f"{_per_row(s, tk.decode):.1f}", f"{_per_row(s, tk.prefill):.0f}",
                  f"{_per_row(s, tk.grafted):.0f}", _stops(s), same.get(label, ""))
    console.print(t)
    t = Table(title=f"votes and traces: {title}", **_NARROW,
              caption="maj@k: majority vote over each problem's k samples (ties: the earliest sampled); overlong: "
                      "rows whose budget ran out inside a reasoning trace (no answer)", caption_justify="left")
    for name in ("run", "maj@k", "overlong"):
        t.add_column(name, justify="left" if name == "run" else "right", no_wrap=True)
    for label, s in runs.items():
        t.add_row(label, _maj(s), _overlong(s))
    console.print(t)
    t = Table(title=f"time per row: {title}", **_NARROW,
              caption="x: baseline / this run (above 1: this run is faster or needs fewer tokens)",
              caption_justify="left")
    energy = any(s.energy.joules is not None for s in runs.values())  # else one status line below
    for name in ("run", "TTFT s", "x", "wall s", "x", "cpu s", "x", "tokens x", *(("energy",) if energy else ())):
        t.add_column(name, justify="left" if name == "run" else "right", no_wrap=True)
    for label, s in runs.items():
        c, tm = s.comparison, s.time
        fx = (lambda v, c=c: _fmt(v) if c else "1")  # noqa: E731 - one formatter per row
        t.add_row(label, f"{_per_row(s, tm.ttft_s):.3f}", fx(c and c.ttft_factor), f"{_per_row(s, tm.wall_s):.2f}",
                  fx(c and c.wall_factor), f"{_per_row(s, tm.cpu_s):.2f}", fx(c and c.cpu_factor),
                  fx(c and c.token_reduction), *((_energy(s),) if energy else ()))
    console.print(t)
    if result.pairs:
        t = Table(title=f"graft vs its in-context twin: {title}", **_NARROW,
                  caption="x: incontext / graft (above 1: the graft is cheaper for the same rows)",
                  caption_justify="left")
        for name in ("group", "identical", "prefill x", "TTFT x", "wall x", "cpu x"):
            t.add_column(name, justify="left" if name == "group" else "right", no_wrap=True)
        for group, p in result.pairs.items():
            first = result.plan.pairs[group][0]
            t.add_row(first.split("(")[1].rstrip(")"), same[first], *(_fmt(v) for v in _twin_factors(p)))
        console.print(t)


def _wide(console: Console, title: str, result: Comparison) -> None:
    rows = result.summaries
    table = Table(title=title, caption="(x): baseline / this run, above 1: this run is faster or needs fewer")
    table.add_column("")
    for label in rows:
        table.add_column(label, justify="right")

    def row(name: str, fn: Any) -> None:
        table.add_row(name, *[fn(s, s.comparison) for s in rows.values()])

    def factor(key: str) -> Any:
        return lambda c: f" ({_fmt(getattr(c, key))}x)" if c else ""

    row("problems", lambda s, c: str(s.scores.n_problems))
    row("accuracy [95% CI]", lambda s, c: _acc(s))
    row("maj@k (majority vote)", lambda s, c: _maj(s))
    row("overlong (cut in trace)", lambda s, c: _overlong(s))
    row("decode tokens / problem", lambda s, c: f"{_per_row(s, s.tokens.decode):.1f}")
    row("grafted tokens (total)", lambda s, c: str(s.tokens.grafted))
    row("prefill tokens (total)", lambda s, c: str(s.tokens.prefill) + factor("prefill_factor")(c))
    row("TTFT s / row (x)", lambda s, c: f"{_per_row(s, s.time.ttft_s):.3f}" + factor("ttft_factor")(c))
    row("stops eos/stop/length", lambda s, c: _stops(s))
    row("token reduction (x)", lambda s, c: _fmt(c.token_reduction) if c else "1")
    row("wall time s (x)", lambda s, c: f"{s.time.wall_s:.1f}" + factor("wall_factor")(c))
    row("cpu time s (x)", lambda s, c: f"{s.time.cpu_s:.1f}" + factor("cpu_factor")(c))
    row("energy", lambda s, c: _energy(s) + (f" ({_fmt(c.energy_factor)}x)" if c and c.energy_factor else ""))
    same = result.identical()
    if same:
        table.add_row("rows identical to incontext", *[same.get(k, "") for k in rows])
    console.print(table)
    for group, p in (result.pairs or {}).items():
        first, twin = result.plan.pairs[group]
        console.print(f"{first} vs {twin}, the same rows (incontext / graft): " + ", ".join(
            f"{_fmt(v)}x {what}" for v, (_, what) in zip(_twin_factors(p), _TWIN_FACTORS, strict=True)))


def load_warning(result: Comparison) -> str | None:
    """A warning when the 1-minute load average exceeded the core count while a run of the job ran."""
    highest = result.load.highest if result.load else None
    cores = (result.load.cores if result.load else None) or 0
    if not cores or highest is None:
        return None
    top, label = highest
    if top <= cores:
        return None
    return (f"the machine was loaded: 1-minute load average up to {top:.1f} on {cores} cores (during {label}); "
            "time factors compare runs under different load: re-run on a quiet machine before quoting them")


def printable(text: str) -> str:
    """`text` as a terminal shows it safely: control characters (an ANSI escape in a problem id or a file name)
    written as escapes (`\\x1b`), never obeyed; Rich markup in it shown, not interpreted."""
    from rich.markup import escape

    return escape("".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in str(text)))


def print_comparison(title: str, result: Comparison, *, misses: Sequence[str] = (), console: Console | None = None,
                     reprint: str | None = None) -> None:
    """Print the comparison (module docstring) to `console` (default: a terminal-width console); text that comes
    from the data (the title, the misses' problem ids) passes through `printable`."""
    console = console or terminal_console()
    title = printable(title)
    plan = result.plan
    result = dataclasses.replace(result, summaries=result.ordered())  # the plan's order (the file sorts its keys)
    (_wide if console.width >= WIDE_COLUMNS else _narrow)(console, title, result)
    for group, p in (result.pairs or {}).items():
        style = "green" if p.pairing.ok else "bold red"
        first, twin = plan.pairs.get(group, (group, "its twin"))
        grafted = "" if p.pairing.grafted is None else (
            f"; {p.pairing.grafted} grafted" if p.pairing.grafted else "; NOTHING grafted: the pair proves nothing")
        console.print(f"[{style}]{first}: {p.pairing.identical}/{p.rows} rows identical to {twin} "
                      f"(token ids and first-logits SHA-256{grafted})[/]")
    if misses:
        console.print(f"[bold]misses[/] ({len(misses)}: graft wrong or not identical to its twin):")
        for line in misses[:_MAX_MISSES]:
            console.print(f"  {printable(line)}", highlight=False)
        if len(misses) > _MAX_MISSES:
            console.print(f"  ... and {len(misses) - _MAX_MISSES} more (per_problem.json)")
    base = result.summaries[plan.baseline]
    hit = (base.stop_reasons or {}).get("length")
    if hit:
        console.print(f"[yellow]the baseline hit its token budget on {hit} of {base.scores.n_rows} rows: "
                      "token reduction is measured against truncated answers[/]")
    warning = load_warning(result)
    if warning:
        console.print(f"[bold yellow]{warning}[/]")
    if not base.energy.measured:  # unavailable, or an estimate: say which, with its method
        console.print(f"energy: {base.energy.label}", highlight=False)
    if reprint:
        console.print(f"re-print: {reprint}", highlight=False)
