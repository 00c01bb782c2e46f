"""Every Eval Ever's instance-level records (schema `instance_level_eval.schema.json`, version 0.3.0, EvalEval
Coalition, MIT): one JSON line per (problem, sample) in `<uuid>_samples.jsonl`, the name its tools expect (the UUID is
version 4, derived from the run's manifest SHA-256, so one run always exports to the same file).

Mapped fields: evaluation_id = the run's manifest_sha256; model_id = the model name; evaluation_name = the task
(dataset, condition, group); sample_id = the problem id (the sample index is in metadata); sample_hash as Every Eval
Ever's lm-eval converter computes it (SHA-256 of `json.dumps({"raw": prompt, "reference": target}, sort_keys=True)`);
input = the problem text, the prompt as the model read it (formatted) and the gold answer; output.raw = the
completion, output.reasoning_trace = the text up to the trace's closing delimiter (model.trace runs); answer
attribution = the extracted answer; evaluation = score 1/0 and is_correct; token_usage, performance (wall and TTFT in
ms); metadata (strings only, as the schema asks) = kvgraft's provenance (harness.export.common.provenance).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path
from typing import Any

from harness.export.common import Exported, provenance
from harness.record.rows import Row

__all__ = ["SCHEMA_VERSION", "record", "write"]

SCHEMA_VERSION = "0.3.0"
EXTRACTION = "kvgraft harness.task.answers: last \\boxed{}, else the last answer phrase, else the last number"


def _uuid4(manifest_sha256: str) -> str:
    """A version-4 UUID whose random bits are the manifest hash's first 16 bytes."""
    return str(uuid.UUID(bytes=bytes.fromhex(manifest_sha256)[:16], version=4))


def _text(value: Any) -> str:
    return "" if value is None else value if isinstance(value, str) else json.dumps(value)


def record(ex: Exported, row: Row, entry: dict[str, Any]) -> dict[str, Any]:
    """The instance-level record of one row."""
    c, problem = row.completion, ex.problems.get(row.problem_id, {})
    trace = None
    if row.trace_close is not None and row.trace_close in c.text:
        trace = [c.text[: c.text.rfind(row.trace_close)]]
    target = str(row.gold)
    return {
        "schema_version": SCHEMA_VERSION, "evaluation_id": str(ex.run.manifest.get("manifest_sha256")),
        "model_id": ex.run.summary.model, "evaluation_name": ex.task(), "sample_id": row.problem_id,
        "sample_hash": hashlib.sha256(json.dumps({"raw": c.prompt, "reference": target},
                                                 sort_keys=True).encode()).hexdigest(),
        "interaction_type": "single_turn",
        "input": {"raw": str(problem.get("problem", c.prompt)), "formatted": c.prompt, "reference": [target]},
        "output": {"raw": [c.text], "reasoning_trace": trace},
        "messages": None,
        "answer_attribution": [{"turn_idx": 0, "source": "output.raw", "extracted_value": _text(row.extracted),
                                "extraction_method": EXTRACTION, "is_terminal": True}],
        "evaluation": {"score": 1.0 if row.correct else 0.0, "is_correct": bool(row.correct), "num_turns": 1},
        "token_usage": {"input_tokens": len(c.context_ids), "output_tokens": c.decode_tokens,
                        "total_tokens": len(c.context_ids) + c.decode_tokens},
        "performance": {"latency_ms": row.wall_s * 1000.0,
                        "time_to_first_token_ms": None if c.ttft_s is None else c.ttft_s * 1000.0},
        "error": None,
        "metadata": {k: _text(v) for k, v in provenance(ex, row, entry).items()},
    }


def write(ex: Exported, out: Path) -> list[Path]:
    path = out / f"{_uuid4(str(ex.run.manifest.get('manifest_sha256')))}_samples.jsonl"
    lines = [json.dumps(record(ex, r, e), ensure_ascii=False) for r, e in zip(ex.run.rows, ex.entries, strict=True)]
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return [path]
