"""Per-attempt MLflow traces, built after the run from its rows (the run folder is the record).

One trace per row of ``outputs.jsonl`` (one attempt = one problem and sample), linked to the run
(``mlflow.sourceRun``) and placed in time where the attempt ran: attempts run one after another, so attempt
*i* starts at the run's ``started_at`` plus the wall time of the attempts before it. Spans:

- ``retrieve`` (graft rows with a library entry): entry id, artifact id, similarity, match. Its time is not
  recorded separately (it is inside the time to first token), so it is drawn with zero length;
- ``graft`` (grafted tokens > 0) or ``prefill``: from the attempt's start to its first token (``ttft_s``),
  attributes grafted / prefill / prompt tokens;
- ``decode``: from the first token to the end of the attempt (``wall_s``), attributes decode tokens and
  stop reason.

Without ``ttft_s`` the split between prefill and decode is unknown: the prefill span then has zero length and
carries ``timing="ttft not recorded"``. The score is attached to each trace as MLflow feedback ``correct``
(source CODE ``harness.task.answers.score``) and the gold answer as the expectation ``expected_answer``, so the
trace list and MLflow's evaluation views show real data. ``tracking.traces=false`` skips all of this.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

from harness.record.rows import Row

__all__ = ["SCORE_SOURCE", "log_traces", "span_plan"]

SCORE_SOURCE = "harness.task.answers.score"
_NS = 1_000_000_000


@contextlib.contextmanager
def _global_tracking_uri(uri: str) -> Iterator[None]:
    """MLflow's trace exporter and assessment API write to the *global* tracking URI: point it at `uri`
    for the duration, then restore the previous URI (and MLFLOW_TRACKING_URI) as they were."""
    import mlflow
    from mlflow.tracking._tracking_service import utils

    before_uri, before_env = utils._tracking_uri, os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(before_uri)  # type: ignore[arg-type]  # None restores "unset"
        if before_env is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = before_env


def span_plan(row: Row, start_ns: int) -> list[tuple[str, str, int, int, dict[str, Any]]]:
    """The child spans of one attempt as (name, span type, start ns, end ns, attributes), in order."""
    c = row.completion
    end_ns = start_ns + int(row.wall_s * _NS)
    ttft = c.ttft_s if c.ttft_s is not None and 0 <= c.ttft_s <= row.wall_s else None
    first_ns = start_ns + int(ttft * _NS) if ttft is not None else start_ns
    plan: list[tuple[str, str, int, int, dict[str, Any]]] = []
    r = c.retrieval
    if r is not None:
        plan.append(("retrieve", "RETRIEVER", start_ns, start_ns, {
            "entry_id": r.entry_id, "artifact_id": r.artifact_id, "similarity": r.similarity, "match": r.match,
            "timing": "inside ttft (not recorded separately)"}))
    first = {"grafted_tokens": c.grafted_tokens, "prefill_tokens": c.prefill_tokens,
             "prompt_tokens": len(c.context_ids), "ttft_s": c.ttft_s}
    if ttft is None:
        first["timing"] = "ttft not recorded"
    if c.grafted_tokens > 0:
        plan.append(("graft", "CHAIN", start_ns, first_ns, {**first, "artifact_id": r.artifact_id if r else None}))
    else:
        plan.append(("prefill", "LLM", start_ns, first_ns, first))
    plan.append(("decode", "LLM", first_ns, end_ns, {"decode_tokens": c.decode_tokens, "stop_reason": c.stop_reason,
                                                      "first_logits_sha256": c.first_logits_sha256}))
    return plan


def _start_ns(started_at: str | None, fallback_s: float) -> int:
    if started_at:
        with contextlib.suppress(ValueError):
            return int(datetime.fromisoformat(started_at).timestamp() * _NS)
    return int(fallback_s * _NS)


def log_traces(
    rows: Sequence[Row],
    *,
    tracking_uri: str,
    experiment_id: str,
    run_id: str,
    started_at: str | None,
    fallback_start_s: float,
    tags: dict[str, str] | None = None,
) -> list[str]:
    """Log one trace per row (spans and feedback as in the module docstring); return the trace ids.

    `started_at` is the run's start (Summary.started_at); when absent, `fallback_start_s` (unix seconds)."""
    os.environ.setdefault("MLFLOW_ENABLE_ASYNC_TRACE_LOGGING", "false")  # written when end_trace returns
    import mlflow
    from mlflow import MlflowClient
    from mlflow.entities import AssessmentSource

    source = AssessmentSource(source_type="CODE", source_id=SCORE_SOURCE)
    trace_ids: list[str] = []
    with _global_tracking_uri(tracking_uri):
        client = MlflowClient(tracking_uri=tracking_uri)
        t_ns = _start_ns(started_at, fallback_start_s)
        for row in rows:
            c = row.completion
            end_ns = t_ns + int(row.wall_s * _NS)
            root = client.start_trace(
                f"{row.condition} {row.problem_id}#{row.sample}", span_type="CHAIN",
                inputs={"problem_id": row.problem_id, "sample": row.sample, "prompt": c.prompt},
                attributes={"condition": row.condition, "group": row.group, "wall_s": row.wall_s,
                            "cpu_s": row.cpu_s, "energy_status": row.energy_status},
                tags={**(tags or {}), "problem_id": row.problem_id, "sample": str(row.sample),
                      "correct": str(row.correct).lower(), **({"group": row.group} if row.group else {})},
                experiment_id=experiment_id, start_time_ns=t_ns, run_id=run_id,
            )
            for name, kind, s_ns, e_ns, attrs in span_plan(row, t_ns):
                span = client.start_span(name, root.trace_id, root.span_id, span_type=kind,
                                         attributes={k: v for k, v in attrs.items() if v is not None},
                                         start_time_ns=s_ns)
                client.end_span(root.trace_id, span.span_id, end_time_ns=e_ns)
            client.end_trace(root.trace_id, outputs={"completion": c.text, "extracted": row.extracted,
                                                     "answer": row.answer}, end_time_ns=end_ns)
            mlflow.log_feedback(trace_id=root.trace_id, name="correct", value=row.correct, source=source,
                                rationale=f"extracted {row.extracted!r}, gold {row.gold!r}")
            mlflow.log_expectation(trace_id=root.trace_id, name="expected_answer", value=row.gold, source=source)
            trace_ids.append(root.trace_id)
            t_ns = end_ns
    return trace_ids
