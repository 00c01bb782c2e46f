"""The artifact's bytes, with no I/O (kvstore/FORMAT.md is the spec): artifact.py (Snapshot, LayerKV, to_bytes /
from_bytes, content_id, check_snapshot), framing.py (the safetensors header and tensors over the bytes),
invariants.py (every metadata invariant of FORMAT.md section 6), canonical.py (canonical JSON), ids.py (ArtifactId
and its path). Public names are re-exported by the kvstore face."""
