"""Graft vs in-context row identity: the check that the graft carries exactly what reading the entry in context
carries. A graft row and its in-context twin (same problem id and sample) are *identical* when they have the
same completion token ids AND the same first-logits SHA-256 (`Completion.first_logits_sha256`, the logits that
chose the first token); anything else is a defect of the engine, never noise.

    result = pair(graft_rows, incontext_rows)        # harness.record.rows.Row, in memory (harness/compare/job.py)
    result = pair_folders(graft_folder, incontext_folder)   # from the recorded rows, no model (scripts/rescore.py)
    result.identical, result.differing                # counts; result.differences names each differing row
    result.grafted, result.ok                         # rows that grafted tokens; ok: none differs and some grafted

The compare folder's re-check (every run re-audited and re-paired, every figure recomputed) is
harness/compare/comparison.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.record.folder import RunFolder
from harness.record.rows import Row

__all__ = ["Pairing", "pair", "pair_folders"]


@dataclass
class Pairing:
    """How many graft rows are identical to their in-context twin, and which differ (and in what)."""

    identical: int
    differing: int
    differences: list[str] = field(default_factory=list)  # "problem_id=..., sample=...: <what differs>"
    grafted: int | None = field(default=None, compare=False)  # rows that grafted tokens (None: read back, not counted)

    @property
    def ok(self) -> bool:
        """No row differs, and (where counted) at least one row grafted: two rows with nothing grafted prove
        nothing about a graft."""
        return self.differing == 0 and (self.grafted is None or self.grafted > 0)

    def to_json(self) -> dict[str, Any]:
        return {"identical_rows": self.identical, "differing_rows": self.differing, "differences": self.differences}


def _why(g: Row, c: Row) -> list[str]:
    gc, cc = g.completion, c.completion
    why = []
    if gc.context_ids != cc.context_ids:
        why.append("context token ids (a different entry or query was read)")
    if gc.first_logits_sha256 is None or cc.first_logits_sha256 is None:
        why.append("first_logits_sha256 not recorded")
    elif gc.first_logits_sha256 != cc.first_logits_sha256:
        why.append(f"first_logits_sha256 {gc.first_logits_sha256[:12]}.. vs {cc.first_logits_sha256[:12]}..")
    if gc.token_ids != cc.token_ids:
        at = next((i for i, (a, b) in enumerate(zip(gc.token_ids, cc.token_ids)) if a != b),
                  min(len(gc.token_ids), len(cc.token_ids)))
        why.append(f"completion token ids (first difference at token {at})")
    return why


def pair(graft: Sequence[Row], incontext: Sequence[Row]) -> Pairing:
    """Compare every graft row with the in-context row of the same (problem_id, sample); a row without a twin
    counts as differing."""
    g_by = {(r.problem_id, r.sample): r for r in graft}
    c_by = {(r.problem_id, r.sample): r for r in incontext}
    identical, differences = 0, []
    for key in sorted(set(g_by) | set(c_by), key=lambda k: (str(k[0]), k[1])):
        label = f"problem_id={key[0]!r}, sample={key[1]}"
        if key not in g_by or key not in c_by:
            differences.append(f"{label}: only in the {'graft' if key in g_by else 'incontext'} run")
            continue
        why = _why(g_by[key], c_by[key])
        if why:
            differences.append(f"{label}: " + "; ".join(why))
        else:
            identical += 1
    grafted = sum(1 for r in (*graft, *incontext) if r.completion.grafted_tokens > 0)
    return Pairing(identical, len(differences), differences, grafted)


def pair_folders(graft: RunFolder, incontext: RunFolder) -> Pairing:
    """`pair` from two finished run folders' outputs.jsonl (recorded hashes; no model)."""
    return pair(graft.read_rows(), incontext.read_rows())
