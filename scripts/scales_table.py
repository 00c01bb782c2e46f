"""The two-scales table: accuracy per condition (model alone, in-context, graft recurring / held-out) for each model,
with Wilson 95% intervals, and the per-problem view against the model alone: which problems a grafted entry turned
from wrong to right, and which from right to wrong.

    python -m scripts.scales_table 270M=runs/compare/<stamp> 1.5B=runs/compare/<stamp> \
        [--slice 270M=runs/compare/<stamp>] [--json runs/scales/table.json] [--markdown runs/scales/table.md]

Each MODEL=FOLDER is a compare folder (`python -m harness.compare +experiment=scales model=...`); --slice adds a
compare folder with the in-context runs (configs/compare/graft.yaml on the first problems), reported with the
rows they cover. Reads only the compare and run folders, never the model, and only after they re-check
(harness.compare.audit.audited_comparison: the audit behind `make rescore`); an edited one is refused naming its first
difference.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harness.compare.audit import audited_comparison
from harness.compare.comparison import Comparison
from harness.errors import HarnessError, plain
from harness.record.hashing import atomic_write_text
from harness.record.metrics import wilson_interval
from harness.record.rows import Row

REPO = Path(__file__).resolve().parents[1]


def _pairs(args: list[str], flag: str) -> dict[str, Path]:
    out = {}
    for a in args:
        name, sep, path = a.partition("=")
        if not sep or not name or not path:
            raise SystemExit(f"{flag} {a!r}: write MODEL=COMPARE_FOLDER, e.g. 1.5B=runs/compare/<stamp>")
        out[name] = Path(path)
    return out


def read_compare(folder: Path) -> tuple[dict[str, list[Row]], Comparison]:
    """label -> its rows (first sample of each problem) of a compare folder, and the comparison itself."""
    try:
        checked = audited_comparison(folder, "the table")
    except HarnessError as exc:
        raise SystemExit(f"error: {plain(str(exc))}") from None
    comp = Comparison.from_json(checked.raw)
    rows = {}
    for label in sorted(comp.runs, key=lambda x: (x not in comp.plan.labels, comp.plan.labels.index(x)
                                                  if x in comp.plan.labels else 0, x)):  # the plan's order
        rows[label] = [r for r in checked.runs[label].rows if r.sample == 0]
    return rows, comp


def accuracy(rows: list[Row]) -> dict:
    n, k = len(rows), sum(r.correct for r in rows)
    lo, hi = wilson_interval(k, n)
    return {"correct": k, "n": n, "accuracy": k / n, "ci95": [round(lo, 4), round(hi, 4)]}


def flips(alone: list[Row], other: list[Row]) -> dict[str, list[str]]:
    """Problems `other` got right that the model alone got wrong (wrong_to_right), and the reverse."""
    base = {r.problem_id: r.correct for r in alone}
    up = [r.problem_id for r in other if r.correct and base.get(r.problem_id) is False]
    down = [r.problem_id for r in other if not r.correct and base.get(r.problem_id) is True]
    return {"wrong_to_right": up, "right_to_wrong": down}


def model_report(folder: Path, slice_folder: Path | None) -> dict:
    rows, comp = read_compare(folder)
    alone = rows[comp.plan.baseline]
    out: dict = {"compare": str(folder), "conditions": {}, "per_problem": {}}
    for label, rs in rows.items():
        out["conditions"][label] = accuracy(rs)
        if label != comp.plan.baseline:
            out["per_problem"][label] = flips(alone, rs)
    if slice_folder is not None:
        srows, scomp = read_compare(slice_folder)
        ids = {r.problem_id for r in srows[scomp.plan.baseline]}
        out["slice"] = {"compare": str(slice_folder), "problems": len(ids), "conditions": {
            label: accuracy(rs) for label, rs in srows.items()},
            "graft==incontext": scomp.identical()}
    return out


def fmt(a: dict) -> str:
    lo, hi = a["ci95"]
    return f"{a['correct']}/{a['n']} = {a['accuracy']:.3f} [{lo:.3f}, {hi:.3f}]"


def _ids(ids: list[str], most: int = 12) -> str:
    return f"{len(ids)} ({', '.join(ids[:most]) or '-'}{' ...' if len(ids) > most else ''})"


def markdown(report: dict) -> str:
    labels = []
    for m in report.values():
        labels += [x for x in m["conditions"] if x not in labels]
    lines = ["| model | " + " | ".join(labels) + " |", "|---|" + "---:|" * len(labels)]
    for name, m in report.items():
        cells = [fmt(m["conditions"][x]) if x in m["conditions"] else "" for x in labels]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("")
    for name, m in report.items():
        for label, f in m["per_problem"].items():
            lines.append(f"- {name}, {label} vs alone: wrong -> right {_ids(f['wrong_to_right'])}; "
                         f"right -> wrong {_ids(f['right_to_wrong'])}")
        if "slice" in m:
            s = m["slice"]
            same = ", ".join(f"{k} {v}" for k, v in s["graft==incontext"].items())
            lines.append(f"- {name}, the first {s['problems']} problems with the in-context control: "
                         + "; ".join(f"{k} {fmt(v)}" for k, v in s["conditions"].items())
                         + f"; graft == in-context rows: {same}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+", help="MODEL=COMPARE_FOLDER, one per model, in table order")
    ap.add_argument("--slice", action="append", default=[], help="MODEL=COMPARE_FOLDER with the in-context runs")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--markdown", type=Path, default=None)
    args = ap.parse_args(argv)
    models, slices = _pairs(args.models, "MODEL"), _pairs(args.slice, "--slice")
    unknown = sorted(set(slices) - set(models))
    if unknown:
        raise SystemExit(f"--slice {unknown[0]}=...: no model of that name among {sorted(models)}")
    report = {name: model_report(folder, slices.get(name)) for name, folder in models.items()}
    text = markdown(report)
    emit_table(text, report, args.json, args.markdown)
    return 0


def emit_table(text: str, data: object, json_path: Path | None, markdown_path: Path | None) -> None:
    """Print a table's markdown and write it (--markdown) and its data (--json) where asked; shared by the table
    scripts (scales, harvest, transfer). Text from the runs (problem ids, labels) has its control characters written
    as escapes (harness.errors.plain) on the terminal and in the markdown file; the JSON keeps it as it is."""
    text = plain(text)
    print(text, end="")
    if json_path:
        atomic_write_text(json_path, json.dumps(data, indent=1) + "\n")
    if markdown_path:
        atomic_write_text(markdown_path, text)


if __name__ == "__main__":
    sys.exit(main())
