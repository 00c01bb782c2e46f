"""What every export shares: the finished run read back (never written) with its per-row manifest entries
(`Exported`), and the provenance each exported sample carries (`provenance`); the writers are lm_eval.py and
every_eval_ever.py, the entry point `export_run` is run.py.

Every exported sample carries kvgraft's proof of origin beside the other tool's own fields: the run's
`manifest_sha256`, the model and tokenizer fingerprints (SHA-256 over the weights, not a name), and the row's
`row_sha256`, `completion_sha256` and `token_ids_sha256` exactly as manifest.json lists them; a problem's hash is the
manifest's `inputs.problems[<id>]` (SHA-256 of the canonical JSON of the problem row).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import RunFolderError
from harness.record.audit import audited
from harness.record.folder import FinishedRun
from harness.record.rows import Row

__all__ = ["Exported", "provenance"]


@dataclass(frozen=True)
class Exported:
    """A finished run and, per row (in outputs.jsonl order), its manifest entry."""

    run: FinishedRun
    entries: list[dict[str, Any]]  # manifest outputs.rows, one per row

    @classmethod
    def read(cls, run_dir: str | Path) -> Exported:
        """The run, read only after it re-checks (harness.record.audit.audited, what `make rescore` runs): an edited
        folder is refused naming its first difference, so no exported sample carries an edited score beside the
        hashes of the unedited row."""
        run = audited(run_dir, "the export")
        entries = list((run.manifest.get("outputs") or {}).get("rows") or [])
        if len(entries) != len(run.rows) or any((e.get("problem_id"), e.get("sample")) != (r.problem_id, r.sample)
                                                 for e, r in zip(entries, run.rows, strict=False)):
            raise RunFolderError(f"{run.folder.path}: manifest.json outputs.rows do not list outputs.jsonl's rows in "
                                 "order; run `make rescore RUN=...` to see what changed")
        return cls(run, entries)

    @property
    def problems(self) -> dict[str, dict[str, Any]]:
        """Problem rows by id, in problems.jsonl order."""
        return {str(p.get("id")): p for p in self.run.problems}

    def problem_hash(self, problem_id: str) -> str:
        return str(self.run.manifest["inputs"]["problems"][problem_id])

    def budget(self) -> int | None:
        """decoding.max_new_tokens of the run's config."""
        value = (self.run.config.get("decoding") or {}).get("max_new_tokens")
        return int(value) if value is not None else None

    def task(self) -> str:
        """A task name for the other tool: dataset, condition and group (`kvgraft_original-graft-held_out`)."""
        s = self.run.summary
        return "-".join(x for x in (s.dataset, s.condition, s.group) if x)


def provenance(ex: Exported, row: Row, entry: dict[str, Any]) -> dict[str, Any]:
    """kvgraft's hashes and facts for one exported row."""
    inputs = ex.run.manifest.get("inputs") or {}
    c = row.completion
    return {
        "manifest_sha256": ex.run.manifest.get("manifest_sha256"), "run_folder": ex.run.folder.name,
        "model_fingerprint": inputs.get("model_fingerprint"),
        "tokenizer_fingerprint": inputs.get("tokenizer_fingerprint"),
        "problem_sha256": ex.problem_hash(row.problem_id), "row_sha256": entry.get("row_sha256"),
        "completion_sha256": entry.get("completion_sha256"), "token_ids_sha256": entry.get("token_ids_sha256"),
        "problem_id": row.problem_id, "sample": row.sample, "condition": row.condition, "group": row.group,
        "stop_reason": c.stop_reason, "max_new_tokens": ex.budget(), "seed": c.seed,
        "prompt_tokens": len(c.context_ids), "grafted_tokens": c.grafted_tokens, "decode_tokens": c.decode_tokens,
        "entry_id": c.retrieval.entry_id if c.retrieval else None,
        "trace_close": row.trace_close, "overlong": row.overlong,
    }
