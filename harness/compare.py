"""The main job (`make aime-graft`): graft vs its in-context control vs the matching baseline, side by side.

    python -m harness.compare [overrides]      e.g. dataset.limit=5 decoding.max_new_tokens=32

1. builds the library if it is missing (library.*);
2. finds the newest complete baseline run with the same model, dataset, prompt, decoding and determinism
   settings (summary.json `comparable_key`) that re-scores (harness.audit), saying why it passes over any that
   do not, or runs it first;
3. runs incontext and graft twice each: recurring (the library may hold the evaluated problem) and held-out
   (library.exclude_self=true: the evaluated problem never reaches the context);
4. computes the comparison in memory from the five Summaries and pairs every graft row with its incontext twin
   (harness/pairing.py: same completion token ids and first-logits SHA-256), prints it, and writes it once to
   runs/compare/<stamp>/comparison.json with each run's manifest SHA-256 (and to MLflow as a run of its own when
   tracking is on);
5. exits non-zero (PairingError, naming the rows) when any graft row differs from its twin.

`make rescore RUN=runs/compare/<stamp>` re-audits every run it lists, checks they are the runs it was made from,
re-pairs them and recomputes every figure (harness.comparison.audit_comparison).
"""

from __future__ import annotations

import copy
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from rich.table import Table

from harness.audit import audit
from harness.comparison import BASELINE_LABEL, GROUPS, PAIRS, comparison
from harness.conditions import Baseline, Graft, InContext
from harness.config import compose_config, load_model, typed
from harness.errors import HarnessError, PairingError, exit_on_error
from harness.hashing import write_json
from harness.library import open_library
from harness.pairing import pair
from harness.record import Row, Summary
from harness.run import comparable_key, console, run, run_rows, stops_text
from harness.run_folder import RunFolder, stamp
from harness.tracking import default_tracking_uri, log_comparison
from kvstore.environment import enter_profile


def find_baseline(runs: Path, key: str, say: Callable[[str], None] = lambda _: None) -> RunFolder | None:
    """The newest complete baseline run folder under `runs` whose comparable_key is `key` and that re-scores
    (harness.audit: every hash, row and figure of it re-checked); `say` is told why each other candidate is not
    reused. None when no candidate passes (the caller then runs a fresh baseline)."""
    found = []
    for folder in RunFolder.find(runs):
        try:
            s = folder.read_summary()
        except Exception:  # noqa: BLE001 - an unreadable folder is simply not a match
            continue
        if s.condition == Baseline.name and s.comparable_key == key:
            found.append(folder)
    for folder in sorted(found, key=lambda f: f.file("manifest.json").stat().st_mtime, reverse=True):
        try:
            check = audit(folder)
        except HarnessError as exc:
            say(f"baseline {folder.path} not reused: {exc}")
            continue
        if check.ok:
            return folder
        more = f" (and {len(check.findings) - 1} more finding(s))" if len(check.findings) > 1 else ""
        say(f"baseline {folder.path} not reused: it does not re-score: {check.findings[0]}{more}")
    return None


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
    row("prefill tokens (total)", lambda s, c: str(s["tokens"]["prefill"]) + factor("prefill_factor")(c))
    row("TTFT s / row (factor)", lambda s, c: (
        f"{s['time'].get('ttft_s', 0.0) / s[sc]['n_rows']:.3f}" + factor("ttft_factor")(c)))  # fmt: skip
    row("stops eos/stop/length", lambda s, c: stops_text(s.get("stop_reasons")))
    row("token reduction (x)", lambda s, c: fmt(c.get("token_reduction")) if c else "1")
    row("wall time s (factor)", lambda s, c: f"{s['time']['wall_s']:.1f}" + factor("wall_factor")(c))
    row("cpu time s (factor)", lambda s, c: f"{s['time']['cpu_s']:.1f}" + factor("cpu_factor")(c))
    row("energy", lambda s, c: (
        (f"{s['energy']['joules']:.1f} J" if s["energy"]["joules"] is not None else "unavailable")
        + (f" ({fmt(c['energy_factor'])}x)" if c.get("energy_factor") else "")))  # fmt: skip
    pairs = result.get("pairs") or {}
    if pairs:
        twin = {PAIRS[g][1]: p for g, p in pairs.items()}
        table.add_row("rows identical to incontext", *[
            f"{twin[k]['identical_rows']}/{twin[k]['identical_rows'] + twin[k]['differing_rows']}" if k in twin else ""
            for k in rows])  # fmt: skip
    console.print(table)
    for group, p in pairs.items():
        n = p["identical_rows"] + p["differing_rows"]
        style = "green" if p["differing_rows"] == 0 else "bold red"
        console.print(f"[{style}]{PAIRS[group][1]} vs {PAIRS[group][0]}: {p['identical_rows']}/{n} rows identical "
                      f"(completion token ids and first-logits SHA-256), {p['differing_rows']} differing[/]")
        f = p.get("graft_vs_incontext") or {}
        console.print("  the same rows for " + ", ".join(
            f"{fmt(f.get(k))}x less {what}" for k, what in (("prefill_factor", "prefill"), ("ttft_factor", "TTFT"),
                                                             ("wall_factor", "wall time"), ("cpu_factor", "CPU time"))))
    base_rows = rows[BASELINE_LABEL]
    hit = (base_rows.get("stop_reasons") or {}).get("length")
    if hit:
        console.print(f"[yellow]the baseline hit its token budget on {hit} of {base_rows[sc]['n_rows']} rows: "
                      "token reduction is measured against truncated answers[/]")
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
    found = find_baseline(runs, key, say=lambda why: console.print(f"[yellow]{why}[/]"))
    if found is None:
        console.print("[bold]no matching baseline run that re-scores: running the baseline first[/]")
        folders[BASELINE_LABEL], summaries[BASELINE_LABEL] = run(_with(cfg, condition__name=Baseline.name), fm=fm)
    else:
        console.print(f"matching baseline run: {found.path}")  # an earlier job's record: read, not recomputed
        folders[BASELINE_LABEL], summaries[BASELINE_LABEL] = found, found.read_summary()
    all_rows: dict[str, list[Row]] = {}
    for group, (_, exclude) in GROUPS.items():
        for cls, label in zip((InContext, Graft), PAIRS[group], strict=True):
            console.print(f"[bold]{label}[/]: library.exclude_self={str(exclude).lower()}")
            run_cfg = _with(cfg, condition__name=cls.name, library__exclude_self=exclude)
            folders[label], summaries[label], all_rows[label] = run_rows(
                run_cfg, RunFolder.new(runs, cls.name, group), fm=fm)
    pairings = {g: pair(all_rows[PAIRS[g][1]], all_rows[PAIRS[g][0]]) for g in GROUPS}

    # the manifest SHA-256 of each run binds comparison.json to exactly these runs (make rescore checks it)
    manifests = {label: f.read_manifest()["manifest_sha256"] for label, f in folders.items()}
    result = comparison(key, folders, summaries, pairings, manifests)
    d = c.decoding
    print_comparison(
        f"graft vs incontext vs baseline: {c.dataset.name}, {fm.name}, max_new_tokens={d.max_new_tokens}, "
        f"{d.strategy}, batch_size={d.batch_size}", result
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
    console.print(f"comparison: {out}; re-check it (every run and the pairing) with make rescore RUN={out.parent}")
    differing = [f"{PAIRS[g][1]} {why}" for g, p in pairings.items() for why in p.differences]
    if differing:
        shown = "; ".join(differing[:10]) + (f"; ... and {len(differing) - 10} more" if len(differing) > 10 else "")
        raise PairingError(
            f"{len(differing)} graft row(s) differ from their incontext twin (see {out}): {shown}. The graft must "
            "give exactly the in-context rows; run `make verify-graft` and report these rows"
        )
    return result


if __name__ == "__main__":
    main()
