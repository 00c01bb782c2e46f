"""The compare job's terminal output and per-problem view: readable at 80 columns (no cut values), factor
directions stated, misses naming what the graft read, a loaded machine warned about, and the re-print script."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from rich.console import Console

from harness.compare import per_problem
from harness.compare.comparison import Comparison, JobLoad, RunLoad, comparison
from harness.compare.pairing import pair
from harness.compare.plan import PAIRS
from harness.compare.views import print_comparison
from harness.record.folder import RunFolder
from harness.record.rows import Group, Retrieval, Row, Summary

LABELS = ["baseline", *PAIRS["recurring"], *PAIRS["held_out"]]


def _rows(fakerun: ModuleType, label: str) -> list[Row]:
    rows = fakerun.make_rows(label.split(" ")[0])
    if not label.startswith("graft"):
        return rows
    # the graft read entry e-<problem>: its own problem when recurring, toy-2's entry for every held-out row
    held_out = "held-out" in label
    group, entry = (Group.HELD_OUT, "e-toy-2") if held_out else (Group.RECURRING, None)
    return [dataclasses.replace(r, group=group.value, completion=dataclasses.replace(
        r.completion, retrieval=Retrieval(entry or f"e-{r.problem_id}", "f" * 64, 1.0, "bm25" if entry else "exact"),
        first_logits_sha256="f" * 64))
        for r in rows]


def _result(fakerun: ModuleType, tmp_path: Path, load: float = 0.3) -> tuple[Comparison, dict[str, list[Row]]]:
    rows = {label: _rows(fakerun, label) for label in LABELS}
    rows[PAIRS["recurring"][0]] = [dataclasses.replace(r, completion=dataclasses.replace(r.completion,
                                 first_logits_sha256="f" * 64)) for r in rows[PAIRS["recurring"][0]]]
    summaries = {label: Summary.of(rs, condition=label.split(" ")[0], model="toy-model", dataset="toy",
                                   run_dir=label, comparable_key="k", run_wall_s=1.0,
                                   energy_status="unavailable:no RAPL", energy_j=None, group=None)
                 for label, rs in rows.items()}
    folders = {label: RunFolder(tmp_path / label.replace(" ", "_")) for label in LABELS}
    pairings = {g: pair(rows[PAIRS[g][1]], rows[PAIRS[g][0]]) for g in PAIRS}
    result = comparison("k", folders, summaries, pairings, {k: "m" for k in LABELS})
    return dataclasses.replace(result, load=JobLoad(2, {label: RunLoad(load, load) for label in LABELS})), rows


def _render(result: Comparison, width: int, misses: list[str] = ()) -> str:
    console = Console(width=width, record=True, color_system=None)
    print_comparison("toy, toy-model | 16 tokens | greedy, batch_size=1", result, misses=misses,
                     console=console, reprint="python scripts/show_comparison.py runs/compare/x")
    return console.export_text()


def test_at_80_columns_nothing_is_cut_and_directions_are_stated(fakerun: ModuleType, tmp_path: Path) -> None:
    result, _ = _result(fakerun, tmp_path)
    text = _render(result, 80)
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= 80
    for label in LABELS:
        assert label in text  # every run's row, its group in its name
    assert "x: baseline / this run" in text and "x: incontext / graft" in text
    assert "0.75 [0.50, 1.00]" in text  # accuracy with its interval, not cut
    assert "re-print: python scripts/show_comparison.py runs/compare/x" in text
    assert "loaded" not in text


def test_at_80_columns_a_full_size_job_is_not_cut_either(fakerun: ModuleType, tmp_path: Path) -> None:
    """The widest figures a 40-problem job prints (40/40 twins, two-digit stop counts, 3-digit prefill per row,
    the longest run label) still fit 80 columns."""
    from harness.compare.pairing import Pairing

    result, _ = _result(fakerun, tmp_path)
    figures = {k: dataclasses.replace(s, stop_reasons={"eos": 1, "stop": 34, "length": 5},
                                      tokens=dataclasses.replace(s.tokens, prefill=340 * 3, grafted=273 * 3))
               for k, s in result.summaries.items()}
    pairs = {g: dataclasses.replace(p, pairing=Pairing(40, 0)) for g, p in (result.pairs or {}).items()}
    text = _render(dataclasses.replace(result, summaries=figures, pairs=pairs), 80)
    assert "…" not in text and "40/40" in text and "1/34/5" in text
    assert max(len(line) for line in text.splitlines()) <= 80


def test_wide_terminals_get_the_side_by_side_table(fakerun: ModuleType, tmp_path: Path) -> None:
    result, _ = _result(fakerun, tmp_path)
    text = _render(result, 200)
    assert "…" not in text and "accuracy [95% CI]" in text and "baseline / this run" in text
    header = next(line for line in text.splitlines() if "incontext (recurring)" in line)
    assert "graft (held-out)" in header  # one table, runs side by side


def test_a_loaded_machine_is_warned_about(fakerun: ModuleType, tmp_path: Path) -> None:
    result, _ = _result(fakerun, tmp_path, load=5.0)
    text = " ".join(_render(result, 80).split())
    assert "the machine was loaded: 1-minute load average up to 5.0 on 2 cores" in text


def test_per_problem_view_and_misses_name_what_the_graft_read(fakerun: ModuleType, tmp_path: Path) -> None:
    _, rows = _result(fakerun, tmp_path)
    entries = {"e-toy-1": {"problem_id": "toy-1", "answer": "42"}, "e-toy-2": {"problem_id": "toy-2", "answer": "9"}}
    table = per_problem.per_problem(rows, entries)
    assert [(r["problem_id"], r["sample"], r["gold"]) for r in table] == [("toy-1", 0, "42"), ("toy-1", 1, "42"),
                                                                           ("toy-2", 0, "9")]
    first = table[0]
    assert first["graft held-out"] == "42" and first["graft held-out ok"] is True
    assert first["held-out entry"] == "toy-2" and first["held-out entry answer"] == "9"
    assert first["recurring entry"] == "toy-1" and first["recurring graft==twin"] is True
    assert first["held-out graft==twin"] is False  # its incontext twin recorded no first-logits hash
    misses = per_problem.misses(table)
    # sample 1 of toy-1 answered 32 in every run: wrong in both groups; held-out rows also differ from their twin
    assert "recurring toy-1#1: gold 42 | graft 32, read toy-1 (answer 42) | incontext 32 | baseline 32" in misses
    assert any(m.startswith("held-out toy-2#0: gold 9 | graft 9, read toy-2 (answer 9)") and "graft != twin" in m
               for m in misses)
    assert not any(m.startswith("recurring toy-1#0") for m in misses)  # right and identical: not a miss
    assert set(per_problem.columns_of(table)) >= {"problem_id", "gold", "baseline", "graft recurring ok"}


def test_show_comparison_reprints_a_finished_comparison(fakerun: ModuleType, tmp_path: Path,
                                                        repo_root: Path) -> None:
    result, rows = _result(fakerun, tmp_path)
    out = tmp_path / "compare" / "stamp"
    out.mkdir(parents=True)
    (out / "comparison.json").write_text(json.dumps(result.to_json()))
    (out / "per_problem.json").write_text(json.dumps({"rows": per_problem.per_problem(rows, {})}))
    env = {**os.environ, "PYTHONPATH": str(repo_root)}  # this checkout's harness
    done = subprocess.run([sys.executable, str(repo_root / "scripts" / "show_comparison.py"), str(out),
                           "--width", "80"], capture_output=True, text=True, timeout=120, check=False, env=env)
    # a comparison.json bound to no run folder does not re-check, so nothing of it is shown (issue 51, item 2); a
    # real compare folder is re-printed in tests/harness/test_log_run_trust.py
    assert done.returncode == 2 and "does not re-check" in done.stderr and done.stdout == "", done.stderr
    missing = subprocess.run([sys.executable, str(repo_root / "scripts" / "show_comparison.py"), str(tmp_path)],
                             capture_output=True, text=True, timeout=120, check=False, env=env)
    assert missing.returncode == 2 and "comparison.json" in missing.stderr


def test_control_characters_in_the_data_are_shown_escaped_not_obeyed(fakerun: ModuleType, tmp_path: Path) -> None:
    """Issue 31, finding 11: an ANSI escape in a problem id (a miss line) or in the title reaches the terminal as
    `\\x1b[...`, and Rich markup in them is shown as written."""
    result, _ = _result(fakerun, tmp_path)
    console = Console(width=80, record=True, force_terminal=True)
    print_comparison("toy \x1b]0;pwned\x07 [bold]set", result, console=console,
                     misses=["toy-\x1b[2J\x1b[31m1 [red]x: baseline right, graft wrong"])
    out = console.export_text(styles=False)
    assert "\x1b[2J" not in out and "\x07" not in out and "\\x1b[2J\\x1b[31m1 [red]x" in out
    assert "toy \\x1b]0;pwned\\x07 [bold]set" in out
