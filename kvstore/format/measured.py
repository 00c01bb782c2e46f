"""The numerics record's capability (issue 61): a store writes a numerics record only for a measurement.

    record = issue(fingerprint, snapshot, source)    # the measuring code only: the transformers capture
    fp = measured_fingerprint(snapshot.numerics, aid)  # a store's put: the fingerprint to record, or None

A numerics record (`numerics:<sha256>`, kvstore/FORMAT.md section 8) says "these bytes were computed here under these
numerics". Only the code that measured the fingerprint and computed the bytes may say it. `issue` makes a
`Measurement` bound to the bytes' id (their content id, computed from the snapshot at capture) and keeps it in this
process's set of issued measurements; a store records a snapshot's numerics only when its record carries one of
those, bound to the id of the bytes it is putting. Everything else is a claim, and is not written: a tag string given
to a put, a `NumericsRecord` built by hand (or copied: a copy is not the issued object), a record read from another
store or a bundle, one issued in another process (a worker's, pickled back), and a measured snapshot whose tensors
or metadata changed after capture (other bytes, another id). The one caller of `issue` is
kvstore/backends/transformers/capture.py, the capture that measured (tests/kvstore/test_evidence_round_two.py
checks it).

What it cannot tell: code in the same process that edits the engine's own cache between its prefill and its capture
(that is the engine computing other bytes, like an edit of the loaded weights in memory).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

from kvstore.format.artifact import NumericsRecord, Snapshot, content_id, to_bytes

_ISSUED: weakref.WeakSet[Measurement] = weakref.WeakSet()


@dataclass(frozen=True, eq=False)  # identity: only the issued object is in _ISSUED, never an equal copy
class Measurement:
    """A numerics fingerprint measured by this process for the bytes it computed (their content id)."""

    fingerprint: str
    artifact_id: str


def issue(fingerprint: str, snapshot: Snapshot, source: str) -> NumericsRecord:
    """The measured numerics record of a snapshot this process just computed (the capture's; nobody else calls it).
    Costs one serialization and hash of the snapshot: the record is bound to its bytes."""
    m = Measurement(str(fingerprint), content_id(to_bytes(snapshot)))
    _ISSUED.add(m)
    return NumericsRecord((m.fingerprint,), source, measurement=m)


def measured_fingerprint(record: Any, artifact_id: str) -> str | None:
    """The fingerprint a store may record for the artifact `artifact_id` from a snapshot's `record`: the issued
    measurement's, when the record carries one this process issued for exactly these bytes and names only its
    fingerprint; None otherwise (a claim: nothing is written)."""
    m = getattr(record, "measurement", None)
    if not isinstance(m, Measurement) or m not in _ISSUED or m.artifact_id != str(artifact_id):
        return None
    return m.fingerprint if tuple(record.fingerprints) == (m.fingerprint,) else None


__all__ = ["Measurement", "issue", "measured_fingerprint"]
