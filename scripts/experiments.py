"""What the experiment scripts share: the problem text they cut tokens from, and the summary of repeated timings.

Used by verify_graft.py, position_sweep.py, bench.py (imported as a sibling module: `python scripts/X.py` puts
scripts/ first on sys.path). Problems are read by the harness's one loader (`harness.problems.load_problems`:
jsonl/json/csv/parquet, validated rows), and a problem's text for an experiment is always
problem + "\\n\\nSolution: " + solution (the solution when it has one); several problems are joined with "\\n\\n".
"""

from __future__ import annotations

import platform
import statistics
from pathlib import Path

from harness.errors import HarnessError
from harness.problems import Problem, load_problems

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PROBLEMS = REPO / "problems" / "kvgraft_original.jsonl"


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


def stats(xs: list[float]) -> dict:
    """median, min, max and count of repeated measurements."""
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def cpu_name() -> str:
    """The CPU's model name as /proc/cpuinfo gives it (every benchmark's JSON names the machine it ran on)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
