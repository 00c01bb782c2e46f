"""How a run folder appears in MLflow: its name, real start and end, description, tags, the problem set as a
dataset input and the per-problem outputs as a table. Pure functions of the folder's typed records (the
dataset entity imports mlflow lazily); ``harness.tracking.log`` logs what they return.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from harness.record import rows as record
from harness.record.folder import SUMMARY, RunFolder
from harness.record.hashing import sha256_json
from harness.record.rows import Group, Row, Summary

__all__ = ["HEADLINE_COLUMNS", "TABLE_FILE", "VIEW_KEY", "dataset_digest", "dataset_input", "headline_metrics",
           "outputs_table", "run_group", "run_name", "run_tags", "run_times_ms", "run_url", "view_state", "view_url"]

TABLE_FILE = "outputs_table.json"  # the per-problem outputs, an MLflow table (mlflow.log_table)
_MAX_DIGEST = 32  # MLflow keeps at most 36 characters of a dataset digest (MAX_DATASET_DIGEST_SIZE)


def _iso_ms(text: str | None) -> int | None:
    if not text:
        return None
    try:
        return int(datetime.fromisoformat(text).timestamp() * 1000)
    except ValueError:
        return None


def run_times_ms(folder: RunFolder, summary: Summary) -> tuple[int, int]:
    """The run's real start and end (ms since the epoch): summary.json ``started_at``/``finished_at``; for a
    folder written before those existed, summary.json's mtime and that minus ``time.run_wall_s``."""
    end = _iso_ms(summary.finished_at)
    if end is None:
        end = int(folder.file(SUMMARY).stat().st_mtime * 1000)
    start = _iso_ms(summary.started_at)
    if start is None:
        start = end - int(1000 * (summary.time.run_wall_s or 0.0))
    return start, max(start, end)


def run_group(summary: Summary, config: dict[str, Any]) -> str | None:
    """``recurring`` / ``held-out`` (the Group's label, harness.record.rows.run_group) for a condition with a library,
    else None."""
    group = record.run_group(summary, config)
    return None if group is None else group.label


def run_name(summary: Summary, group: str | None, folder: RunFolder, budget: int | None = None,
             config: dict[str, Any] | None = None) -> str:
    """What the runs table shows: what differs between runs, condition and group first so names differ in their
    first characters, then the problem set, its size, the model and the token budget (decoding.max_new_tokens: a
    score means little without it): ``graft recurring | aime n=40 | gemma-3-1b | 16 tokens``,
    ``baseline | aime n=40 | gemma-3-1b | 16 tokens``; with the run's `config`, a random-entry control says so
    (``graft held-out random entry | ...``, `harness.record.rows.run_label`); a sweep job adds its job name after
    the condition (it carries the swept values, ``configs/config.yaml`` ``hydra.sweep.subdir``):
    ``baseline #1 decoding.max_new_tokens=5 | ...``.
    The accuracy with its 95% interval ends the name, so the first column answers even where the metric columns are
    scrolled out of view: ``... | accuracy 0.875 [0.70, 0.96]``."""
    name = (record.run_label(summary, config) if config is not None
            else summary.condition + (f" {group}" if group else ""))
    job = _sweep_job(folder, summary.condition)
    sc = summary.scores
    parts = [f"{name} {job}" if job else name, f"{summary.dataset} n={sc.n_problems}", str(summary.model),
             record.budget_label(budget),
             f"accuracy {sc.accuracy:.3f} [{sc.accuracy_ci_low:.2f}, {sc.accuracy_ci_high:.2f}]"]
    return " | ".join(p for p in parts if p)


def _sweep_job(folder: RunFolder, condition: str) -> str | None:
    """A multirun job as ``#<number> <swept values>`` from its folder name (``<number>_<condition>_<overrides>``,
    older sweeps ``<number>_<condition>``), else None."""
    num, _, rest = folder.name.partition("_")
    if not num.isdigit() or not rest:
        return None
    overrides = rest.removeprefix(condition).lstrip("_")
    return f"#{num} {overrides}".strip()


def headline_metrics(summary: Summary) -> dict[str, float]:
    """The few figures a reviewer reads first, under short names: accuracy with its 95% interval, maj@k
    (``maj_at_<k>``) and the overlong rate, decode
    tokens per problem, TTFT and wall time per row (means, not sums), problems and rows; per group
    (``recurring.accuracy``) for conditions with a library. Everything else stays in ``summary.json``."""
    s, t, rows = summary.scores, summary.tokens, max(summary.scores.n_rows, 1)
    out: dict[str, float | None] = {
        "accuracy": s.accuracy, "accuracy_ci_low": s.accuracy_ci_low, "accuracy_ci_high": s.accuracy_ci_high,
        "n_problems": s.n_problems, "n_rows": s.n_rows, "decode_tokens_per_problem": t.decode / rows,
        "prefill_tokens_per_row": t.prefill / rows, "grafted_tokens_per_row": t.grafted / rows,
        "ttft_s_per_row": (summary.time.ttft_s or 0.0) / rows, "wall_s_per_row": summary.time.wall_s / rows,
        "run_wall_s": summary.time.run_wall_s,
        # an estimate never shares a metric with measured joules (the tag energy_status names its method)
        "energy_j" if summary.energy.measured else "energy_j_estimated": summary.energy.joules,
    }
    maj = s.maj()
    if maj is not None:
        out[f"maj_at_{maj[0]}"] = maj[1]  # majority vote over the samples (maj@k; "@" is not MLflow-safe)
    if s.overlong_rate is not None:
        out["overlong_rate"] = s.overlong_rate  # rows cut by the budget inside a reasoning trace
    for group, g in (summary.groups or {}).items():
        out[f"{group}.accuracy"] = g.accuracy
    # 4 decimals: MLflow's table prints every digit it is given (0.561506080449...), cut to the column's width
    return {k: round(float(v), 4) for k, v in out.items() if isinstance(v, int | float) and not isinstance(v, bool)}


#: The experiment's shared runs-table view (MLflow 3's "share view": an experiment tag
#: ``mlflow.sharedViewState.<key>`` holding the UI state as JSON, opened with ``?viewStateShareKey=<key>``): one row
#: per run that carries a headline (every condition run and sweep job; the compare parents, libraries and reports,
#: which carry other figures, are filtered out), newest first, these columns in this order, narrow enough that the
#: accuracy and twin columns fit beside MLflow's assistant panel (a fresh browser on 127.0.0.1 opens it once).
#: Every row carries every column: the compare job adds ``twin.*`` and ``baseline/run *`` to the runs it compares
#: (0 of 0 twins and factors of 1 for its baseline), so the newest job's answer fills the first screen with no "-".
VIEW_KEY = "kvgraft-headline"
HEADLINE_COLUMNS = ("accuracy", "accuracy_ci_low", "accuracy_ci_high", "twin.identical_rows", "twin.paired_rows",
                    "baseline/run prefill", "baseline/run ttft", "baseline/run decode")
_NAME_COLUMN = "attributes.`Run Name`"


def view_url(experiment_id: str) -> str:
    """The runs table in the shared headline view (a UI fragment: append it to the server's address). The
    ``workflowType`` parameter is what makes MLflow 3.17 show runs: its UI takes the workflow from the address,
    else from the browser's last choice (localStorage ``mlflow.workflowType``), else GenAI; the experiment's
    ``mlflow.experimentKind`` tag does not decide it."""
    return f"#/experiments/{experiment_id}/runs?viewStateShareKey={VIEW_KEY}&workflowType=machine_learning"


def run_url(experiment_id: str, run_id: str, page: str = "") -> str:
    """A run's page (`page`: e.g. ``/artifacts/summary.html``) in the runs workflow, as a UI fragment."""
    return f"#/experiments/{experiment_id}/runs/{run_id}{page}?workflowType=machine_learning"


def view_state() -> dict[str, Any]:
    """The shared view's UI state (what ``?viewStateShareKey`` restores): the rows that carry the headline
    columns, newest first; the run name and MLflow's created (which it keeps in place), then the headline columns."""
    metrics = [f"metrics.`{m}`" for m in HEADLINE_COLUMNS]
    return {"selectedColumns": metrics, "orderByKey": "attributes.start_time", "orderByAsc": False,
            "searchFilter": "metrics.accuracy >= 0",
            "columnOrder": [_NAME_COLUMN, "runDateAndNestInfo", *metrics, "duration"],
            # narrow: the run name's first words, then accuracy, its interval and the twins within ~750 px
            "columnWidths": {_NAME_COLUMN: 220, "runDateAndNestInfo": 100, **dict.fromkeys(metrics[:5], 78),
                             **dict.fromkeys(metrics[5:], 110)}}


def dataset_digest(manifest: dict[str, Any]) -> str:
    """The problem set's digest: SHA-256 over the manifest's ``inputs.problems`` (problem id -> row hash),
    cut to 32 hex characters because MLflow keeps at most 36 (the full hash is in the dataset's profile)."""
    return sha256_json((manifest.get("inputs") or {}).get("problems") or {})[:_MAX_DIGEST]


def dataset_input(config: dict[str, Any], summary: Summary, manifest: dict[str, Any], problems: list[dict]) -> Any:
    """The problem set as an MLflow ``DatasetInput`` (context ``evaluation``): name, digest, source, schema."""
    from mlflow.entities import Dataset, DatasetInput, InputTag

    d = config.get("dataset") if isinstance(config.get("dataset"), dict) else {}
    if d.get("path"):
        source_type, source = "local", {"uri": str(d["path"])}
    elif d.get("hub_id"):
        source_type, source = "hugging_face", {"path": d["hub_id"], "config_name": d.get("subset"),
                                               "split": d.get("split")}
    else:
        source_type, source = "code", {"uri": "problems.jsonl"}
    columns = sorted({k for p in problems for k in p})
    schema = {"mlflow_colspec": [{"type": "string", "name": k, "required": True} for k in columns]}
    full = sha256_json((manifest.get("inputs") or {}).get("problems") or {})
    profile = {"num_rows": len(problems), "problems_sha256": full}
    dataset = Dataset(name=summary.dataset, digest=dataset_digest(manifest), source_type=source_type,
                      source=json.dumps(source), schema=json.dumps(schema), profile=json.dumps(profile))
    return DatasetInput(dataset, tags=[InputTag("mlflow.data.context", "evaluation")])


def _retrieved(row: Row, key: str) -> Any:
    return None if row.completion.retrieval is None else getattr(row.completion.retrieval, key)


def outputs_table(rows: Sequence[Row]) -> dict[str, list[Any]]:
    """The per-problem outputs as columns (one entry per row of outputs.jsonl) for ``mlflow.log_table``."""
    columns: dict[str, Callable[[Row], Any]] = {
        "problem_id": lambda r: r.problem_id, "sample": lambda r: r.sample, "group": lambda r: r.group,
        "extracted": lambda r: r.extracted, "gold": lambda r: r.gold, "correct": lambda r: r.correct,
        "decode_tokens": lambda r: r.completion.decode_tokens, "grafted_tokens": lambda r: r.completion.grafted_tokens,
        "prefill_tokens": lambda r: r.completion.prefill_tokens, "ttft_s": lambda r: r.completion.ttft_s,
        "wall_s": lambda r: r.wall_s, "entry_id": lambda r: _retrieved(r, "entry_id"),
        "similarity": lambda r: _retrieved(r, "similarity"), "stop_reason": lambda r: r.completion.stop_reason,
        "completion": lambda r: r.completion.text,
    }
    return {name: [get(r) for r in rows] for name, get in columns.items()}


def _description(summary: Summary, group: str | None, config: dict[str, Any], folder: RunFolder) -> str:
    s, t = summary.scores, summary.tokens
    e = summary.energy
    lib = config.get("library") if isinstance(config.get("library"), dict) else {}
    lines = [
        f"**{summary.condition}{', ' + group if group else ''}** on `{summary.dataset}` "
        f"({s.n_problems} problems, {s.n_rows} attempts) with `{summary.model}`.",
        "",
        f"- accuracy {s.accuracy:.3f} (95% CI {s.accuracy_ci_low:.3f} - {s.accuracy_ci_high:.3f})",
        f"- tokens: decode {t.decode}, grafted {t.grafted}, prefill {t.prefill}",
        f"- time: {summary.time.wall_s:.1f} s wall over attempts ({summary.time.run_wall_s} s run)",
        f"- energy: {e.joules:.1f} J, {e.label}" if e.joules is not None else f"- energy: {e.label}",
    ]
    if group:
        lines.append(f"- library `{lib.get('name')}` v{lib.get('version')}, exclude_self={lib.get('exclude_self')}"
                     + (" (the evaluated problem never reaches the context)" if group == Group.HELD_OUT.label else ""))
        if record.group_note(summary):
            lines.append(f"- {record.group_note(summary)}")
    if summary.exactness:
        lines.append(f"- {summary.exactness}")
    if summary.exact_default:
        lines.append(f"- {summary.exact_default}")
    lines += ["", f"Run folder `{folder.path}`; re-check without the model: `make rescore RUN={folder.path}`. "
              f"Per-problem outputs: artifact `{TABLE_FILE}`; one trace per attempt."]
    return "\n".join(lines)


def run_tags(folder: RunFolder, summary: Summary, manifest: dict[str, Any], group: str | None,
          config: dict[str, Any]) -> dict[str, str]:
    inputs = manifest.get("inputs") or {}
    code = inputs.get("code") or {}
    library = inputs.get("library") or {}
    # the engine, as the manifest records it (determinism.backend; absent = transformers) and its version where the
    # backend records one under its own name (vllm: "0.32.0")
    det = inputs.get("determinism") if isinstance(inputs.get("determinism"), dict) else {}
    backend = det.get("backend", "transformers")
    version = det.get(backend) if isinstance(backend, str) and isinstance(det.get(backend), str) else None
    tags = {
        "condition": summary.condition,
        "group": group,
        "model": summary.model,
        "dataset": summary.dataset,
        "backend": backend,
        "backend_version": version,
        "library": f"{library['name']}-v{library['version']}" if library.get("name") else None,
        "comparable_key": summary.comparable_key,
        "model_fingerprint": inputs.get("model_fingerprint"),
        "tokenizer_fingerprint": inputs.get("tokenizer_fingerprint"),
        "git_commit": code.get("commit"),
        "git_dirty": code.get("dirty"),
        "mlflow.source.git.commit": code.get("commit"),
        "manifest_sha256": manifest.get("manifest_sha256"),
        "energy_status": summary.energy.status,
        "run_dir": str(folder.path),
        "mlflow.note.content": _description(summary, group, config, folder),
    }
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in tags.items() if v is not None}
