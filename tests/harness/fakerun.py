"""Build a small, realistic run folder by hand (no model) for manifest, rescore and tracking tests.

The folder follows ``harness/RUN_FORMAT.md``: three baseline rows (two problems, one with two samples) as
typed ``harness.record.rows.Row``s, scored with ``harness.task.answers.score``, summarised with ``Summary.of`` and
written by ``harness.record.folder.RunFolder.finish`` (manifest last), as a real run writes them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.record.folder import RunFolder
from harness.record.rows import Completion, Row, Summary
from harness.task.answers import score

PROMPT_TEMPLATE = "Solve the problem. Put the final answer in \\boxed{{}}.\n\nProblem: {problem}\n\nSolution:"

PROBLEMS: list[dict[str, Any]] = [
    {"id": "toy-1", "problem": "What is $17 + 25$?", "answer": "42", "source": "kvgraft tests"},
    {
        "id": "toy-2",
        "problem": "How many positive divisors does $36$ have?",
        "answer": "9",
        "source": "kvgraft tests",
    },
]

# (problem index, sample, completion): sample 0 of toy-1 right, sample 1 wrong, toy-2 right.
COMPLETIONS: list[tuple[int, int, str]] = [
    (0, 0, "We add the numbers: 17 + 25 = 42. So the answer is $\\boxed{42}$."),
    (0, 1, "Adding gives 17 + 25 = 32, so the answer is \\boxed{32}."),
    (1, 0, "36 = 2^2 * 3^2 has (2+1)(2+1) = 9 divisors. Final answer: \\boxed{9}"),
]

CONFIG: dict[str, Any] = {
    "model": {"name": "toy-model", "dtype": "float32"},
    "dataset": {"name": "toy", "limit": None},
    "condition": {"name": "baseline"},
    "decoding": {"max_new_tokens": 64, "temperature": 0.0, "samples": 2, "stop": ["</s>", "\n\n\n"]},
    "determinism": {"threads": 2, "eps": 1.0e-5},
    "tracking": {"experiment": "kvgraft-test"},
}


def _fake_token_ids(text: str) -> list[int]:
    return [ord(ch) % 1000 for ch in text]


def make_rows(condition: str = "baseline") -> list[Row]:
    """The three rows, scores filled in by ``score()``."""
    rows = []
    for idx, sample, completion in COMPLETIONS:
        problem = PROBLEMS[idx]
        prompt = PROMPT_TEMPLATE.format(problem=problem["problem"])
        prompt_ids = _fake_token_ids(prompt)
        c = Completion(
            prompt=prompt, context_ids=prompt_ids, text=completion, token_ids=_fake_token_ids(completion),
            stop_reason="stop", prefill_tokens=len(prompt_ids), grafted_tokens=0, decode_tokens=len(completion),
        )
        rows.append(
            Row.scored(
                problem["id"], sample, condition, None, c, problem["answer"], score(completion, problem["answer"]),
                wall_s=0.25 + 0.125 * sample, cpu_s=0.5, energy_j=None,
                energy_status="unavailable:no NVIDIA GPU and RAPL not readable",
            )
        )
    return rows


def build_fake_run(run_dir: Path, condition: str = "baseline") -> Path:
    """Write a complete run folder at ``run_dir`` and return it."""
    folder = RunFolder(run_dir)
    rows = make_rows(condition)
    summary = Summary.of(
        rows, condition=condition, model="toy-model", dataset="toy", run_dir=str(run_dir), comparable_key=None,
        run_wall_s=2.5, energy_status="unavailable:no NVIDIA GPU and RAPL not readable", energy_j=None,
        group=None,
    )
    folder.finish(
        config=CONFIG,
        problems=PROBLEMS,
        rows=rows,
        summary=summary,
        prompt_template=PROMPT_TEMPLATE,
        model_fingerprint="a" * 64,
        tokenizer_fingerprint="b" * 64,
        determinism={"threads": 2, "deterministic_algorithms": True, "attn_implementation": "eager"},
        environment={"device": "cpu", "isa": "avx2", "python": "3.11"},
    )
    return run_dir
