"""The main job (`make aime-graft`): graft condition vs its matching baseline, side by side.

    python -m harness.compare [overrides]      e.g. dataset.limit=5 decoding.max_new_tokens=32

1. builds the library if it is missing (library.*);
2. finds the newest complete baseline run with the same model, dataset, prompt, decoding and determinism
   settings (summary.json `comparable_key`), or runs it first;
3. runs the graft condition twice: recurring (the library may hold the evaluated problem) and held-out
   (library.exclude_self=true: the evaluated problem never reaches the context);
4. computes the comparison in memory from the three Summaries, prints it, and writes it once to
   runs/compare/<stamp>/comparison.json (and to MLflow as a run of its own when tracking is on).
"""

from __future__ import annotations

import copy
import sys
import warnings
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from rich.table import Table

from harness.conditions import Baseline, Graft
from harness.config import compose_config, load_model, typed
from harness.errors import exit_on_error
from harness.hashing import write_json
from harness.library import open_library
from harness.record import HELD_OUT, RECURRING, Summary
from harness.run import comparable_key, console, run
from harness.run_folder import RunFolder, stamp
from harness.tracking import default_tracking_uri, log_comparison
from kvstore.environment import enter_profile

#: Labels of the three runs in the table and in comparison.json (graft label -> library.exclude_self).
BASELINE_LABEL = "baseline"
GRAFT_LABELS = {"graft (recurring)": (RECURRING, False), "graft (held-out)": (HELD_OUT, True)}


def find_baseline(runs: Path, key: str) -> RunFolder | None:
    """The newest complete baseline run folder under `runs` whose comparable_key is `key`."""
    found = []
    for folder in RunFolder.find(runs):
        try:
            s = folder.read_summary()
        except Exception:  # noqa: BLE001 - an unreadable folder is simply not a match
            continue
        if s.condition == Baseline.name and s.comparable_key == key:
            found.append(folder)
    return max(found, key=lambda f: f.file("manifest.json").stat().st_mtime) if found else None


def compare_summaries(baseline: Summary, other: Summary) -> dict[str, Any]:
    """Side-by-side figures of a run against its matching baseline (factors are baseline / other)."""

    def factor(a: float | None, b: float | None) -> float | None:
        return (a / b) if a is not None and b not in (None, 0) else None

    be, oe = baseline.energy, other.energy
    both_measured = be.get("joules") is not None and oe.get("joules") is not None
    return {
        "baseline_run": baseline.run_dir,
        "baseline_accuracy": baseline.scores["accuracy"],
        "baseline_accuracy_ci_low": baseline.scores["accuracy_ci_low"],
        "baseline_accuracy_ci_high": baseline.scores["accuracy_ci_high"],
        "accuracy": other.scores["accuracy"],
        "accuracy_delta": other.scores["accuracy"] - baseline.scores["accuracy"],
        "baseline_decode_tokens": baseline.tokens["decode"],
        "decode_tokens": other.tokens["decode"],
        "token_reduction": factor(baseline.tokens["decode"], other.tokens["decode"]),
        "wall_factor": factor(baseline.time["wall_s"], other.time["wall_s"]),
        "cpu_factor": factor(baseline.time["cpu_s"], other.time["cpu_s"]),
        "energy_factor": factor(be["joules"], oe["joules"]) if both_measured else None,
        "energy_status": "measured" if both_measured else f"unavailable ({oe.get('status')})",
    }


def comparison(key: str, folders: dict[str, RunFolder], summaries: dict[str, Summary]) -> dict[str, Any]:
    """comparison.json, computed in memory: each run's figures and, for the grafts, the comparison with the
    baseline (`summaries[BASELINE_LABEL]`)."""
    base = summaries[BASELINE_LABEL]
    return {
        "comparable_key": key,
        "runs": {k: str(f.path) for k, f in folders.items()},
        "summaries": {
            k: {
                "scores": s.scores, "tokens": s.tokens, "time": s.time, "energy": s.energy,
                **({"groups": s.groups} if s.groups is not None else {}),
                "comparison": None if k == BASELINE_LABEL else compare_summaries(base, s),
            }
            for k, s in summaries.items()
        },
    }  # fmt: skip


def _with(cfg: DictConfig, **changes: Any) -> DictConfig:
    """A copy of the composed config with `a__b=value` set as a.b (types and struct mode kept)."""
    c = copy.deepcopy(cfg)
    for dotted, value in changes.items():
        OmegaConf.update(c, dotted.replace("__", "."), value, merge=False)
    return c


def print_comparison(title: str, result: dict[str, Any]) -> None:
    table = Table(title=title)
    table.add_column("")
    rows = result["summaries"]
    for label in rows:
        table.add_column(label, justify="right")

    def row(name, fn):
        table.add_row(name, *[fn(s, s["comparison"] or {}) for s in rows.values()])

    def fmt(x, spec=".2f"):
        return "n/a" if x is None else format(x, spec)

    def factor(key):
        return lambda c: f" ({fmt(c[key])}x)" if c else ""

    sc = "scores"
    row("problems", lambda s, c: str(s[sc]["n_problems"]))
    row("accuracy [95% CI]", lambda s, c: (
        f"{s[sc]['accuracy']:.3f} [{s[sc]['accuracy_ci_low']:.3f}, {s[sc]['accuracy_ci_high']:.3f}]"))  # fmt: skip
    row("decode tokens (total)", lambda s, c: str(s["tokens"]["decode"]))
    row("decode tokens / problem", lambda s, c: f"{s['tokens']['decode'] / s[sc]['n_rows']:.1f}")
    row("grafted tokens (total)", lambda s, c: str(s["tokens"]["grafted"]))
    row("prefill tokens (total)", lambda s, c: str(s["tokens"]["prefill"]))
    row("token reduction (x)", lambda s, c: fmt(c.get("token_reduction")) if c else "1")
    row("wall time s (factor)", lambda s, c: f"{s['time']['wall_s']:.1f}" + factor("wall_factor")(c))
    row("cpu time s (factor)", lambda s, c: f"{s['time']['cpu_s']:.1f}" + factor("cpu_factor")(c))
    row("energy", lambda s, c: (
        (f"{s['energy']['joules']:.1f} J" if s["energy"]["joules"] is not None else "unavailable")
        + (f" ({fmt(c['energy_factor'])}x)" if c.get("energy_factor") else "")))  # fmt: skip
    console.print(table)
    base_energy = rows[BASELINE_LABEL]["energy"]
    if base_energy["joules"] is None:
        console.print(f"energy: {base_energy['status']}")


@exit_on_error
def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the compare job with Hydra overrides `argv` (default: the command line); return the comparison."""
    cfg = compose_config(sys.argv[1:] if argv is None else argv)
    c = typed(cfg)
    enter_profile(c.determinism.profile)  # re-executes with the profile's kernel variables when not set
    root = Path(c.project_root)
    runs = root / c.runs_dir
    fm = load_model(c)
    lib = open_library(c.library, fm, root, build_if_missing=True)
    console.print(
        f"library {lib.manifest['name']} v{lib.manifest['version']}: {len(lib.entries)} verified entries "
        f"({lib.manifest['tokens_total']} tokens of KV) in {lib.path}"
    )

    key = comparable_key(c, fm)
    folders: dict[str, RunFolder] = {}
    summaries: dict[str, Summary] = {}
    found = find_baseline(runs, key)
    if found is None:
        console.print("[bold]no matching baseline run: running the baseline first[/]")
        folders[BASELINE_LABEL], summaries[BASELINE_LABEL] = run(_with(cfg, condition__name=Baseline.name), fm=fm)
    else:
        console.print(f"matching baseline run: {found.path}")  # an earlier job's record: read, not recomputed
        folders[BASELINE_LABEL], summaries[BASELINE_LABEL] = found, found.read_summary()
    for label, (group, exclude) in GRAFT_LABELS.items():
        console.print(f"[bold]{label}[/]: library.exclude_self={str(exclude).lower()}")
        graft_cfg = _with(cfg, condition__name=Graft.name, library__exclude_self=exclude)
        folders[label], summaries[label] = run(graft_cfg, RunFolder.new(runs, Graft.name, group), fm=fm)

    result = comparison(key, folders, summaries)
    d = c.decoding
    print_comparison(
        f"graft vs baseline: {c.dataset.name}, {fm.name}, max_new_tokens={d.max_new_tokens}, {d.strategy}", result
    )
    out = runs / "compare" / stamp() / "comparison.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, result)
    if c.tracking.enabled:
        uri = c.tracking.uri or default_tracking_uri(runs.resolve())
        try:
            run_id = log_comparison(out, result, tracking_uri=uri, experiment=c.tracking.experiment)
            console.print(f"MLflow: comparison logged as run {run_id} in {uri}")
        except Exception as exc:  # noqa: BLE001 - tracking never loses the job; comparison.json is written
            warnings.warn(f"MLflow logging of {out} failed ({type(exc).__name__}: {exc})", RuntimeWarning,
                          stacklevel=1)  # fmt: skip
    console.print(f"comparison: {out}; re-check each run with make rescore RUN=<run folder>")
    return result


if __name__ == "__main__":
    main()
