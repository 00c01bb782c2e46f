"""The control entry: a random OTHER library entry for a problem (`library.retrieval=random`), to ask whether any
verified solution helps a model or only a related one (the held-out graft reads the nearest other entry by BM25).

    entry = random_other_entry(library.entries, problem)      # never the problem's own entry; None if none is left

Deterministic and independent of run order: the choice is SHA-256(RANDOM_SEED, problem id) modulo the number of
candidates, over the entries in index order that are not the problem itself (neither its fingerprint nor its id, nor
an entry the caller excludes: `exclude`, the server's problems found in a request and their near duplicates),
so a resumed, re-run or sharded run picks the same entry for the same problem, and two problems choose
independently. The seed is fixed here (changing it is a code change, seen in the run's commit), not a setting.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Sequence
from typing import Any

__all__ = ["RANDOM_SEED", "random_other_entry"]

RANDOM_SEED = 0


def random_other_entry(entries: Sequence[Any], problem: Any, seed: int = RANDOM_SEED,
                       exclude: Collection[str] = ()) -> Any | None:
    """A pseudo-random entry of `entries` (harness.library.build.Entry) that is not `problem` (harness.task.problems.
    Problem) nor one whose entry id is in `exclude` (the library-aware server's content exclusion), or None when
    none is left."""
    fp = problem.fingerprint
    candidates = [e for e in entries if e.problem_fingerprint != fp and e.problem_id != problem.id
                  and not (exclude and e.entry_id in exclude)]
    if not candidates:
        return None
    digest = hashlib.sha256(f"{seed}\0{problem.id}".encode()).digest()
    return candidates[int.from_bytes(digest[:8], "big") % len(candidates)]
