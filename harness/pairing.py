"""Graft vs in-context row identity: the check that the graft carries exactly what reading the entry in context
carries. A graft row and its in-context twin (same problem id and sample) are *identical* when they have the
same completion token ids AND the same first-logits SHA-256 (`Completion.first_logits_sha256`, the logits that
chose the first token); anything else is a defect of the engine, never noise.

    result = pair(graft_rows, incontext_rows)        # harness.record.Row, in memory (harness/compare.py)
    result = pair_folders(graft_folder, incontext_folder)   # from the recorded rows, no model (scripts/rescore.py)
    result.identical, result.differing                # counts; result.differences names each differing row
    check = audit_comparison("runs/compare/<stamp>")   # re-audit a compare job's runs and re-pair them
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.audit import RunCheck, audit
from harness.errors import RunFolderError
from harness.record import Row
from harness.run_folder import RunFolder

__all__ = ["Pairing", "pair", "pair_folders"]


@dataclass
class Pairing:
    """How many graft rows are identical to their in-context twin, and which differ (and in what)."""

    identical: int
    differing: int
    differences: list[str] = field(default_factory=list)  # "problem_id=..., sample=...: <what differs>"

    @property
    def ok(self) -> bool:
        return self.differing == 0

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
                  min(len(gc.token_ids), len(cc.token_ids)))  # fmt: skip
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
    return Pairing(identical, len(differences), differences)


def pair_folders(graft: RunFolder, incontext: RunFolder) -> Pairing:
    """`pair` from two finished run folders' outputs.jsonl (recorded hashes; no model)."""
    return pair(graft.read_rows(), incontext.read_rows())


COMPARISON = "comparison.json"


@dataclass
class ComparisonCheck:
    """Result of :func:`audit_comparison`: each listed run's audit (label -> RunCheck), each group's pairing
    re-derived from the recorded rows (group -> harness.pairing.Pairing), and findings (empty when ok)."""

    ok: bool
    findings: list[str]
    runs: dict[str, RunCheck]
    pairs: dict[str, Any]


def audit_comparison(compare_dir: str | Path) -> ComparisonCheck:
    """Re-check a compare job's folder without the model: audit every run folder comparison.json lists, then
    pair each group's graft and incontext rows again from their outputs.jsonl (harness/pairing.py) and check the
    recorded `identical_rows` / `differing_rows`. A graft row that differs from its twin is a finding even when
    the recorded counts admit it. Raises RunFolderError when comparison.json is missing or unreadable."""
    folder = RunFolder(compare_dir)
    comp = folder.read_json(COMPARISON)
    findings: list[str] = []
    runs = comp.get("runs") if isinstance(comp.get("runs"), dict) else {}
    if not runs:
        findings.append(f"{folder.file(COMPARISON)}: no 'runs' listed; the file is damaged")
    checks: dict[str, RunCheck] = {}
    for label, path in runs.items():
        try:
            checks[label] = audit(RunFolder(path))
        except RunFolderError as exc:
            findings.append(f"run {label!r} ({path}): {exc}")
            continue
        findings.extend(f"run {label!r} ({path}): {f}" for f in checks[label].findings)
    pairs: dict[str, Any] = {}
    recorded_pairs = comp.get("pairs") if isinstance(comp.get("pairs"), dict) else {}
    if "pairs" not in comp:
        findings.append(f"{folder.file(COMPARISON)}: no 'pairs' section: written before the incontext control "
                        "existed; re-run `make aime-graft` to get the graft-vs-incontext check")  # fmt: skip
    for group, rec in recorded_pairs.items():
        try:
            p = pair_folders(RunFolder(rec["graft_run"]), RunFolder(rec["incontext_run"]))
        except (KeyError, TypeError, RunFolderError) as exc:
            findings.append(f"comparison.json pairs.{group}: cannot re-pair its runs ({exc})")
            continue
        pairs[group] = p.to_json()
        for key in ("identical_rows", "differing_rows"):
            if rec.get(key) != pairs[group][key]:
                findings.append(f"comparison.json: pairs.{group}.{key} is {rec.get(key)!r} but the recorded rows "
                                f"give {pairs[group][key]!r}; the comparison or a run was edited")  # fmt: skip
        findings.extend(f"pairs.{group}: graft row differs from its incontext twin: {d}" for d in p.differences)
    return ComparisonCheck(ok=not findings, findings=findings, runs=checks, pairs=pairs)
