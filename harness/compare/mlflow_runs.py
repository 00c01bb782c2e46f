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
from harness.tracking import views as run_view
from harness.tracking.mlflow_run import log_finished_run as _log
from harness.tracking.store import http_fail_fast, retry_locked, scalar_text

if TYPE_CHECKING:
    import pandas as pd
    from mlflow import MlflowClient

__all__ = ["HEADLINE_COLUMNS", "VIEW_KEY", "comparison_metrics", "log_comparison", "log_report", "view_url"]


def comparison_metrics(comparison: Comparison) -> dict[str, float]:
    """The compare parent run's metrics, under short names: per run ``<run>.accuracy`` (with ``_ci_low`` /
    ``_ci_high``), ``<run>.decode_tokens_per_problem``, ``<run>.ttft_s_per_row``; factors named by what they
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

    lines = [f"**graft vs incontext vs baseline** on `{dataset}` with `{model}`. Factors: baseline / run "
             "(above 1: the run is faster or needs fewer tokens).", "",
             "| run | accuracy [95% CI] | decode tok/problem | TTFT s/row | baseline/run TTFT |",
             "|---|---|---|---|---|"]
    for label, s in comparison.summaries.items():
        sc, n = s.scores, max(s.scores.n_rows, 1)
        f = s.comparison.ttft_factor if s.comparison else None
        lines.append(f"| {label} | {sc.accuracy:.3f} [{sc.accuracy_ci_low:.3f}, {sc.accuracy_ci_high:.3f}] "
                     f"| {s.tokens.decode / n:.1f} | {(s.time.ttft_s or 0.0) / n:.3f} | "
                     f"{'-' if s.comparison is None else ('n/a' if f is None else f'{f:.2f}')} |")
    lines.append("")
    for group, p in (comparison.pairs or {}).items():
        lines.append(f"- {group}: {p.pairing.identical}/{p.rows} graft rows identical to their in-context twin")
    warning = load_warning(comparison)
    if warning:
        lines.append(f"- **{warning}**")
    experiment_id = page_link.split("/")[2]
    lines += ["", f"[Summary page (table, misses, per-problem view, plots)]({page_link}); "
              f"[runs table with the headline columns]({view_url(experiment_id)}); per-problem table "
              "`per_problem_table.json`; every figure in `comparison.json`."]
    return "\n".join(lines)


#: The experiment's shared runs-table view (MLflow 3's "share view": an experiment tag
#: ``mlflow.sharedViewState.<key>`` holding the UI state as JSON, opened with ``?viewStateShareKey=<key>``): the
#: headline metrics as columns, newest first, the compare parent expanded to its nested runs.
VIEW_KEY = "kvgraft-headline"
HEADLINE_COLUMNS = ("accuracy", "accuracy_ci_low", "accuracy_ci_high", "decode_tokens_per_problem", "ttft_s_per_row",
                    "recurring.identical_rows", "recurring.paired_rows", "held_out.identical_rows",
                    "held_out.paired_rows")


def view_url(experiment_id: str) -> str:
    """The runs table in the shared headline view (a UI fragment: append it to the server's address)."""
    return f"#/experiments/{experiment_id}/runs?viewStateShareKey={VIEW_KEY}&workflowType=machine_learning"


def _share_view(client: MlflowClient, experiment_id: str, parent_run_id: str) -> None:
    import json

    state = {"selectedColumns": [f"metrics.`{m}`" for m in HEADLINE_COLUMNS], "orderByKey": "attributes.start_time",
             "orderByAsc": False, "runsExpanded": {parent_run_id: True}}
    retry_locked(lambda: client.set_experiment_tag(experiment_id, f"mlflow.sharedViewState.{VIEW_KEY}",
                                                   json.dumps(state)), "share the headline view")


def log_comparison(path: Path, comparison: Comparison, *, tracking_uri: str, experiment: str,
                   per_problem: list[dict[str, Any]] | None = None, params: dict[str, Any] | None = None,
                   reused: Sequence[str] = (), records: Mapping[str, FinishedRun] | None = None,
                   run_ids: Mapping[str, str] | None = None) -> str:
    """Log the compare job's comparison (written at `path`) as the parent run of the runs it compares.

    Named ``compare <stamp>``; its params are the settings the comparison holds fixed (`params`: dataset,
    limit, model, decoding, library); metrics :func:`comparison_metrics`; its description the figures with a
    link to ``summary.html`` (harness/compare/summary_page.py), logged with the plots (``harness.compare.plots``),
    comparison.json
    and the per-problem table (`per_problem`, default: ``per_problem.json`` beside `path`) as
    ``per_problem_table.json``. The library the job opened or built (comparison.json ``library``) is a nested
    run ``library <name> v<version>`` with its time, entries, tokens and bytes. The parent's span is its own
    runs' and the library's; `reused` names the runs the job took from an earlier job (a matching baseline),
    which are not part of it. Each compared run logged to this store gets ``mlflow.parentRunId`` = this run.
    The compare job gives the records of its runs (`records`: label -> FinishedRun) and their MLflow run ids
    (`run_ids`), so nothing is read back; without them (a later re-log) each folder is read, its run id from its
    ``tracking.json``. Returns the run id."""
    from harness.compare import per_problem as pp
    from harness.compare.plots import comparison_plots
    from harness.compare.summary_page import SUMMARY_PAGE, write_summary_page

    path = Path(path)
    folders = {label: RunFolder(p) for label, p in comparison.runs.items()}
    if records is None:
        records = {}
        for label, folder in folders.items():
            with contextlib.suppress(RunFolderError):
                records[label] = folder.finished()
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
        link = f"#/experiments/{experiment_id}/runs/{run_id}/artifacts/{SUMMARY_PAGE}"
        retry_locked(lambda: client.set_tag(run_id, "mlflow.note.content", _comparison_note(comparison, dataset, model,
                                                                                      link)), "describe run")
        for child in children:
            retry_locked(lambda child=child: client.set_tag(child, "mlflow.parentRunId", run_id), "nest run")
        if library is not None:
            _log_library(library, run_id, tracking_uri=tracking_uri, experiment=experiment)
        _share_view(client, experiment_id, run_id)

    name = f"compare {path.parent.name[:19]}"
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
    this
    store nest under it, its span is theirs (first start to now), its metrics each job's headline figures
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
    note = "\n".join([f"**Report** over the {len(table)} jobs under `{root}` (nested below): accuracy with 95% "
                      "intervals and decode tokens per attempt; the rest in `report_table.json`, `report.csv` and the "
                      "plots.", "", "| job | accuracy [95% CI] | decode tokens / attempt |", "|---|---|---|", *lines])
    tags = {"job": "report", "condition": "report", "run_dir": str(root), "mlflow.note.content": note}

    def adopt(client: MlflowClient, experiment_id: str, run_id: str) -> None:
        for child in children:
            retry_locked(lambda child=child: client.set_tag(child, "mlflow.parentRunId", run_id), "nest run")

    end = int(time.time() * 1000)
    times = (min(s for s, _ in spans), max(max(e for _, e in spans), end)) if spans else None
    with http_fail_fast(tracking_uri):
        return _log(tracking_uri, experiment, f"report {root.name}", tags=tags, params={},
                    metrics={k: v for k, v in metrics.items() if v is not None}, files=[(Path(f), None) for f in files],
                    table=table, table_file="report_table.json", times_ms=times, then=adopt)


def _slug(label: str) -> str:
    """A run label as a metric prefix: "graft (held-out)" -> "graft_held_out"."""
    return re.sub(r"\W+", "_", label).strip("_")


