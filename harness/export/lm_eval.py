"""lm-evaluation-harness's per-sample file: `samples_<task>_<time>.jsonl`, one line per document (problem), as
lm-eval 0.4 writes it (`lm_eval/evaluator.py`, `EvaluationTracker.save_results_samples`): doc_id, doc, target,
arguments ({"gen_args_0": {"arg_0": prompt, "arg_1": generation kwargs}}), resps ([[every sample's text]]),
filtered_resps ([[every sample's extracted answer, "" for none]]), filter, metrics (the names) and each metric's
value, doc_hash, prompt_hash, target_hash. lm-eval's own readers find the file by its name
(`lm_eval.utils.get_sample_results_filenames`, `get_file_task_name`, `get_file_datetime`).

Hashes: prompt_hash and target_hash as lm-eval computes them (SHA-256 of the prompt text, of the target string);
doc_hash is kvgraft's, from the run's manifest (`inputs.problems[<id>]`: SHA-256 of the canonical JSON of the doc,
where lm-eval hashes `json.dumps(doc, indent=2)`), so it binds the doc to the manifest. Each line also carries
`kvgraft` (harness.export.common.provenance per sample: row, completion and token-id hashes, model fingerprint).
Metrics: `exact_match` (the fraction of the doc's samples whose answer equals the target: avg@n) and, for n > 1
samples, `maj@n` (the majority vote, harness.record.metrics.majority_vote).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from harness.export.common import Exported, provenance
from harness.record.metrics import majority_vote
from harness.record.rows import Row

__all__ = ["samples_file", "write"]


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


_UNSAFE = re.compile(r"[^A-Za-z0-9._+=-]")


def samples_file(ex: Exported) -> str:
    """`samples_<task>_<time>.jsonl`, the time lm-eval's way (ISO 8601 with ':' as '-'): the run's end. One file
    name, never a path: a character a file name cannot hold safely (the `/` of a hub dataset name such as
    `org/aime`, a control character) is written `_`; the task keeps its name inside the file."""
    when = (ex.run.summary.finished_at or ex.run.folder.name).replace(":", "-")
    return f"samples_{_UNSAFE.sub('_', ex.task())}_{_UNSAFE.sub('_', when)}.jsonl"


def _gen_kwargs(ex: Exported) -> dict[str, Any]:
    """The run's decoding settings in lm-eval's generation-kwargs words."""
    d, p = ex.run.config.get("decoding") or {}, ex.run.config.get("prompt") or {}
    sample = d.get("strategy") == "sample"
    return {"until": list(p.get("stop") or []), "max_gen_toks": ex.budget(), "do_sample": sample,
            "temperature": d.get("temperature") if sample else 0.0, "top_p": d.get("top_p") if sample else None,
            "seed": d.get("seed") if sample else None, "repeats": d.get("n_samples", 1)}


def _sample(ex: Exported, doc_id: int, doc: dict[str, Any], rows: list[tuple[Row, dict[str, Any]]]) -> dict[str, Any]:
    first = rows[0][0]
    prompt, target = first.completion.prompt, str(first.gold)
    correct = [r.correct for r, _ in rows]
    metrics: dict[str, float] = {"exact_match": sum(correct) / len(correct)}
    if len(rows) > 1:
        metrics[f"maj@{len(rows)}"] = float(majority_vote([r.answer for r, _ in rows], correct))
    return {
        "doc_id": doc_id, "doc": doc, "target": target,
        "arguments": {"gen_args_0": {"arg_0": prompt, "arg_1": _gen_kwargs(ex)}},
        "resps": [[r.completion.text for r, _ in rows]],
        "filtered_resps": [["" if r.answer is None else str(r.answer) for r, _ in rows]],
        "filter": "kvgraft-answer", "metrics": list(metrics),
        "doc_hash": ex.problem_hash(first.problem_id), "prompt_hash": _sha256(prompt), "target_hash": _sha256(target),
        **metrics,
        "kvgraft": [provenance(ex, r, e) for r, e in rows],
    }


def write(ex: Exported, out: Path) -> list[Path]:
    """One line per problem that has rows, in problems.jsonl order (doc_id = its index there)."""
    by_problem: dict[str, list[tuple[Row, dict[str, Any]]]] = {}
    for row, entry in zip(ex.run.rows, ex.entries, strict=True):
        by_problem.setdefault(row.problem_id, []).append((row, entry))
    lines = [json.dumps(_sample(ex, i, doc, sorted(by_problem[pid], key=lambda t: t[0].sample)), ensure_ascii=False)
             for i, (pid, doc) in enumerate(ex.problems.items()) if pid in by_problem]
    path = out / samples_file(ex)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return [path]
