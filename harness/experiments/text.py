"""The text experiments cut tokens from, and the (prefix, suffix) samples cut from it: shared by the exactness
check (scripts/verify_graft.py), its replay (harness/experiments/replay.py), the position sweep and the benchmarks.

Problems are read by the harness's one loader (`harness.task.problems.load_problems`: jsonl/json/csv/parquet,
validated rows), and a problem's text for an experiment is always problem + "\\n\\nSolution: " + solution (the
solution when it has one); several problems are joined with "\\n\\n".
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from harness.errors import HarnessError
from harness.task.problems import Problem, load_problems

__all__ = ["DEFAULT_PROBLEMS", "Sample", "build_samples", "joined_text", "prefix_lengths", "problem_text",
           "problem_texts", "read_problems"]
DEFAULT_PROBLEMS = Path(__file__).resolve().parents[2] / "problems" / "kvgraft_original.jsonl"


def read_problems(path: Path) -> list[Problem]:
    """The problems of a dataset file, through the harness's loader; a bad file ends the script with its message."""
    try:
        return load_problems(str(path))
    except HarnessError as e:
        raise SystemExit(f"{e} (pass another file with --problems / --text)") from e


def problem_text(p: Problem) -> str:
    """One problem's text for an experiment: the problem, then its solution when it has one."""
    return p.problem + ("\n\nSolution: " + p.solution if p.solution else "")


def problem_texts(path: Path) -> list[tuple[str, str]]:
    """(id, text) per problem of the file."""
    return [(p.id, problem_text(p)) for p in read_problems(path)]


def joined_text(path: Path) -> str:
    """Every problem's text, in file order, joined with a blank line."""
    return "\n\n".join(text for _, text in problem_texts(path))


@dataclass(frozen=True)
class Sample:
    index: int
    prefix: list[int]
    suffix: list[int]
    source_ids: tuple[str, ...]  # problem ids whose text the pair was cut from


def prefix_lengths(n: int, seed: int, lo: int, hi: int, window: int | None) -> list[int]:
    """n deterministic prefix lengths in [lo, hi]: stratified quantiles squared (mean ~ lo + (hi - lo) / 3),
    with the three lengths nearest the sliding window replaced by window-1, window, window+1 (where sliding
    layers start dropping positions), then shuffled."""
    rng = random.Random(seed)
    lengths = [round(lo + (hi - lo) * ((i + rng.random()) / n) ** 2) for i in range(n)]
    if window and n >= 8 and lo < window - 1 and window + 1 <= hi:
        nearest = sorted(range(n), key=lambda i: abs(lengths[i] - window))[:3]
        for i, length in zip(sorted(nearest), (window - 1, window, window + 1), strict=True):
            lengths[i] = length
    rng.shuffle(lengths)
    return lengths


def build_samples(be, texts: list[tuple[str, str]], lengths: list[int], suffix_tokens: int, seed: int) -> list[Sample]:
    """Cut each (prefix, suffix) from the token ids of one problem's text, joined with the next problems'
    texts (cycling) until prefix + suffix tokens fit. Each sample starts at a different problem."""
    rng = random.Random(seed + 1)
    order = list(range(len(texts)))
    rng.shuffle(order)
    samples = []
    for i, length in enumerate(lengths):
        start = order[i % len(order)]
        parts, ids = [], []
        while len(ids) < length + suffix_tokens:
            parts.append(texts[(start + len(parts)) % len(texts)])
            ids = be.encode("\n\n".join(t for _, t in parts))
        samples.append(Sample(i, ids[:length], ids[length : length + suffix_tokens], tuple(p for p, _ in parts)))
    return samples
