"""Problem sets: load rows through `datasets` (local jsonl/json/csv/parquet files or hub ids), map columns,
validate each row, and return `Problem`s. A bad row is a ProblemError naming the file, row and field.

Schema (problems/README.md): id, problem, answer (AIME integer 0-999, leading zeros accepted), optional
solution; every other column is kept as source metadata.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.answers import parse_gold
from harness.errors import AnswerError, ProblemError

_BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}


@dataclass(frozen=True)
class Problem:
    id: str
    problem: str
    answer: str  # canonical integer string, no leading zeros
    solution: str | None = None
    source: dict[str, Any] = field(default_factory=dict)

    def to_row(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "problem": self.problem,
            "answer": self.answer,
            "solution": self.solution,
            "source": self.source,
        }

    @property
    def fingerprint(self) -> str:
        return problem_fingerprint(self.problem)


def normalize_problem_text(text: str) -> str:
    """Whitespace-collapsed, lower-cased problem text: what a problem fingerprint hashes."""
    return re.sub(r"\s+", " ", text).strip().lower()


def problem_fingerprint(text: str) -> str:
    return hashlib.sha256(normalize_problem_text(text).encode()).hexdigest()


def _load_rows(path: str | None, hub_id: str | None, subset: str | None, split: str) -> tuple[list[dict], str]:
    import datasets

    datasets.disable_progress_bars()
    if path:
        p = Path(path)
        if not p.is_file():
            raise ProblemError(
                f"dataset file {p} does not exist (dataset.path); give an existing jsonl/csv/parquet file"
            )
        builder = _BUILDERS.get(p.suffix.lower())
        if builder is None:
            raise ProblemError(f"dataset file {p}: unsupported suffix {p.suffix!r}; use one of {sorted(_BUILDERS)}")
        try:
            ds = datasets.load_dataset(builder, data_files=str(p.resolve()), split="train")
        except Exception as e:  # datasets raises many types for malformed files
            raise ProblemError(f"dataset file {p} could not be read as {builder}: {e}") from e
        return [dict(r) for r in ds], str(p)
    if hub_id:
        try:
            ds = datasets.load_dataset(hub_id, subset, split=split)
        except Exception as e:
            raise ProblemError(
                f"dataset {hub_id!r} (subset {subset}, split {split}) could not be loaded: {e}. Offline runs need it "
                "in the local HF cache: download it once online (`hf download --repo-type dataset ...`)."
            ) from e
        return [dict(r) for r in ds], hub_id
    raise ProblemError("no dataset given: set dataset.path (a local file) or dataset.hub_id")


def load_problems(
    path: str | None = None,
    hub_id: str | None = None,
    subset: str | None = None,
    split: str = "train",
    columns: dict[str, str] | None = None,
    limit: int | None = None,
) -> list[Problem]:
    """Load, map and validate problems. `columns` maps our field names to the dataset's column names."""
    rows, where = _load_rows(path, hub_id, subset, split)
    cols = {"id": "id", "problem": "problem", "answer": "answer", "solution": "solution", **(columns or {})}
    problems: list[Problem] = []
    seen: dict[str, int] = {}
    for i, row in enumerate(rows, start=1):
        if limit is not None and len(problems) >= limit:
            break
        problems.append(_validate(row, i, where, cols, seen))
    if not problems:
        raise ProblemError(f"{where}: no problems (empty file, or dataset.limit=0)")
    return problems


def _validate(row: dict, i: int, where: str, cols: dict[str, str], seen: dict[str, int]) -> Problem:
    def field_(name: str, required: bool = True) -> Any:
        col = cols[name]
        value = row.get(col)
        if required and (value is None or (isinstance(value, str) and not value.strip())):
            raise ProblemError(
                f"{where}, row {i}: field {name!r} (column {col!r}) is missing or empty; "
                f"columns present: {sorted(row)}. Map it with dataset.columns.{name}=<column>"
            )
        return value

    pid = str(field_("id")).strip()
    if pid in seen:
        raise ProblemError(f"{where}, row {i}: field 'id' value {pid!r} repeats row {seen[pid]}; ids must be unique")
    seen[pid] = i
    text = field_("problem")
    if not isinstance(text, str):
        raise ProblemError(f"{where}, row {i} (id {pid}): field 'problem' must be text, got {type(text).__name__}")
    raw_answer = field_("answer")
    try:
        answer = str(parse_gold(raw_answer if isinstance(raw_answer, int) else str(raw_answer).strip()))
    except AnswerError as e:
        raise ProblemError(f"{where}, row {i} (id {pid}): field 'answer': {e}") from e
    solution = field_("solution", required=False) if cols["solution"] in row else None
    used = {cols[k] for k in ("id", "problem", "answer", "solution")}
    source = {k: v for k, v in row.items() if k not in used and v is not None}
    source = {k: (v if isinstance(v, (str, int, float, bool, list, dict)) else str(v)) for k, v in source.items()}
    return Problem(id=pid, problem=text, answer=answer, solution=solution or None, source=source)
