"""What a Hydra sweep folder should hold: the jobs its `multirun.yaml` lists, and which of them have no finished run.

    plan = sweep_plan(Path("runs/multirun/<stamp>"))   # None: not a sweep folder (no multirun.yaml)
    plan.jobs                                        # [SweepJob(num=0, values={"decoding.max_new_tokens": "3"}), ...]
    plan.missing()                                   # ["job 2 (decoding.max_new_tokens=5): no folder", ...]

Hydra's basic sweeper runs the cartesian product of the swept overrides (`key=a,b`, `key=range(1,4)`,
`key=choice(a,b)`; `hydra.sweeper.params` first, then the command line's), the last override varying fastest, and
numbers the jobs in that order; each job's folder starts with `<num>_` (configs/config.yaml `hydra.sweep.subdir`).
A job counts as finished when its folder holds a run folder (manifest.json) or a compare folder (comparison.json).
Read with PyYAML only (no Hydra), so a re-check needs no more than the audit extra. A value this module cannot
expand (`glob(...)`, an interval) leaves the plan unknown (`jobs` None): the re-check then says it cannot count.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["MULTIRUN", "SweepJob", "SweepPlan", "sweep_plan"]

MULTIRUN = "multirun.yaml"
_RANGE = re.compile(r"^range\((.*)\)$")
_CHOICE = re.compile(r"^choice\((.*)\)$")


@dataclass(frozen=True)
class SweepJob:
    num: int
    values: dict[str, str]  # the swept keys' values of this job

    def describe(self) -> str:
        return f"job {self.num} ({', '.join(f'{k}={v}' for k, v in self.values.items()) or 'no swept value'})"


@dataclass
class SweepPlan:
    folder: Path
    jobs: list[SweepJob] | None  # None: multirun.yaml lists a sweep this module cannot expand
    unknown: str | None = None  # why `jobs` is None
    found: dict[int, Path] = field(default_factory=dict)  # job number -> its folder, where one exists

    def missing(self) -> list[str]:
        """One line per listed job without a finished run: no folder, or a folder without a run in it."""
        out = []
        for job in self.jobs or []:
            where = self.found.get(job.num)
            if where is None:
                out.append(f"{job.describe()}: no folder")
            elif not _finished(where):
                out.append(f"{job.describe()}: {where.name} holds no finished run (no manifest.json: killed, "
                           "failed or still running)")
        return out


def _split(text: str) -> list[str]:
    """`text` split at its top-level commas (not inside quotes, brackets, braces or parentheses)."""
    parts, depth, quote, cur = [], 0, None, []
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    parts.append("".join(cur).strip())
    return parts


def _values(value: str) -> list[str] | None:
    """The values one override sweeps ([value] when it sweeps nothing); None when it cannot be expanded here."""
    value = value.strip()
    if m := _RANGE.match(value):
        try:
            args = [float(x) if "." in x else int(x) for x in _split(m.group(1))]
            start, stop, step = (0, args[0], 1) if len(args) == 1 else (*args[:2], args[2] if len(args) > 2 else 1)
        except (ValueError, IndexError):
            return None
        out, x = [], start
        while (step > 0 and x < stop) or (step < 0 and x > stop):
            out.append(str(x))
            x += step
        return out
    if m := _CHOICE.match(value):
        return _split(m.group(1))
    if re.match(r"^(glob|interval|tag|sort|shuffle)\(", value):
        return None
    return _split(value)


def _finished(folder: Path) -> bool:
    return any(True for _ in folder.rglob("manifest.json")) or any(True for _ in folder.rglob("comparison.json"))


def sweep_plan(folder: Path) -> SweepPlan | None:
    """The plan of the sweep in `folder` from its multirun.yaml; None when it has none (not a sweep folder)."""
    import yaml

    path = Path(folder) / MULTIRUN
    if not path.is_file():
        return None
    try:
        cfg: Any = yaml.safe_load(path.read_text(encoding="utf-8"))
        hydra = cfg["hydra"]
        task = list(hydra["overrides"]["task"] or [])
        params = (hydra.get("sweeper") or {}).get("params") or {}
    except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError) as exc:
        return SweepPlan(Path(folder), None, f"{path} is unreadable ({type(exc).__name__})")
    swept: dict[str, list[str]] = {}
    for key, value in [*((str(k), str(v)) for k, v in params.items()), *(o.partition("=")[::2] for o in task)]:
        key = key.lstrip("+~")
        values = _values(value)
        if values is None:
            return SweepPlan(Path(folder), None, f"{path}: {key}={value} is a sweep this re-check cannot expand")
        swept.pop(key, None)  # the command line's value replaces the config's, in its own place
        swept[key] = values
    axes = {k: v for k, v in swept.items() if len(v) > 1}
    jobs = [SweepJob(i, dict(zip(axes, combo, strict=True)))
            for i, combo in enumerate(itertools.product(*axes.values()))]
    found = {}
    for child in Path(folder).iterdir():
        num = child.name.split("_", 1)[0]
        if child.is_dir() and num.isdigit():
            found[int(num)] = child
    return SweepPlan(Path(folder), jobs, None, found)
