"""The main job (`make aime-graft`): the runs the `compare` config lists (configs/compare/graft.yaml: graft vs its
in-context control vs the matching baseline, recurring and held-out, and any further condition), side by side.

    python -m harness.compare [overrides]      e.g. dataset.limit=5 decoding.max_new_tokens=32

1. builds the library if it is missing (library.*);
2. finds the newest complete baseline run with the same model, dataset, prompt, decoding and determinism
   settings (summary.json `comparable_key`) that re-scores (harness.record.audit), saying why it passes over any that
   do not, or runs it first;
3. runs every other listed run in order, each with its condition's config (configs/condition/<name>.yaml) and,
   for a library condition, its group: recurring (library.exclude_self=false: the library may hold the evaluated
   problem) or held-out (exclude_self=true: the evaluated problem never reaches the context);
4. computes the comparison in memory from the Summaries (harness.compare.plan.Plan: labels, order, pairs) and
   pairs every row of each `identical` pair with its twin
   (harness/compare/pairing.py: same completion token ids and first-logits SHA-256), prints it
   (harness/compare/views.py:
   narrow tables below 150 columns, the misses, a warning when the load average exceeded the cores), and writes it
   once to runs/compare/<stamp>/comparison.json with each run's manifest SHA-256, the load average before and after
   each run and the library's record (size, time this job spent opening or building it), plus per_problem.json
   (harness/compare/per_problem.py); MLflow gets it as the parent run of the five when tracking is on
   (harness.tracking.log);
   `python -m scripts.show_comparison runs/compare/<stamp>` re-prints it;
5. exits non-zero (PairingError, naming the rows) when any graft row differs from its twin.

A job killed part-way resumes when the same command runs again (issue 31, finding 10): the runs it finished are
listed in runs/compare/.unfinished-<key>.json (key: the job's resolved config) and are re-checked and taken, not
recomputed; the run it was inside resumes in its own folder from its rows (the run loop's resume); the file is
removed once comparison.json is written. run.fresh=true starts every run over. With MLflow unreachable the
comparison is logged later with `make log-run RUN=runs/compare/<stamp>` (scripts/log_run.py).

`make rescore RUN=runs/compare/<stamp>` re-audits every run it lists, checks they are the runs it was made from,
re-pairs them and recomputes every figure (harness.compare.audit.audit_comparison).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from harness.compare import per_problem
from harness.compare import views as comparison_view
from harness.compare.comparison import Comparison, JobLoad, LibraryRecord, RunLoad, comparison
from harness.compare.mlflow_runs import log_comparison
from harness.compare.pairing import pair
from harness.compare.plan import Plan
from harness.config.exact import print_note
from harness.config.identity import BATCH_DEPENDENT, RunIdentity
from harness.config.model import load_model
from harness.config.schema import compose_config, typed
from harness.errors import ConfigError, HarnessError, PairingError, RunFolderError, exit_on_error
from harness.library.build import open_library
from harness.record.audit import audit
from harness.record.folder import FinishedRun, RunFolder, claim, stamp
from harness.record.hashing import sha256_json, write_json
from harness.record.rows import Summary
from harness.run.conditions import Baseline, condition_class
from harness.run.loop import comparable_key, console, rows_depend_on_batch, run_rows
from harness.task.chat import chat_frame
from harness.task.problems import check_problem_sets
from harness.tracking.store import default_tracking_uri
from kvstore import enter_profile, recorded_kernel


def find_baseline(runs: Path, key: str, say: Callable[[str], None] = lambda _: None,
                  condition: str = Baseline.name, settings: dict[str, Any] | None = None) -> RunFolder | None:
    """The newest complete baseline run folder under `runs` whose comparable_key is `key` and that re-scores
    (harness.record.audit: every hash, row and figure of it re-checked); `say` is told why each other candidate is not
    reused. None when no candidate passes (the caller then runs a fresh baseline). `settings` (the backend's): a
    run of the batch-invariant mode made by another version of its kernel (kvstore.recorded_kernel; the comparable
    key, which runs made before keep, does not hold it) is not reused: its rows are another kernel's bits."""
    found = []
    for folder in RunFolder.find(runs):
        try:
            s = folder.read_summary()
        except Exception:  # noqa: BLE001 - an unreadable folder is simply not a match
            continue
        if s.condition == condition and s.comparable_key == key:
            found.append(folder)
    for folder in sorted(found, key=lambda f: f.file("manifest.json").stat().st_mtime, reverse=True):
        try:
            check = audit(folder)
        except HarnessError as exc:
            say(f"baseline {folder.path} not reused: {exc}")
            continue
        if check.ok:
            made, now = recorded_kernel(folder.read_manifest()["inputs"].get("determinism")), recorded_kernel(settings)
            if made != now and None not in (made, now):
                say(f"baseline {folder.path} not reused: computed by the mode's kernel {made}, this process runs {now}")
                continue
            return folder
        more = f" (and {len(check.findings) - 1} more finding(s))" if len(check.findings) > 1 else ""
        say(f"baseline {folder.path} not reused: it does not re-score: {check.findings[0]}{more}")
    return None


def with_changes(cfg: DictConfig, **changes: Any) -> DictConfig:
    """A copy of the composed config with `a__b=value` set as a.b (types and struct mode kept)."""
    c = copy.deepcopy(cfg)
    for dotted, value in changes.items():
        OmegaConf.update(c, dotted.replace("__", "."), value, merge=False)
    return c


def plan_of(c: Any) -> Plan:
    """The compare job's plan from the typed config, checked against the condition registry before the model
    loads: every listed condition exists, the baseline has no library, and a run has a group exactly when its
    condition uses the library (a ConfigError naming the compare key otherwise)."""
    plan = Plan.of_config(c.compare)
    for i, run in enumerate(plan.runs):
        key = "compare.baseline" if i == 0 else f"compare.runs[{i - 1}]"
        cls = condition_class(run.condition)
        if cls.uses_library != (run.group is not None):
            need = "needs a group: recurring or held-out" if cls.uses_library else "has no library, so no group"
            raise ConfigError(f"{key}: condition {run.condition} {need} (configs/compare/)")
    return plan


def _run_config(argv: list[str], cfg: DictConfig, condition: str, group: Any) -> DictConfig:
    """The config of one listed run: the job's overrides composed with its condition's config group (its own
    settings, configs/condition/<name>.yaml) and its group's library.exclude_self."""
    if condition == cfg.condition.name:
        run_cfg = cfg
    else:
        run_cfg = compose_config([*argv, f"condition={condition}"])
    return run_cfg if group is None else with_changes(run_cfg, library__exclude_self=group.value == "held_out")


def print_comparison(title: str, result: Comparison, misses: list[str] | None = None,
                     reprint: str | None = None) -> None:
    """Print the comparison to the terminal (harness/compare/views.py: narrow tables below 150 columns)."""
    comparison_view.print_comparison(title, result, misses=misses or (), console=console, reprint=reprint)


def comparison_title(summary: Summary, config: Any) -> str:
    """The title of the printed comparison: dataset, model and decoding settings."""
    d = config.decoding
    return f"{summary.dataset}, {summary.model} | {d.max_new_tokens} tokens | {d.strategy}, batch_size={d.batch_size}"


def _load() -> float:
    """The 1-minute load average, rounded."""
    return round(os.getloadavg()[0], 2)


def _library_record(lib: Any, seconds: float, built: bool, started_at: float) -> LibraryRecord:
    """What comparison.json records of the library: which, how big, and how long this job spent opening or
    building it (the job's own time; MLflow logs it as a nested run)."""
    m = lib.manifest
    size = 0
    for e in lib.entries:
        with contextlib.suppress(Exception):  # a missing artifact is the graft's error to raise, not this record's
            size += lib.store.info(e.artifact_id).size
    return LibraryRecord(name=m.get("name"), version=m.get("version"), path=str(lib.path), entries=len(lib.entries),
                         tokens=m.get("tokens_total"), bytes=size, built=built, seconds=round(seconds, 3),
                         started_at=started_at, manifest_sha256=m.get("manifest_sha256"))


def _job_params(c: Any, model: str, lib: Any, be: Any = None) -> dict[str, Any]:
    """The settings the comparison holds fixed, as the parent run's MLflow parameters: the backend among them
    (llama.cpp: its settings as backend.<key>, and the KV cache type as dtype)."""
    d = c.decoding
    params = {"dataset": c.dataset.name, "limit": c.dataset.limit, "model": model, "max_new_tokens": d.max_new_tokens,
              "strategy": d.strategy, "batch_size": d.batch_size, "n_samples": d.n_samples,
              "library": f"{lib.manifest.get('name')}-v{lib.manifest.get('version')}",
              "library_entries": len(lib.entries), "dtype": c.determinism.dtype,
              "backend": be.name if be is not None else c.model.backend}
    # None for transformers, as in the run's keys
    recorded = RunIdentity(be).backend_record() if be is not None else None
    if recorded is not None:
        params["dtype"] = be.dtype
        params.update({f"backend.{k}": v for k, v in recorded["settings"].items() if k != "backend"})
    return params


class Unfinished:
    """The runs an interrupted compare job finished: runs/compare/.unfinished-<key>.json, label -> folder and load.
    Read by the same job run again (same resolved config), which takes each run that still re-checks."""

    def __init__(self, runs: Path, cfg: DictConfig) -> None:
        config = OmegaConf.to_container(cfg, resolve=True)
        fresh = bool(config.get("run", {}).pop("fresh", False)) if isinstance(config, dict) else False
        self.path = runs / "compare" / f".unfinished-{sha256_json(config)[:16]}.json"
        self.runs: dict[str, Any] = {}
        if not fresh and self.path.is_file():
            with contextlib.suppress(OSError, ValueError):
                self.runs = dict(json.loads(self.path.read_text(encoding="utf-8")).get("runs", {}))

    def finished(self, label: str) -> tuple[RunFolder, RunLoad] | None:
        """The folder of `label` the interrupted job finished, when it is complete and re-scores; else None."""
        got = self.runs.get(label)
        if not isinstance(got, dict) or not isinstance(got.get("path"), str):
            return None
        folder = RunFolder(got["path"])
        try:
            if not (folder.is_complete() and audit(folder).ok):
                return None
        except HarnessError:
            return None
        load = got.get("load") or [None, None]
        return folder, RunLoad(load[0], load[1])

    def record(self, label: str, folder: RunFolder, load: RunLoad) -> None:
        self.runs[label] = {"path": str(folder.path.absolute()), "load": [load.start, load.end]}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_json(self.path, {"runs": self.runs})

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


@exit_on_error
def main(argv: list[str] | None = None) -> Comparison:
    """Run the compare job with Hydra overrides `argv` (default: the command line); return the comparison."""
    argv = sys.argv[1:] if argv is None else list(argv)
    notes: list[str] = []
    cfg = compose_config(argv, notes=notes)
    c = typed(cfg)
    plan = plan_of(c)
    enter_profile(c.determinism.profile)  # re-executes with the profile's kernel variables when not set
    for note in notes:
        print_note(note)  # the exact default's one line (harness.config.exact), once, after any re-execution
    exact_default = notes[0] if notes else None  # and recorded in each run this job computes
    root = Path(c.project_root)
    runs = root / c.runs_dir
    check_problem_sets(c, root)  # a missing or bad problem file refuses here, before the model and the library
    be = load_model(c)
    if plan.pairs and rows_depend_on_batch(be, c.run.in_flight):
        raise ConfigError(
            f"run.in_flight={c.run.in_flight} on the {be.name} backend: its rows depend on what shares the batch "
            f"({BATCH_DEPENDENT}), so a graft row and its in-context twin would not be computed under the same "
            "schedule and the twin check could not be made; use run.in_flight=1, or determinism.batch_invariant=true "
            "where the backend offers it")
    t_lib, wall_lib = time.perf_counter(), time.time()
    lib = open_library(c.library, be, root, build_if_missing=True, chat=chat_frame(be, c.model.chat))
    built = (lib.path / "manifest.json").stat().st_mtime >= wall_lib - 1
    library = _library_record(lib, time.perf_counter() - t_lib, built, wall_lib)
    console.print(
        f"library {lib.manifest['name']} v{lib.manifest['version']}: {len(lib.entries)} verified entries "
        f"({lib.manifest['tokens_total']} tokens of KV) in {lib.path}"
    )

    key = comparable_key(c, be)
    uri = c.tracking.uri or default_tracking_uri(runs.resolve())
    records: dict[str, FinishedRun] = {}
    run_ids: dict[str, str | None] = {}
    loads: dict[str, RunLoad] = {}
    base = plan.baseline
    found = find_baseline(runs, key, condition=base, say=lambda why: console.print(f"[yellow]{why}[/]"),
                          settings=be.settings())
    if found is None:
        console.print(f"[bold]no matching {base} run that re-scores: running the {base} first[/]")
        start = _load()
        records[base], run_ids[base] = run_rows(_run_config(argv, cfg, base, None), be=be,
                                                exact_default=exact_default)
        loads[base] = RunLoad(start, _load())
    else:
        console.print(f"matching {base} run: {found.path}")  # an earlier job's record: read, not recomputed
        records[base] = found.finished()
        with contextlib.suppress(RunFolderError):
            tracked = found.read_tracking()  # the earlier job's MLflow run, nested under this one when in its store
            if tracked.get("tracking_uri") == uri:
                run_ids[base] = tracked.get("run_id")
    unfinished = Unfinished(runs, cfg)
    for run in plan.runs[1:]:
        exclude = None if run.group is None else run.group.value == "held_out"
        console.print(f"[bold]{run.label}[/]" + ("" if exclude is None else
                      f": library.exclude_self={str(exclude).lower()}"))
        done = unfinished.finished(run.label)
        if done is not None:  # finished by this job's interrupted attempt: re-checked above, not recomputed
            console.print(f"{run.label}: finished by the interrupted attempt of this job, re-scores: {done[0].path}")
            records[run.label], loads[run.label] = done[0].finished(), done[1]
            with contextlib.suppress(RunFolderError):
                tracked = done[0].read_tracking()
                if tracked.get("tracking_uri") == uri:
                    run_ids[run.label] = tracked.get("run_id")
            continue
        start = _load()
        # an interrupted attempt's partial folder of this run (same resume key) is resumed, not orphaned
        records[run.label], run_ids[run.label] = run_rows(
            _run_config(argv, cfg, run.condition, run.group),
            RunFolder.new(runs, run.condition, run.group.value if run.group else None), be=be,
            resume_from=runs / run.condition, exact_default=exact_default)
        loads[run.label] = RunLoad(start, _load())
        unfinished.record(run.label, records[run.label].folder, loads[run.label])
    folders = {k: r.folder for k, r in records.items()}
    summaries = {k: r.summary for k, r in records.items()}
    all_rows = {k: r.rows for k, r in records.items()}
    pairings = {k: pair(all_rows[first], all_rows[twin]) for k, (first, twin) in plan.pairs.items()}

    # the manifest SHA-256 of each run binds comparison.json to exactly these runs (make rescore checks it)
    manifests = {label: r.manifest["manifest_sha256"] for label, r in records.items()}
    result = dataclasses.replace(comparison(key, folders, summaries, pairings, manifests, plan),
                                 load=JobLoad(os.cpu_count(), loads), library=library)
    table = per_problem.per_problem({k: all_rows[k] for k in folders if k in all_rows},
                                    per_problem.entry_answers(lib.entries), plan)
    out = claim(runs / "compare", stamp()) / "comparison.json"  # created exclusively: never shared with another job
    # each run's path relative to the compare folder: a copy or move of runs/ re-checks its own runs (make rescore)
    links = {k: os.path.relpath(f.path.absolute(), out.parent.absolute()) for k, f in folders.items()}
    result = dataclasses.replace(result, run_links=links)
    print_comparison(comparison_title(summaries[base], c), result, per_problem.misses(table, plan),
                     reprint=f"python -m scripts.show_comparison {out.parent}")
    write_json(out, result.to_json())
    write_json(out.parent / per_problem.PER_PROBLEM, {"rows": table})
    unfinished.remove()
    if c.tracking.enabled:
        try:
            run_id = log_comparison(out, result, tracking_uri=uri, experiment=c.tracking.experiment,
                                    per_problem=table, params=_job_params(c, be.model_name, lib, be),
                                    reused=[base] if found is not None else [], records=records,
                                    run_ids={k: v for k, v in run_ids.items() if v})
            RunFolder(out.parent).write_tracking({"run_id": run_id, "tracking_uri": uri})
            console.print(f"MLflow: comparison logged as run {run_id} in {uri}; `make mlflow-ui` prints the address of "
                          "the runs table with the headline columns (newest first)")
        except Exception as exc:  # noqa: BLE001 - tracking never loses the job; comparison.json is written
            warnings.warn(f"MLflow logging of {out} failed ({type(exc).__name__}: {exc}); log it later with "
                          f"make log-run RUN={out.parent}", RuntimeWarning, stacklevel=1)
    console.print(f"comparison: {out}; re-check it (every run and the pairing) with make rescore RUN={out.parent}")
    differing = [f"{plan.pairs[k][0]} {why}" for k, p in pairings.items() for why in p.differences]
    if differing:
        shown = "; ".join(differing[:10]) + (f"; ... and {len(differing) - 10} more" if len(differing) > 10 else "")
        raise PairingError(
            f"{len(differing)} row(s) differ from their twin (see {out}): {shown}. The graft must "
            "give exactly the in-context rows; run `make verify-graft` and report these rows"
        )
    empty = [plan.pairs[k][0] for k, p in pairings.items() if p.grafted == 0]
    if empty:
        raise PairingError(f"{', '.join(empty)}: no row grafted anything, so its twin check proves nothing (see "
                           f"{out}); check the library and retrieval (library.retrieval=none grafts nothing)")
    return result


if __name__ == "__main__":
    main()
