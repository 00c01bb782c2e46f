"""Run manifests: build the manifest of a finished run (auditing a run folder against it is harness/record/audit.py).

A manifest (``manifest.json``, format ``kvgraft-manifest/1``, described in ``harness/RUN_FORMAT.md``)
records the SHA-256 of every input of a run (problem rows, prompt template, resolved config, model and
tokenizer fingerprints, artifact ids, code commit, packages, environment, determinism settings) and of
every output (each ``outputs.jsonl`` row, its completion text and token ids, the extracted answer and
score, the file bytes and the summary). Design invariant 4: every reported number traces to a manifest
whose hashes can be re-checked without the engine; ``harness.record.audit.audit`` is that re-check.

Hashes per output row (``outputs.rows[i]``):

- ``row_sha256``: SHA-256 of the canonical JSON of the whole row;
- ``completion_sha256``: SHA-256 of the UTF-8 bytes of ``row["completion"]``;
- ``token_ids_sha256``: SHA-256 of the canonical JSON of ``row["completion_token_ids"]``
  (the prompt token ids are covered by ``row_sha256``).

Usage (``harness.record.folder.RunFolder.finish`` does this, writing the manifest last)::

    manifest = build_manifest(problems=..., prompt_template=..., config=..., ..., outputs_bytes=data)
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from harness.config.identity import MANIFEST, drop_absent
from harness.errors import ManifestError
from harness.record.hashing import canonical_json, jsonl_bytes, sha256_hex, sha256_json

__all__ = [
    "MANIFEST_FORMAT",
    "PACKAGES",
    "build_manifest",
    "code_state",
    "completion_sha256",
    "package_versions",
    "problem_id_of",
    "token_ids_sha256",
]

MANIFEST_FORMAT = "kvgraft-manifest/1"

#: Distributions whose versions every manifest records (None when not installed).
PACKAGES: tuple[str, ...] = (
    "torch",
    "transformers",
    "safetensors",
    "hydra-core",
    "mlflow",
    "sympy",
    "datasets",
    "numpy",
    "kvgraft",
)

_REPO_ROOT = Path(__file__).resolve().parents[2]


# --- hashes of single values ------------------------------------------------------------------------


def completion_sha256(completion: str) -> str:
    """SHA-256 of a completion's UTF-8 bytes (``outputs.rows[i].completion_sha256``)."""
    return sha256_hex(completion.encode("utf-8"))


def token_ids_sha256(token_ids: Sequence[int]) -> str:
    """SHA-256 of the canonical JSON of a completion's token ids (``outputs.rows[i].token_ids_sha256``)."""
    return sha256_json(list(token_ids))


def problem_id_of(problem: dict[str, Any]) -> str:
    """The id of a problem row: its ``id`` field (bundled/AIME format), else ``problem_id``."""
    pid = problem.get("id", problem.get("problem_id"))
    if pid is None:
        raise ManifestError(
            f"problem row without an 'id' (or 'problem_id') field: {str(problem)[:120]}; "
            "every problem row needs a unique id"
        )
    return str(pid)


# --- environment of the build -----------------------------------------------------------------------


def _git(*args: str) -> str | None:
    """Output of ``git <args>`` in the repository, or None if git or the repository is unavailable."""
    try:
        proc = subprocess.run(
            ["git", *args], cwd=_REPO_ROOT, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def code_state() -> dict[str, Any]:
    """``{"commit": sha|None, "dirty": bool|None}`` of the repository holding this code.

    ``dirty`` is True when ``git status --porcelain`` lists anything (modified or untracked, not ignored).
    """
    head = _git("rev-parse", "--verify", "HEAD")
    status = _git("status", "--porcelain")
    return {
        "commit": head.strip() if head else None,
        "dirty": None if status is None else bool(status.strip()),
    }


def package_versions(names: Iterable[str] = PACKAGES) -> dict[str, str | None]:
    """Installed version of each distribution in ``names`` (None when it is not installed)."""
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


# --- build ------------------------------------------------------------------------------------------


def _output_entry(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "problem_id": row["problem_id"],
        "sample": row["sample"],
        "row_sha256": sha256_json(row),
        "completion_sha256": completion_sha256(row["completion"]),
        "token_ids_sha256": token_ids_sha256(row["completion_token_ids"]),
        "extracted": row["extracted"],
        "answer": row["answer"],
        "correct": row["correct"],
    }


def build_manifest(
    *,
    problems: list[dict[str, Any]],
    prompt_template: str,
    config: dict[str, Any],
    model_fingerprint: str,
    tokenizer_fingerprint: str,
    determinism: dict[str, Any],
    environment: dict[str, Any],
    rows: list[dict[str, Any]],
    outputs_bytes: bytes,
    summary: dict[str, Any],
    library: dict[str, Any] | None = None,
    artifacts: Iterable[str] = (),
    exactness: str | None = None,
    in_flight: dict[str, Any] | None = None,
    row_schedule: str | None = None,
    exact_default: str | None = None,
) -> dict[str, Any]:
    """Return the manifest of a run (``kvgraft-manifest/1``, see ``harness/RUN_FORMAT.md``).

    ``outputs_bytes`` must be exactly the bytes written to ``outputs.jsonl`` (canonical lines of
    ``rows``); a mismatch raises :class:`ManifestError` rather than producing a manifest that can never
    verify. ``artifacts`` is merged with every non-null ``artifact_id`` of ``rows``.
    """
    if outputs_bytes != jsonl_bytes(rows):
        raise ManifestError(
            "outputs_bytes are not the canonical JSON lines of rows: write outputs.jsonl with "
            "harness.record.hashing.jsonl_bytes(rows) and pass those same bytes to build_manifest"
        )
    problem_hashes: dict[str, str] = {}
    for problem in problems:
        pid = problem_id_of(problem)
        if pid in problem_hashes:
            raise ManifestError(f"duplicate problem id {pid!r} in the run's problems; ids must be unique")
        problem_hashes[pid] = sha256_json(problem)
    artifact_ids = {str(a) for a in artifacts}
    artifact_ids.update(str(r["artifact_id"]) for r in rows if r.get("artifact_id") is not None)

    inputs: dict[str, Any] = {
        "problems": problem_hashes,
        "prompt_template": sha256_hex(prompt_template.encode("utf-8")),
        "config": sha256_json(config),
        "model_fingerprint": model_fingerprint,
        "tokenizer_fingerprint": tokenizer_fingerprint,
        "code": code_state(),
        "packages": package_versions(),
        "environment": environment,
        "determinism": determinism,
        "artifacts": sorted(artifact_ids),
    }
    if library is not None:
        inputs["library"] = library
    if exactness is not None:  # e.g. "not guaranteed exact: ..." (determinism.allow_environment_mismatch)
        inputs["exactness"] = exactness
    if exact_default is not None:  # why the exact default was off (harness.config.exact: the note it printed)
        inputs["exact_default"] = exact_default
    # problems in flight (run.in_flight > 1: N, and whether rows depend on the batch) and how the backend computed its
    # rows (where it changed after runs were recorded): each left out at its absent value (harness.config.identity)
    inputs.update(drop_absent({"in_flight": in_flight, "row_schedule": row_schedule}, MANIFEST))
    manifest: dict[str, Any] = {
        "format": MANIFEST_FORMAT,
        "inputs": inputs,
        "outputs": {
            "rows": [_output_entry(row) for row in rows],
            "outputs_sha256": sha256_hex(outputs_bytes),
            "summary_sha256": sha256_json(summary),
        },
    }
    # Round-trip through JSON so the self-hash is over exactly what a reader will parse.
    manifest = json.loads(canonical_json(manifest))
    manifest["manifest_sha256"] = sha256_json(manifest)
    return manifest
