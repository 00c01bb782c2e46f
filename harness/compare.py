"""The main job (`make aime-graft`): graft condition vs its matching baseline, side by side.

    python -m harness.compare [overrides]      e.g. dataset.limit=5 decoding.max_new_tokens=32

1. builds the library if it is missing (library.*);
2. finds the newest complete baseline run with the same model, dataset, prompt, decoding and determinism
   settings (summary.json `comparable_key`), or runs it first;
3. runs the graft condition twice: recurring (the library may hold the evaluated problem) and held-out
   (library.exclude_self=true: the evaluated problem never reaches the context);
4. prints the comparison and writes it to each graft run's summary.json (and so to MLflow) and to
   runs/compare/<timestamp>/comparison.json.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from rich.table import Table

from harness.config import compose_config
from harness.hashing import write_json
from harness.library import open_library
from harness.run import comparable_key, console, load_model, run


def _stamp() -> str:
    return datetime.now().strftime("%Y-%m-%d_%H-%M-%S-%f")


def find_baseline(runs: Path, key: str) -> Path | None:
    """The newest complete baseline run folder whose comparable_key is `key`."""
    found = []
    for summary in runs.glob("**/summary.json"):
        if "mlartifacts" in summary.parts:  # MLflow's copies of run folders, not runs
            continue
        try:
            s = json.loads(summary.read_text())
        except (OSError, ValueError):
            continue
        if (
            s.get("condition") == "baseline"
            and s.get("comparable_key") == key
            and (summary.parent / "manifest.json").exists()
        ):
            found.append(summary.parent)
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def _with(cfg: DictConfig, **changes) -> DictConfig:
    c = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    OmegaConf.set_struct(c, True)
    for dotted, value in changes.items():
        OmegaConf.update(c, dotted.replace("__", "."), value, merge=False)
    return c


def main(argv: list[str] | None = None) -> dict:
    cfg = compose_config(sys.argv[1:] if argv is None else argv)
    root = Path(cfg.project_root)
    runs = root / cfg.runs_dir
    fm = load_model(cfg)
    lib = open_library(cfg.library, fm, root, build_if_missing=True)
    console.print(
        f"library {lib.manifest['name']} v{lib.manifest['version']}: {len(lib.entries)} verified entries "
        f"({lib.manifest['tokens_total']} tokens of KV) in {lib.path}"
    )

    key = comparable_key(cfg, fm)
    base_dir = find_baseline(runs, key)
    if base_dir is None:
        console.print("[bold]no matching baseline run: running the baseline first[/]")
        base_dir = run(_with(cfg, condition__name="baseline"), runs / "baseline" / _stamp(), fm=fm)
    else:
        console.print(f"matching baseline run: {base_dir}")
    base = json.loads((base_dir / "summary.json").read_text())

    results = {"baseline": base}
    dirs = {"baseline": base_dir}
    for label, exclude in (("graft (recurring)", False), ("graft (held-out)", True)):
        console.print(f"[bold]{label}[/]: library.exclude_self={str(exclude).lower()}")
        c = _with(cfg, condition__name="graft", library__exclude_self=exclude)
        d = run(
            c, runs / "graft" / f"{_stamp()}-{'held_out' if exclude else 'recurring'}", fm=fm, baseline_summary=base
        )
        results[label], dirs[label] = json.loads((d / "summary.json").read_text()), d

    table = Table(
        title=f"graft vs baseline: {cfg.dataset.name}, {fm.name}, "
        f"max_new_tokens={cfg.decoding.max_new_tokens}, {cfg.decoding.strategy}"
    )
    table.add_column("")
    for label in results:
        table.add_column(label, justify="right")

    def row(name, fn):
        table.add_row(name, *[fn(s) for s in results.values()])

    def fmt(x, spec=".2f"):
        return "n/a" if x is None else format(x, spec)

    row("problems", lambda s: str(s["scores"]["n_problems"]))
    row(
        "accuracy [95% CI]",
        lambda s: (
            f"{s['scores']['accuracy']:.3f} [{s['scores']['accuracy_ci_low']:.3f}, "
            f"{s['scores']['accuracy_ci_high']:.3f}]"
        ),
    )
    row("decode tokens (total)", lambda s: str(s["tokens"]["decode"]))
    row("decode tokens / problem", lambda s: f"{s['tokens']['decode'] / s['scores']['n_rows']:.1f}")
    row("grafted tokens (total)", lambda s: str(s["tokens"]["grafted"]))
    row("prefill tokens (total)", lambda s: str(s["tokens"]["prefill"]))
    row(
        "token reduction (x)",
        lambda s: fmt(s.get("comparison", {}).get("token_reduction")) if "comparison" in s else "1",
    )
    row(
        "wall time s (factor)",
        lambda s: (
            f"{s['time']['wall_s']:.1f}" + (f" ({fmt(s['comparison']['wall_factor'])}x)" if "comparison" in s else "")
        ),
    )
    row(
        "cpu time s (factor)",
        lambda s: (
            f"{s['time']['cpu_s']:.1f}" + (f" ({fmt(s['comparison']['cpu_factor'])}x)" if "comparison" in s else "")
        ),
    )
    row(
        "energy",
        lambda s: (
            (f"{s['energy']['joules']:.1f} J" if s["energy"]["joules"] is not None else "unavailable")
            + (f" ({fmt(s['comparison']['energy_factor'])}x)" if s.get("comparison", {}).get("energy_factor") else "")
        ),
    )
    console.print(table)
    if results["baseline"]["energy"]["joules"] is None:
        console.print(f"energy: {results['baseline']['energy']['status']}")
    out = runs / "compare" / _stamp()
    comparison = {
        "comparable_key": key,
        "runs": {k: str(v) for k, v in dirs.items()},
        "summaries": {
            k: {
                "scores": v["scores"],
                "tokens": v["tokens"],
                "time": v["time"],
                "energy": v["energy"],
                "comparison": v.get("comparison"),
            }
            for k, v in results.items()
        },
    }
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "comparison.json", comparison)
    console.print(f"comparison: {out / 'comparison.json'}; re-check each run with make rescore RUN=<run folder>")
    return comparison


if __name__ == "__main__":
    main()
