"""MLflow runs over several run folders: the compare job's parent run (`log_comparison`: its figures, summary page,
plots and per-problem table, the runs it compares nested under it, the library it opened or built as a nested
run, the experiment's shared headline view) and a sweep's report run (`log_report`). harness.tracking.log re-exports
them; one run folder is logged by harness.tracking.log.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.compare.comparison import Comparison, LibraryRecord
from harness.errors import RunFolderError
from harness.record.folder import FinishedRun, RunFolder
from harness.record.rows import budget_label, budget_of
from harness.tracking import views as run_view
from harness.tracking.mlflow_run import log_finished_run as _log
from harness.tracking.store import http_fail_fast, retry_locked, scalar_text

if TYPE_CHECKING:
    import pandas as pd
    from mlflow import MlflowClient

__all__ = ["comparison_metrics", "log_comparison", "log_report", "run_metrics"]


def comparison_metrics(comparison: Comparison) -> dict[str, float]:
    """The compare parent run's metrics, under short names: per run ``<run>.accuracy`` (with ``_ci_low`` /
    ``_ci_high``), ``<run>.maj_at_<k>``, ``<run>.overlong_rate``, ``<run>.decode_tokens_per_problem``,
    ``<run>.ttft_s_per_row``; factors named by what they
    divide (``baseline_over_graft_recurring_decode_tokens``, ``incontext_over_graft_held_out_ttft``); per group
    ``<group>.identical_rows`` (k) and ``<group>.paired_rows`` (n); the highest load average seen. The rest of
    comparison.json is its artifact."""
    out: dict[str, Any] = {}
    for label, s in comparison.summaries.items():
        slug, sc = _slug(label), s.scores
        n = max(sc.n_rows, 1)
        out.update({f"{slug}.accuracy": sc.accuracy, f"{slug}.accuracy_ci_low": sc.accuracy_ci_low,
                    f"{slug}.accuracy_ci_high": sc.accuracy_ci_high,
                    f"{slug}.decode_tokens_per_problem": s.tokens.decode / n,
                    f"{slug}.ttft_s_per_row": (s.time.ttft_s or 0.0) / n})
        if sc.maj() is not None:  # majority vote over k samples; "@" is not MLflow-safe
            out[f"{slug}.maj_at_{sc.maj()[0]}"] = sc.maj()[1]
        if sc.overlong_rate is not None:
            out[f"{slug}.overlong_rate"] = sc.overlong_rate
        c = s.comparison
        if c is not None:
            for value, what in ((c.token_reduction, "decode_tokens"), (c.ttft_factor, "ttft"),
                                (c.wall_factor, "wall"), (c.cpu_factor, "cpu"), (c.energy_factor, "energy")):
                out[f"baseline_over_{slug}_{what}"] = value
    for group, p in (comparison.pairs or {}).items():
        out[f"{group}.identical_rows"] = p.pairing.identical
        out[f"{group}.paired_rows"] = p.rows
        for key, value in (p.graft_vs_incontext.to_json() if p.graft_vs_incontext else {}).items():
            out[f"incontext_over_graft_{group}_{key.removesuffix('_factor')}"] = value
    highest = comparison.load.highest if comparison.load else None
    if highest:
        out["load_average_max"] = highest[0]
    return {k: float(v) for k, v in out.items() if isinstance(v, int | float) and not isinstance(v, bool)}


def _comparison_note(comparison: Comparison, dataset: str | None, model: str | None, page_link: str) -> str:
    """The parent run's description: the figures themselves, the factor directions, and the summary page link."""
    from harness.compare.views import load_warning

    first = next(iter(comparison.summaries.values()), None)
    size = f" ({first.scores.n_problems} problems)" if first else ""
    lines = [f"**graft vs incontext vs baseline** on `{dataset}`{size} with `{model}`. Twin: rows identical to the "
             "other run of its pair. Factors: baseline / run (above 1: the run reads fewer tokens or answers sooner).",
             "", "| run | accuracy [95% CI] | twin identical | baseline/run prefill | baseline/run TTFT | "
             "decode tok/problem |", "|---|---|---|---|---|---|"]
    extra = run_metrics(comparison)
    for label, s in comparison.summaries.items():
        sc, n, m = s.scores, max(s.scores.n_rows, 1), extra[label]
        twin = f"{m['twin.identical_rows']:.0f}/{m['twin.paired_rows']:.0f}" if m["twin.paired_rows"] else "-"
        factors = [f"{m[k]:.2f}" if k in m else "n/a" for k in ("baseline/run prefill", "baseline/run ttft")]
        lines.append(f"| {label} | {sc.accuracy:.3f} [{sc.accuracy_ci_low:.3f}, {sc.accuracy_ci_high:.3f}] "
                     f"| {twin} | {' | '.join(factors)} | {s.tokens.decode / n:.1f} |")
    lines.append("")
    for group, p in (comparison.pairs or {}).items():
        lines.append(f"- {group}: {p.pairing.identical}/{p.rows} graft rows identical to their in-context twin")
    warning = load_warning(comparison)
    if warning:
        lines.append(f"- **{warning}**")
    experiment_id = page_link.split("/")[2]  # "#/experiments/<id>/runs/..."
    lines += ["", f"[Summary page (table, misses, per-problem view, plots)]({page_link}); "
              f"[runs table with the headline columns]({run_view.view_url(experiment_id)}); per-problem table "
              "`per_problem_table.json`; every figure in `comparison.json`."]
    return "\n".join(lines)


def run_metrics(comparison: Comparison) -> dict[str, dict[str, float]]:
    """What the compare job adds to each run it compares (label -> metrics), so that every row of the headline
    view (``harness.tracking.views.HEADLINE_COLUMNS``) carries every column under one name: ``twin.identical_rows``
    and ``twin.paired_rows`` (k of n rows identical to the run's twin in its pair, for both runs of the pair; 0 of 0
    for a run in no pair), ``baseline/run prefill``, ``baseline/run ttft``, ``baseline/run decode`` (the baseline
    over this run: above 1, this run reads fewer prefill tokens, answers sooner, decodes fewer tokens; 1 for the
    baseline itself)."""
    folders = {str(Path(f)): label for label, f in comparison.runs.items()}
    twins: dict[str, tuple[int, int]] = {}
    for p in (comparison.pairs or {}).values():
        for folder in (p.graft_run, p.incontext_run):
            if str(Path(folder)) in folders:
                twins[folders[str(Path(folder))]] = (p.pairing.identical, p.rows)
    out: dict[str, dict[str, float]] = {}
    for label, s in comparison.summaries.items():
        c = s.comparison
        k, n = twins.get(label, (0, 0))
        factors = {"prefill": 1.0, "ttft": 1.0, "decode": 1.0} if c is None else {
            "prefill": c.prefill_factor, "ttft": c.ttft_factor, "decode": c.token_reduction}
        out[label] = {"twin.identical_rows": float(k), "twin.paired_rows": float(n),
                      **{f"baseline/run {what}": round(float(v), 3) for what, v in factors.items() if v is not None}}
    return out


def _share_view(client: MlflowClient, experiment_id: str) -> None:
    """Write the headline view's state, and list flat the runs that jobs logged before this view nested under
    their compare parent (or sweep report): a nested run hides under a parent row whose headline columns are "-"."""
    import json

    for job, link in (("compare", "compare_run"), ("report", "report_run")):
        for parent in client.search_runs([experiment_id], f"tags.job = '{job}'", max_results=1000):
            pid = parent.info.run_id
            for old in client.search_runs([experiment_id], f"tags.mlflow.parentRunId = '{pid}'", max_results=1000):
                if old.data.tags.get("job") == "library":
                    continue
                retry_locked(lambda old=old, pid=pid, link=link: client.set_tag(old.info.run_id, link, pid), "link")
                retry_locked(lambda old=old: client.delete_tag(old.info.run_id, "mlflow.parentRunId"), "unnest run")

    retry_locked(lambda: client.set_experiment_tag(experiment_id, f"mlflow.sharedViewState.{run_view.VIEW_KEY}",
                                                   json.dumps(run_view.view_state())), "share the headline view")


def log_comparison(path: Path, comparison: Comparison, *, tracking_uri: str, experiment: str,
                   per_problem: list[dict[str, Any]] | None = None, params: dict[str, Any] | None = None,
                   reused: Sequence[str] = (), records: Mapping[str, FinishedRun] | None = None,
                   run_ids: Mapping[str, str] | None = None) -> str:
    """Log the compare job's comparison (written at `path`) as the parent run of the runs it compares.

    Named ``compare | <dataset> n=<problems> | <model> | <date> <hh:mm> | accuracy <run> <acc>, ...; twins
    identical <k/n> ...`` (the answer is the page's first line); its params are the settings the comparison holds
    fixed (`params`: dataset,
    limit, model, decoding, library); metrics :func:`comparison_metrics`; its description the figures with a
    link to ``summary.html`` (harness/compare/summary_page.py), logged with the plots (``harness.compare.plots``),
    comparison.json
    and the per-problem table (`per_problem`, default: ``per_problem.json`` beside `path`) as
    ``per_problem_table.json``. The library the job opened or built (comparison.json ``library``) is a nested
    run ``library <name> v<version>`` with its time, entries, tokens and bytes. The parent's span is its own
    runs' and the library's; `reused` names the runs the job took from an earlier job (a matching baseline),
    which are not part of it. Each compared run logged to this store gets the tag ``compare_run`` = this run, a
    "Compared in" link at the end of its description, and :func:`run_metrics` (not ``mlflow.parentRunId``: nested
    runs hide under a parent row whose headline columns are "-"; the headline view lists them flat).
    The compare job gives the records of its runs (`records`: label -> FinishedRun) and their MLflow run ids
    (`run_ids`), so nothing is read back; without them (a later re-log) each folder is read after it re-checks (a
    RunFolderError naming the first difference otherwise), its run id from its ``tracking.json``. Returns the run id."""
    from harness.compare import per_problem as pp
    from harness.compare.plots import comparison_plots
    from harness.compare.summary_page import SUMMARY_PAGE, write_summary_page

    path = Path(path)
    folders = {label: RunFolder(p) for label, p in comparison.runs.items()}
    if records is None:  # a later re-log: each run re-checked first (harness.record.audit.audited), never as found
        from harness.record.audit import audited

        records = {label: audited(folder, "MLflow logging of the comparison") for label, folder in folders.items()}
    if run_ids is None:
        tracked = {label: folder.read_tracking() for label, folder in folders.items()}
        run_ids = {k: t["run_id"] for k, t in tracked.items()
                   if t.get("run_id") and t.get("tracking_uri") == tracking_uri}
    children = list(run_ids.values())
    summaries = {k: r.summary for k, r in records.items()}
    rows = {k: r.rows for k, r in records.items()}
    if per_problem is None:
        with contextlib.suppress(OSError, ValueError, RunFolderError):
            per_problem = RunFolder(path.parent).read_json(pp.PER_PROBLEM).get("rows")
    table = per_problem or []
    first = next(iter(summaries.values()), None)
    datasets = []  # the problem set all compared runs share (same comparable key), so the parent row shows it
    if records:
        r = next(iter(records.values()))
        datasets = [run_view.dataset_input(r.config, r.summary, r.manifest, r.problems)]
    model, dataset = (first.model, first.dataset) if first else (None, None)
    times = {k: run_view.run_times_ms(folders[k], s) for k, s in summaries.items()}
    end_ms = int(path.stat().st_mtime * 1000)
    # the job's span: its own runs; a run it reused from an earlier job (`reused`: labels) is not part of it
    starts = [t[0] for k, t in times.items() if k not in reused] or [end_ms]
    library = comparison.library
    if library is not None and library.started_at:
        starts.append(int(float(library.started_at) * 1000))  # the job's time includes the library build
    plots = comparison_plots(rows, comparison, path.parent)
    misses = pp.misses(table, comparison.plan)
    title = f"graft vs incontext vs baseline: {dataset}, {model}"
    page = write_summary_page(path.parent / SUMMARY_PAGE, title, comparison, table, misses, plots)
    tags = {"job": "compare", "condition": "compare", "comparable_key": comparison.comparable_key,
            "model": model, "dataset": dataset, "run_dir": str(path.parent.resolve()),
            **{f"run.{_slug(k)}": v for k, v in comparison.runs.items()}}

    def adopt(client: MlflowClient, experiment_id: str, run_id: str) -> None:
        link = run_view.run_url(experiment_id, run_id, f"/artifacts/{SUMMARY_PAGE}")
        retry_locked(lambda: client.set_tag(run_id, "mlflow.note.content", _comparison_note(comparison, dataset, model,
                                                                                      link)), "describe run")
        for child in children:  # linked, not nested: the headline view lists them flat (views.view_state)
            retry_locked(lambda child=child: client.set_tag(child, "compare_run", run_id), "link run")
            tags = client.get_run(child).data.tags
            if "mlflow.parentRunId" in tags:  # a run reused from a job logged before runs were listed flat
                retry_locked(lambda child=child: client.delete_tag(child, "mlflow.parentRunId"), "unnest run")
            note = tags.get("mlflow.note.content", "").split("\n\nCompared in ")[0]
            note += f"\n\nCompared in [{name}]({run_view.run_url(experiment_id, run_id)})"
            retry_locked(lambda child=child, note=note: client.set_tag(child, "mlflow.note.content", note), "link run")
        _log_run_metrics(client, {run_ids[k]: v for k, v in run_metrics(comparison).items() if k in run_ids})
        if library is not None:
            _log_library(library, run_id, tracking_uri=tracking_uri, experiment=experiment)
        _share_view(client, experiment_id)

    size = f" n={first.scores.n_problems}" if first else ""
    budget = budget_label(budget_of(next(iter(records.values())).config)) if records else None
    name = " | ".join(p for p in ("compare", f"{dataset}{size}", str(model), budget, _stamp(path.parent.name),
                                  _headline(comparison)) if p)
    with http_fail_fast(tracking_uri):
        return _log(tracking_uri, experiment, name, tags={k: scalar_text(v) for k, v in tags.items() if v is not None},
                    params={k: scalar_text(v) for k, v in (params or {}).items() if v is not None},
                    metrics=comparison_metrics(comparison),
                    files=[(path, None), (page, None), *((p, "plots") for p in plots)],
                    times_ms=(min([*starts, end_ms]), end_ms), datasets=datasets, table=pp.columns_of(table),
                    table_file=pp.TABLE_FILE, then=adopt)


def _log_library(library: LibraryRecord, parent_run_id: str, *, tracking_uri: str, experiment: str) -> str:
    """The library the compare job opened or built, as a run nested under the job: ``library <name> v<version>``
    with its real start and duration, metrics seconds, entries, tokens, bytes; tags built, path, manifest."""
    lib = library
    start = int(float(lib.started_at or time.time()) * 1000)
    end = start + int(1000 * float(lib.seconds or 0.0))
    what = "built" if lib.built else "opened (already built)"
    note = (f"**library {lib.name} v{lib.version}** {what} by the compare job in {lib.seconds} s: {lib.entries} "
            f"verified entries, {lib.tokens} tokens of KV, {(lib.bytes or 0) / 1e6:.1f} MB in the store. "
            f"Folder `{lib.path}`.")
    tags = {"job": "library", "condition": "library", "mlflow.parentRunId": parent_run_id, "mlflow.note.content": note,
            "built": str(bool(lib.built)).lower(), "library_dir": lib.path,
            "library_manifest_sha256": lib.manifest_sha256}
    metrics = {"seconds": lib.seconds, "entries": lib.entries, "tokens": lib.tokens, "bytes": lib.bytes,
               "build_s" if lib.built else "open_s": lib.seconds}
    return _log(tracking_uri, experiment, f"library {lib.name} v{lib.version}",
                tags={k: scalar_text(v) for k, v in tags.items() if v is not None}, params={},
                metrics={k: v for k, v in metrics.items() if v is not None}, files=[], times_ms=(start, end))


def log_report(root: Path, table: pd.DataFrame, files: Sequence[Path], *, tracking_uri: str, experiment: str) -> str:
    """Log a sweep report (``harness.compare.report``) as a run ``report <folder>`` over the sweep: the jobs logged to
    this store are tagged ``report_run`` = its id (not nested: each job stays a row of the headline view, with its
    headline columns), its span is theirs (first start to now), its metrics each job's headline figures
    (``job_<n>.accuracy``, ``job_<n>.ci_low`` ...), its description their table; the table as
    ``report_table.json`` (an MLflow table), its files as artifacts. Returns the run id."""
    root = Path(root).resolve()
    metrics: dict[str, Any] = {"jobs": len(table)}
    children, spans, lines = [], [], []
    for record in table.to_dict("records"):
        job = str(record["run"])
        num = job.split("_", 1)[0]
        key = f"job_{num}" if num.isdigit() else _slug(job)
        for name in ("accuracy", "ci_low", "ci_high", "decode_per_attempt", "wall_per_attempt_s"):
            metrics[f"{key}.{name}"] = record.get(name)
        lines.append(f"| {job} | {record.get('accuracy', 0):.3f} [{record.get('ci_low', 0):.3f}, "
                     f"{record.get('ci_high', 0):.3f}] | {record.get('decode_per_attempt', 0):.1f} |")
        folder = RunFolder(root / job)
        with contextlib.suppress(RunFolderError, OSError):
            spans.append(run_view.run_times_ms(folder, folder.read_summary()))
            tracked = folder.read_tracking()
            if tracked.get("run_id") and tracked.get("tracking_uri") == tracking_uri:
                children.append(tracked["run_id"])
    note = "\n".join([f"**Report** over the {len(table)} jobs under `{root}` (tagged `report_run`): accuracy with 95% "
                      "intervals and decode tokens per attempt; the rest in `report_table.json`, `report.csv` and the "
                      "plots.", "", "| job | accuracy [95% CI] | decode tokens / attempt |", "|---|---|---|", *lines])
    tags = {"job": "report", "condition": "report", "run_dir": str(root), "mlflow.note.content": note}

    def adopt(client: MlflowClient, experiment_id: str, run_id: str) -> None:
        for child in children:  # linked, not nested: the headline view lists each job as a row
            retry_locked(lambda child=child: client.set_tag(child, "report_run", run_id), "link run")

    end = int(time.time() * 1000)
    times = (min(s for s, _ in spans), max(max(e for _, e in spans), end)) if spans else None
    with http_fail_fast(tracking_uri):
        return _log(tracking_uri, experiment, f"report {root.name}", tags=tags, params={},
                    metrics={k: v for k, v in metrics.items() if v is not None}, files=[(Path(f), None) for f in files],
                    table=table, table_file="report_table.json", times_ms=times, then=adopt)


def _log_run_metrics(client: MlflowClient, metrics: Mapping[str, Mapping[str, float]]) -> None:
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    for run_id, values in metrics.items():
        batch = [Metric(k, v, now, 0) for k, v in values.items()]
        retry_locked(lambda run_id=run_id, batch=batch: client.log_batch(run_id, metrics=batch), "log run metrics")


def _headline(comparison: Comparison) -> str:
    """The answer in a few words, for the parent's name (the first line of its page, above MLflow's tags):
    each run's accuracy, then each pair's identical rows: "baseline 0.000, graft recurring 1.000, ... twins 40/40"."""
    runs = [f"{re.sub(r'[()]', '', label)} {s.scores.accuracy:.3f}" for label, s in comparison.ordered().items()]
    twins = [f"{p.pairing.identical}/{p.rows}" for p in (comparison.pairs or {}).values()]
    return "accuracy " + ", ".join(runs) + (f"; twins identical {' '.join(twins)}" if twins else "")


def _stamp(folder_name: str) -> str:
    """A compare folder's stamp as a date and minute: "2026-12-01_11-18-46-620551" -> "2026-12-01 11:18"."""
    m = re.match(r"(\d{4}-\d{2}-\d{2})_(\d{2})-(\d{2})", folder_name)
    return f"{m[1]} {m[2]}:{m[3]}" if m else folder_name


def _slug(label: str) -> str:
    """A run label as a metric prefix: "graft (held-out)" -> "graft_held_out"."""
    return re.sub(r"\W+", "_", label).strip("_")


