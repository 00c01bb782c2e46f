"""The compare job's per-problem view: for each (problem, sample), the gold answer, each condition's answer and
whether it is correct, the library entry each graft read (its problem id and answer) and whether the graft row
is identical to its in-context twin; and the misses among them, one line each, for the terminal.

    table = per_problem(rows_by_label, entries, plan)   # rows: label -> Row list; entries: library; the Plan
    misses(table, plan)                                 # ["held-out toy-2#0: gold 9 | graft 32, read toy-7 ..."]

The pairs are the plan's (harness.compare.plan.Plan: each `identical` pair, named by its group); without a plan,
the legacy one (Plan.legacy).

Written by the compare job as ``per_problem.json`` beside ``comparison.json`` (``{"rows": [...]}``)
and logged to MLflow as the parent run's table ``per_problem_table.json``. A view, not a figure: ``make rescore``
re-checks the runs it is made from, not this file.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from harness.compare.plan import Plan
from harness.record.rows import Group, Row

__all__ = ["PER_PROBLEM", "TABLE_FILE", "column_name", "columns_of", "entry_answers", "misses", "per_problem"]

PER_PROBLEM = "per_problem.json"
TABLE_FILE = "per_problem_table.json"


def column_name(label: str) -> str:
    """A run label as a column prefix: "graft (held-out)" -> "graft held-out"."""
    return label.replace("(", "").replace(")", "")


def entry_answers(entries: Sequence[Any]) -> dict[str, dict[str, str]]:
    """entry_id -> {"problem_id", "answer"} of a library's entries (``harness.library.build.Entry``)."""
    return {e.entry_id: {"problem_id": e.problem_id, "answer": str(e.answer)} for e in entries}


def _twin_identical(g: Row, c: Row | None) -> bool:
    return (c is not None and g.completion.token_ids == c.completion.token_ids
            and g.completion.first_logits_sha256 is not None
            and g.completion.first_logits_sha256 == c.completion.first_logits_sha256)


def _pairs(plan: Plan | None, labels: Sequence[str]) -> list[tuple[str, str, str]]:
    """(group label, run label, twin label) of each identical pair of `plan` (default: the labels' legacy plan)."""
    if plan is None:
        plan = Plan.of_comparison({"runs": dict.fromkeys(labels)}) if labels else Plan.legacy()
    return [(Group.parse(k).label, first, twin) for k, (first, twin) in plan.pairs.items()]


def per_problem(rows: Mapping[str, Sequence[Row]], entries: Mapping[str, Mapping[str, str]],
                plan: Plan | None = None) -> list[dict[str, Any]]:
    """One dict per (problem_id, sample) over every run label in `rows` (comparison labels), in problem order:
    ``problem_id, sample, gold``, then per label ``<label>`` (the extracted answer or None) and ``<label> ok``,
    per identical pair (by its group) ``<group> entry`` / ``<group> entry answer`` (what the pair's run read;
    None without an entry) and ``<group> graft==twin``."""
    by = {label: {(r.problem_id, r.sample): r for r in rs} for label, rs in rows.items()}
    keys: list[tuple[str, int]] = []
    for rs in rows.values():
        keys += [(r.problem_id, r.sample) for r in rs if (r.problem_id, r.sample) not in keys]
    table = []
    for key in keys:
        first = next(by[label][key] for label in by if key in by[label])
        out: dict[str, Any] = {"problem_id": key[0], "sample": key[1], "gold": first.gold}
        for label in rows:
            r = by[label].get(key)
            out[column_name(label)] = None if r is None else r.extracted
            out[f"{column_name(label)} ok"] = None if r is None else r.correct
        for name, graft, incontext in _pairs(plan, list(rows)):
            g = by.get(graft, {}).get(key)
            if g is None:
                continue
            entry_id = g.completion.retrieval.entry_id if g.completion.retrieval else None
            entry = entries.get(entry_id or "", {})
            out[f"{name} entry"] = entry.get("problem_id", entry_id)
            out[f"{name} entry answer"] = entry.get("answer")
            out[f"{name} graft==twin"] = _twin_identical(g, by.get(incontext, {}).get(key))
        table.append(out)
    return table


def misses(table: Sequence[Mapping[str, Any]], plan: Plan | None = None) -> list[str]:
    """One line per row and identical pair where the pair's run (the graft) is wrong or differs from its twin,
    saying what it read: ``held-out toy-2#0: gold 9 | graft 32, read toy-7 (answer 32) | incontext 32 |
    baseline 5``."""
    lines = []
    plan = plan or Plan.legacy()
    base = column_name(plan.baseline)
    for row in table:
        for name, first, second in _pairs(plan, []):
            graft, incontext = column_name(first), column_name(second)
            what, twin_what = first.split(" ")[0], second.split(" ")[0]
            if graft not in row or (row.get(f"{graft} ok") and row.get(f"{name} graft==twin")):
                continue
            entry = row.get(f"{name} entry")
            read = f", read {entry} (answer {row.get(f'{name} entry answer')})" if entry else ", no entry read"
            twin = "" if row.get(f"{name} graft==twin") else " | graft != twin"
            lines.append(f"{name} {row['problem_id']}#{row['sample']}: gold {row['gold']} | {what} "
                         f"{row.get(graft)}{read} | {twin_what} {row.get(incontext)} | {plan.baseline} "
                         f"{row.get(base)}{twin}")
    return lines


def columns_of(table: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """The table as columns for ``MlflowClient.log_table`` (every key of any row; missing cells None)."""
    names: list[str] = []
    for row in table:
        names += [k for k in row if k not in names]
    return {k: [row.get(k) for row in table] for k in names}
