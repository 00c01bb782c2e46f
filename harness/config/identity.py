"""A run's identity, with one owner: `RunIdentity` holds the comparable key (runs that differ only in condition or
library), the resume key (what an interrupted run must share with the run that continues it), the recorded config
(config.yaml, hashed by the manifest and the resume key) and the manifest's identity inputs (problems in flight, the
row schedule), plus what a library's identity holds of its backend.

Every setting added after runs were recorded is recorded only when it differs from the value those runs had: its
"absent" rule is declared once, beside the field, in the tables below (RECORDED_ABSENT for config.yaml, COMPARABLE
for the comparable key), so a run, a compare job or a library made before the setting existed keeps its keys and its
config.yaml bytes. tests/harness/test_identity_golden.py pins the keys of a fixed set of configs: a new setting is one
line in a table here and one golden line there (docs/extending.md, "Add a run setting").

    ident = RunIdentity(backend, in_flight=c.run.in_flight)
    ident.comparable_key(c); ident.resume_key(recorded_config(cfg_dict, sections), problems, library_sha)

This module asks the backend its facts (kvstore.Backend's methods: fingerprint, settings, row_schedule,
rows_depend_on_batch, batch_invariant), each in one place; nothing here reads a setting out of `settings()`.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvstore import canonical_json

if TYPE_CHECKING:
    from kvstore import Backend

__all__ = ["BATCH_DEPENDENT", "COMPARABLE", "MANIFEST", "RECORDED_ABSENT", "RESUMABLE", "UNRECORDED_BACKEND",
           "RunIdentity", "drop_absent", "recorded_config", "sha256_json"]

#: The backend whose runs and libraries record no backend in their keys: everything made before the seam was on it.
UNRECORDED_BACKEND = "transformers"

BATCH_DEPENDENT = "rows depend on batch composition"


@dataclass(frozen=True)
class Absent:
    """A recorded field left out at the value runs had before it existed (`value`; None/True/False compared by
    identity, anything else by equality), with why."""

    value: Any
    since: str

    def holds(self, v: Any) -> bool:
        if self.value is None or isinstance(self.value, bool):
            return v is self.value
        return v == self.value


#: config.yaml (and the manifest's config hash and the resume key, which hash it): path -> its absent rule.
RECORDED_ABSENT: dict[tuple[str, ...], Absent] = {
    ("determinism", "batch_invariant"): Absent(False, "the batch-invariant mode (issue 43)"),
    ("run", "in_flight"): Absent(1, "problems in flight (issue 42)"),
    ("model", "chat"): Absent(None, "the model's chat template around prompts"),
    ("model", "trace"): Absent(None, "scoring after a reasoning trace"),
}

#: The comparable key: its fields beyond model, tokenizer, dataset, prompt, decoding and determinism, each with the
#: absent rule it is recorded under (path in the key -> rule).
COMPARABLE: dict[tuple[str, ...], Absent] = {
    ("decoding", "batch_size"): Absent(1, "batched samples (a batch need not give the bits of single rows)"),
    ("determinism", "batch_invariant"): Absent(False, "the batch-invariant mode (issue 43)"),
    ("backend",): Absent(None, "the backend seam: transformers records none (UNRECORDED_BACKEND)"),
    ("context_overflow",): Absent("refuse", "truncated prompts are other inputs; refuse changes nothing"),
    ("trace",): Absent(None, "scored after a reasoning trace: other scores for the same completions"),
    ("in_flight",): Absent(None, "problems in flight, recorded only where rows depend on the batch (issue 42)"),
    ("row_schedule",): Absent(None, "rows computed another way than the backend's first runs (vLLM greedy)"),
}

#: The resume key's fields beyond config, problems, model, tokenizer and library.
RESUMABLE: dict[tuple[str, ...], Absent] = {
    ("backend",): COMPARABLE[("backend",)],
    ("row_schedule",): COMPARABLE[("row_schedule",)],
}

#: The manifest's identity inputs (manifest.json `inputs`).
MANIFEST: dict[tuple[str, ...], Absent] = {
    ("in_flight",): Absent(None, "problems in flight: recorded at N > 1 (issue 42)"),
    ("row_schedule",): COMPARABLE[("row_schedule",)],
}


def sha256_json(obj: Any) -> str:
    """The SHA-256 of `obj`'s canonical JSON (harness/RUN_FORMAT.md: sorted keys, no spaces, UTF-8 as written): the
    hash every key is (harness.record.hashing.sha256_json, which this leaf of the config cannot import)."""
    return hashlib.sha256(canonical_json(obj, ensure_ascii=False).encode("utf-8")).hexdigest()


def drop_absent(record: dict[str, Any], rules: dict[tuple[str, ...], Absent]) -> dict[str, Any]:
    """`record` (changed in place and returned) without every field that holds its absent value under `rules`."""
    for path, rule in rules.items():
        parent: Any = record
        for part in path[:-1]:
            parent = parent.get(part) if isinstance(parent, dict) else None
        if isinstance(parent, dict) and path[-1] in parent and rule.holds(parent[path[-1]]):
            del parent[path[-1]]
    return record


def recorded_config(config: dict[str, Any], optional_sections: tuple[str, ...] = ()) -> dict[str, Any]:
    """The resolved config as a run records and hashes it (config.yaml, the resume key): every RECORDED_ABSENT field
    at its absent value left out, and each of `optional_sections` (model.<backend>, a backend section no config gave)
    left out when None, so a newly registered backend changes no earlier run's hashes. Changed in place."""
    model = config.get("model") if isinstance(config, dict) else None
    if isinstance(model, dict):
        for name in optional_sections:
            if model.get(name, 0) is None:
                del model[name]
    return drop_absent(config, RECORDED_ABSENT) if isinstance(config, dict) else config


@dataclass(frozen=True)
class RunIdentity:
    """The identity of a run on `backend` with `in_flight` problems decoded together (module docstring)."""

    be: Backend
    in_flight: int = 1

    def backend_record(self) -> dict[str, Any] | None:
        """What a recorded key (a run's comparable and resume keys, a library's identity) holds of its backend: None
        for transformers (its determinism settings are in the keys already, and everything made before the seam
        keeps its keys), else {"backend": name, "settings": settings()} (llama.cpp: every setting and build fact).

        The one place the harness compares a backend's name with a string (docs/extending.md): a recorded key is a
        promise, and the keys of every run and library made before backends existed hold no backend."""
        be = self.be
        return None if be.name == UNRECORDED_BACKEND else {"backend": be.name, "settings": be.settings()}

    def rows_depend_on_batch(self) -> bool:
        """Whether this run's rows may differ in their bits from the same rows decoded one problem at a time (the
        backend's fact, for this run's in_flight)."""
        return self.be.rows_depend_on_batch(self.in_flight)

    def comparable_key(self, c: Any) -> str:
        """Runs with the same key differ only in condition/library: same model, data, prompt, decoding (batch size
        included: a batch need not give the bits of single rows), settings, backend (`c`: the typed Config)."""
        d = dataclasses.asdict(c)
        key = {
            "model": self.be.fingerprint,
            "tokenizer": self.be.tokenizer_fingerprint,
            **{k: d[k] for k in ("dataset", "prompt", "decoding", "determinism")},
            "backend": self.backend_record(),
            "context_overflow": d["run"]["context_overflow"],
            "trace": d["model"].get("trace"),
            "in_flight": d["run"]["in_flight"] if self.rows_depend_on_batch() else None,
            "row_schedule": self.be.row_schedule(),
        }
        return sha256_json(drop_absent(key, COMPARABLE))

    def resume_key(self, config: dict[str, Any], problems: list[Any], library: str | None) -> str:
        """What an interrupted run must share with this one to be resumed by it: the recorded config (run.fresh left
        out), the problem rows, the model and tokenizer fingerprints, the backend and the library manifest."""
        config = copy.deepcopy(config)
        config.get("run", {}).pop("fresh", None)
        key = {
            "config": config, "problems": [p.to_row() for p in problems], "model": self.be.fingerprint,
            "tokenizer": self.be.tokenizer_fingerprint, "library": library,
            "backend": self.backend_record(), "row_schedule": self.be.row_schedule(),
        }
        return sha256_json(drop_absent(key, RESUMABLE))

    def in_flight_record(self) -> dict[str, Any] | None:
        """The manifest's `inputs.in_flight` (None at 1: recorded as before the setting existed)."""
        if self.in_flight <= 1:
            return None
        depends = self.rows_depend_on_batch()
        note = BATCH_DEPENDENT if depends else "rows equal one problem at a time (determinism.batch_invariant)"
        return {"problems": self.in_flight, "rows_depend_on_batch_composition": depends, "note": note}

    def manifest_inputs(self) -> dict[str, Any]:
        """The manifest's identity inputs beyond the config: `in_flight` and `row_schedule` (keyword arguments of
        harness.record.manifest.build_manifest, which leaves each out at its MANIFEST absent value)."""
        return {"in_flight": self.in_flight_record(), "row_schedule": self.be.row_schedule()}

    def library_fields(self) -> dict[str, Any]:
        """What a library's identity holds of its backend: backend and its settings (absent for transformers) and
        the batch-invariant mode (absent when off: every library folder made before it stays)."""
        out: dict[str, Any] = {}
        record = self.backend_record()
        if record is not None:
            out["backend"] = record["backend"]
            out["backend_settings"] = record["settings"]  # llama.cpp: n_ctx, n_batch, ... and its build
        if self.be.batch_invariant():  # its own artifacts
            out["batch_invariant"] = True
        return out
