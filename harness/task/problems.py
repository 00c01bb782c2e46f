"""Problem sets: read rows from a local file (jsonl/json/csv/parquet) or a Hugging Face hub id, map columns,
validate each row, and return `Problem`s.

Every bad input is a :class:`~harness.errors.ProblemError` whose message names the file, the row (and the
line, where the file has lines), the field, and the fix; nothing from the parser leaks out unexplained.

Schema (problems/README.md): id, problem, answer (AIME integer 0-999, leading zeros accepted), optional
solution; every other column is kept as source metadata.

Readers:
- ``.jsonl``: one JSON object per line, blank lines skipped; row N is the N-th object.
- ``.json``: a JSON array of objects, or JSON lines under a ``.json`` name.
- ``.csv``: a header row, then one row per problem (RFC 4180 quoting); every value is text.
- ``.parquet`` and hub ids go through ``datasets`` (a hub id offline needs it in the local cache).

Column maps: ``columns={field: column}`` (fields id, problem, answer, solution) names the dataset's columns;
unmapped fields keep their own names. In a run: ``'dataset.columns={id: ID, problem: Question, answer: A}'``.

Try: ``python -c "from harness.task.problems import load_problems as l;
print(len(l('problems/kvgraft_original.jsonl')))"``.
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import AnswerError, ProblemError
from harness.task.answers import parse_gold

__all__ = ["FIELDS", "Problem", "load_problems", "normalize_problem_text", "problem_fingerprint"]

FIELDS = ("id", "problem", "answer", "solution")  # what a dataset.columns map may name
_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")
_MAX_REASON = 300  # characters of a parser's own message quoted in ours


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


# --- readers: each yields (row number, location for messages, row dict) -------------------------------

Row = tuple[int, str, dict[str, Any]]


def _reason(e: BaseException) -> str:
    """A parser's message, never blank, cut to a readable length."""
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= _MAX_REASON else text[:_MAX_REASON] + "..."


def _object(value: Any, p: Path, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ProblemError(
            f"{p}, {where}: expected a JSON object with fields {list(FIELDS[:3])}, got {type(value).__name__}; "
            "write one object per problem"
        )
    return value


def _json_lines(p: Path, lines: list[str]) -> Iterator[Row]:
    n = 0
    for line_no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        n += 1
        where = f"row {n} (line {line_no})"
        value = _parse_json(line, p, f"{p}, {where}", "fix that line (each line must be one complete JSON object)")
        yield n, where, _object(value, p, where)


def _parse_json(text: str, p: Path, where: str | None, fix: str) -> object:
    """json.loads with a ProblemError naming the file, line (or `where`), column and the fix."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        at = where or f"{p}, line {e.lineno}"
        raise ProblemError(f"{at}: invalid JSON at column {e.colno}: {e.msg}; {fix}") from e
    except RecursionError as e:
        raise ProblemError(f"{where or p}: JSON nested too deeply; {fix}") from e


def _read_json(p: Path, text: str, suffix: str) -> Iterator[Row]:
    lines = text.splitlines()
    if suffix == ".json" and text.lstrip().startswith("["):
        items = _parse_json(
            text, p, None, "fix the file (a .json file holds one array of objects, or one object per line)"
        )
        for n, item in enumerate(items, start=1):
            where = f"row {n} (array item {n})"
            yield n, where, _object(item, p, where)
        return
    yield from _json_lines(p, lines)


def _read_csv(p: Path, text: str) -> Iterator[Row]:
    reader = csv.reader(text.splitlines(keepends=True), strict=True)
    try:
        header = next(reader)
        if len(set(header)) != len(header) or any(not h.strip() for h in header):
            repeated = sorted({h for h in header if header.count(h) > 1 or not h.strip()})
            raise ProblemError(
                f"{p}, line 1 (header): column names must be unique and non-empty, got {repeated}; "
                "fix the header row"
            )
        n = 0
        for values in reader:
            line_no = reader.line_num
            if not any(v.strip() for v in values):
                continue
            n += 1
            where = f"row {n} (line {line_no})"
            if len(values) != len(header):
                raise ProblemError(
                    f"{p}, {where}: {len(values)} fields where the header has {len(header)} ({header}); "
                    "quote values that contain commas (\"a, b\") or fix the row"
                )
            yield n, where, dict(zip(header, values, strict=True))
    except csv.Error as e:
        raise ProblemError(
            f"{p}, line {reader.line_num}: not valid CSV: {_reason(e)}; fix the quoting on that line"
        ) from e


def _read_parquet(p: Path) -> Iterator[Row]:
    import datasets

    datasets.disable_progress_bars()
    try:
        ds = datasets.load_dataset("parquet", data_files=str(p.resolve()), split="train")
    except Exception as e:  # noqa: BLE001 - pyarrow/datasets raise many types; all mean "not readable parquet"
        cause = e.__cause__ or e.__context__ or e
        raise ProblemError(
            f"{p}: not a readable parquet file ({_reason(cause)}); rewrite it, e.g. with pandas "
            "DataFrame.to_parquet, or give the rows as .jsonl"
        ) from e
    for n, row in enumerate(ds, start=1):
        yield n, f"row {n}", dict(row)


def _read_file(p: Path) -> Iterator[Row]:
    if not p.is_file():
        raise ProblemError(
            f"dataset file {p} does not exist (dataset.path); give an existing jsonl/csv/parquet file"
        )
    suffix = p.suffix.lower()
    if suffix not in _SUFFIXES:
        raise ProblemError(
            f"dataset file {p}: unsupported suffix {p.suffix!r}; rename or convert it to one of {list(_SUFFIXES)}"
        )
    if suffix == ".parquet":
        yield from _read_parquet(p)
        return
    try:
        text = p.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        line = p.read_bytes()[: e.start].count(b"\n") + 1
        raise ProblemError(f"{p}, line {line}: not UTF-8 text ({e.reason}); save the file as UTF-8") from e
    if not text.strip():
        raise ProblemError(
            f"dataset file {p} is empty: it holds no rows; write one problem per row "
            "(fields id, problem, answer) or point dataset.path at another file"
        )
    yield from (_read_csv(p, text) if suffix == ".csv" else _read_json(p, text, suffix))


def _read_hub(hub_id: str, subset: str | None, split: str) -> Iterator[Row]:
    import datasets

    datasets.disable_progress_bars()
    try:
        ds = datasets.load_dataset(hub_id, subset, split=split)
    except Exception as e:  # noqa: BLE001 - offline, missing split, network: all reported the same way
        cause = e.__cause__ or e.__context__
        reason = _reason(e) + (f" ({_reason(cause)})" if cause is not None else "")
        fetch = f"import datasets; datasets.load_dataset({hub_id!r}, {subset!r}, split={split!r})"
        raise ProblemError(
            f"dataset {hub_id!r} (subset {subset}, split {split}) could not be loaded: {reason}. "
            f"Offline runs read it from the local HF cache; fill the cache once with network access: "
            f"HF_HUB_OFFLINE=0 python -c \"{fetch}\" , or save the rows to a file and set dataset.path=<file>"
        ) from e
    for n, row in enumerate(ds, start=1):
        yield n, f"row {n}", dict(row)


# --- loading -----------------------------------------------------------------------------------------


def _column_map(columns: Mapping[str, str] | None) -> dict[str, str]:
    cols = {name: name for name in FIELDS}
    for name, column in dict(columns or {}).items():
        if name not in FIELDS:
            raise ProblemError(
                f"dataset.columns names field {name!r}, which is not one of {list(FIELDS)}; the map is "
                "{field: dataset column}, e.g. 'dataset.columns={id: ID, problem: Question, answer: Answer}'"
            )
        if not isinstance(column, str) or not column:
            raise ProblemError(f"dataset.columns.{name} must be a column name (text), got {column!r}")
        cols[name] = column
    return cols


def load_problems(
    path: str | Path | None = None,
    hub_id: str | None = None,
    subset: str | None = None,
    split: str = "train",
    columns: Mapping[str, str] | None = None,
    limit: int | None = None,
) -> list[Problem]:
    """Load, map and validate problems; `columns` maps our field names to the dataset's column names.

    `limit` takes the first N rows (rows after it are not read). Raises ProblemError on any bad input.
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ProblemError(f"dataset.limit={limit!r}: give a whole number >= 1, or null for every problem")
    cols = _column_map(columns)
    if path:
        where, rows = str(path), _read_file(Path(path))
    elif hub_id:
        where, rows = hub_id, _read_hub(hub_id, subset, split)
    else:
        raise ProblemError("no dataset given: set dataset.path (a local file) or dataset.hub_id (a hub dataset)")
    problems: list[Problem] = []
    seen: dict[str, str] = {}
    texts: dict[str, tuple[str, Problem]] = {}  # fingerprint -> (where, the first problem with that text)
    for _, loc, row in rows:
        problem = _validate(row, f"{where}, {loc}", cols, seen)
        _check_same_text(problem, f"{where}, {loc}", texts)
        problems.append(problem)
        if limit is not None and len(problems) >= limit:
            break
    if not problems:
        raise ProblemError(f"{where}: no problems in it; write one problem per row (fields id, problem, answer)")
    return problems


def _check_same_text(problem: Problem, at: str, texts: dict[str, tuple[str, Problem]]) -> None:
    """Two problems whose normalized texts are equal are one problem to the library (same fingerprint): with
    different answers one would graft the other's entry as an exact match, so the set is refused."""
    first = texts.setdefault(problem.fingerprint, (at, problem))
    if first[1] is not problem and first[1].answer != problem.answer:
        raise ProblemError(
            f"{at} (id {problem.id}): same problem text (normalized: whitespace and case) as {first[0]} "
            f"(id {first[1].id}) but answer {problem.answer} where that one has {first[1].answer}; a problem has one "
            "answer: correct the wrong one, or drop or reword one of the two rows"
        )


def _suggest(row: Mapping[str, Any], cols: Mapping[str, str]) -> str:
    """A dataset.columns override mapping every field the row lacks, using same-named columns when found."""
    mapping: dict[str, str] = {}
    for name in FIELDS:
        if cols[name] in row:
            if cols[name] != name:
                mapping[name] = cols[name]
            continue
        same = [str(c) for c in row if str(c).lower() in (name, f"{name}s")]
        if same:
            mapping[name] = same[0]
        elif name != "solution":
            mapping[name] = "<column>"
    return "set 'dataset.columns={" + ", ".join(f"{k}: {v}" for k, v in mapping.items()) + "}'"


def _validate(row: dict[str, Any], at: str, cols: dict[str, str], seen: dict[str, str]) -> Problem:
    def field_(name: str, required: bool = True) -> Any:
        col = cols[name]
        if col not in row:
            if not required:
                return None
            raise ProblemError(
                f"{at}: field {name!r} (column {col!r}) is missing; columns present: {sorted(row)}. "
                f"Add the column, or {_suggest(row, cols)}"
            )
        value = row[col]
        if required and (value is None or (isinstance(value, str) and not value.strip())):
            raise ProblemError(f"{at}: field {name!r} (column {col!r}) is empty; give it a value or drop the row")
        return value

    raw_id = field_("id")
    if not isinstance(raw_id, (str, int)) or isinstance(raw_id, bool):
        raise ProblemError(f"{at}: field 'id' must be text or an integer, got {type(raw_id).__name__} {raw_id!r}")
    pid = str(raw_id).strip()
    if pid in seen:
        raise ProblemError(f"{at}: field 'id' value {pid!r} repeats {seen[pid]}; ids must be unique")
    seen[pid] = at.rsplit(", ", 1)[-1]
    text = field_("problem")
    if not isinstance(text, str):
        raise ProblemError(f"{at} (id {pid}): field 'problem' must be text, got {type(text).__name__}")
    raw_answer = field_("answer")
    try:
        answer = str(parse_gold(raw_answer if isinstance(raw_answer, int) else str(raw_answer).strip()))
    except AnswerError as e:
        raise ProblemError(f"{at} (id {pid}): field 'answer': {e}") from e
    solution = field_("solution", required=False)
    if solution is not None and not isinstance(solution, str):
        raise ProblemError(f"{at} (id {pid}): field 'solution' must be text, got {type(solution).__name__}")
    used = {cols[k] for k in FIELDS}
    source = {k: v for k, v in row.items() if k not in used and v is not None}
    source = {k: (v if isinstance(v, (str, int, float, bool, list, dict)) else str(v)) for k, v in source.items()}
    return Problem(id=pid, problem=text, answer=answer, solution=solution or None, source=source)


def check_problem_sets(c: Any, root: Path, dataset: bool = True) -> None:
    """Read and validate every problem set a job with the typed config `c` reads (its dataset, unless `dataset` is
    false: the library build reads only its own; its library's, when built from one): a ProblemError naming the file
    (missing, unreadable, a bad row) before the job loads a model or opens or builds a library, never after (a job
    that would refuse anyway spends nothing first)."""
    sets = [("dataset", c.dataset)] if dataset else []
    library = getattr(c, "library", None)
    if library is not None and getattr(library, "source", None) == "dataset":
        sets.append(("library.dataset", library.dataset))
    for name, d in sets:
        if not d.path and not d.hub_id:
            raise ProblemError(f"{name}: no problem set given: set {name}.path (a local file) or {name}.hub_id")
        load_problems(str(root / d.path) if d.path else None, d.hub_id, d.subset, d.split, dict(d.columns), d.limit)
