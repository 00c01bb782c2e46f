"""Build a small, realistic run folder by hand (no model) for manifest, rescore and tracking tests.

The folder follows ``harness/RUN_FORMAT.md``: three baseline rows (two problems, one with two samples),
scored with ``harness.answers.score`` and summarised with ``harness.metrics.summarize_scores``, written
with the ``harness.hashing`` helpers and hashed with ``harness.manifest.build_manifest``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from harness.answers import score
from harness.hashing import atomic_write_bytes, atomic_write_text, jsonl_bytes, write_json, write_jsonl
from harness.manifest import build_manifest
from harness.metrics import summarize_scores

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


def make_rows(condition: str = "baseline") -> list[dict[str, Any]]:
    """The three outputs.jsonl rows, scores filled in by ``score()``."""
    rows = []
    for idx, sample, completion in COMPLETIONS:
        problem = PROBLEMS[idx]
        prompt = PROMPT_TEMPLATE.format(problem=problem["problem"])
        s = score(completion, problem["answer"])
        prompt_ids = _fake_token_ids(prompt)
        rows.append(
            {
                "problem_id": problem["id"],
                "sample": sample,
                "condition": condition,
                "prompt": prompt,
                "prompt_token_ids": prompt_ids,
                "completion": completion,
                "completion_token_ids": _fake_token_ids(completion),
                "gold_answer": problem["answer"],
                "extracted": s.extracted,
                "answer": s.answer,
                "correct": s.correct,
                "prompt_tokens": len(prompt_ids),
                "prefill_tokens": len(prompt_ids),
                "grafted_tokens": 0,
                "decode_tokens": len(completion),
                "wall_s": 0.25 + 0.125 * sample,
                "cpu_s": 0.5,
                "energy_j": None,
                "energy_status": "unavailable:no NVIDIA GPU and RAPL not readable",
                "entry_id": None,
                "artifact_id": None,
                "similarity": None,
                "match": None,
            }
        )
    return rows


def build_fake_run(run_dir: Path, condition: str = "baseline") -> Path:
    """Write a complete run folder at ``run_dir`` and return it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    rows = make_rows(condition)
    outputs = jsonl_bytes(rows)
    summary = {
        "format": "kvgraft-summary/1",
        "condition": condition,
        "model": "toy-model",
        "dataset": "toy",
        "run_dir": str(run_dir),
        "scores": summarize_scores(rows),
        "tokens": {
            key: sum(r[f"{key}_tokens"] for r in rows) for key in ("prompt", "prefill", "grafted", "decode")
        },
        "time": {
            "wall_s": sum(r["wall_s"] for r in rows),
            "cpu_s": sum(r["cpu_s"] for r in rows),
            "run_wall_s": 2.5,
        },
        "energy": {"status": "unavailable:no NVIDIA GPU and RAPL not readable", "joules": None},
    }
    cfg = OmegaConf.create(CONFIG)
    atomic_write_text(run_dir / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    write_jsonl(run_dir / "problems.jsonl", PROBLEMS)
    atomic_write_bytes(run_dir / "outputs.jsonl", outputs)
    write_json(run_dir / "summary.json", summary)
    manifest = build_manifest(
        problems=PROBLEMS,
        prompt_template=PROMPT_TEMPLATE,
        config=OmegaConf.to_container(cfg, resolve=True),  # type: ignore[arg-type]
        model_fingerprint="a" * 64,
        tokenizer_fingerprint="b" * 64,
        determinism={"threads": 2, "deterministic_algorithms": True, "attn_implementation": "eager"},
        environment={"device": "cpu", "isa": "avx2", "python": "3.11"},
        rows=rows,
        outputs_bytes=outputs,
        summary=summary,
    )
    write_json(run_dir / "manifest.json", manifest)
    return run_dir
