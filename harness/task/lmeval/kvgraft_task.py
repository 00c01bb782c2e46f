"""The lm-eval task's prompt and metric (kvgraft_original.yaml): the harness's own, imported, not restated.

doc_to_text renders configs/prompt/answer.yaml's template with harness.task.prompts.render (what every harness
condition puts to the model: harness.run.conditions.query_prompt); process_results scores the completion with
harness.task.answers.score against the row's answer (what `make rescore` re-checks). lm-eval loads this file by path:
run it from the project root with PYTHONPATH=. (docs/vllm.md), so that `harness` is the project's."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from harness.task.answers import score
from harness.task.prompts import render

ROOT = Path(__file__).resolve().parents[3]

PROMPT = ROOT / "configs" / "prompt" / "answer.yaml"


@cache
def template() -> str:
    import yaml

    return str(yaml.safe_load(PROMPT.read_text(encoding="utf-8"))["template"])


def doc_to_text(doc: dict[str, Any]) -> str:
    return render(template(), problem=doc["problem"])


def process_results(doc: dict[str, Any], results: list[str]) -> dict[str, float]:
    return {"correct": float(score(results[0], str(doc["answer"])).correct)}
