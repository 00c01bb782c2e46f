"""The packaged GGUF models (kvstore.backends.packaged: the bundled Gemma 3 270M, and the 1.5B after
`make setup-models`) and their conversion cache.

transformers dequantizes the GGUF into a dense model; that takes a minute or two, so it is done once and saved
as an ordinary safetensors checkpoint under `$KVGRAFT_CACHE/models/<key>` (default `~/.cache/kvgraft`), keyed
by the GGUF's SHA-256, the dtype and the transformers version. Later loads read the checkpoint. The folder is
published by one atomic rename, so concurrent first loads never see a half-written checkpoint.

The checkpoint is verified before every use against what made it (issue 41, finding 6): `converted.json` beside
its files records the source GGUF's SHA-256, the converter's version, the dtype, the transformers version and the
SHA-256 of every file it wrote. A checkpoint whose record is missing (converted before the record existed), names
another source or converter, or whose files do not hash as recorded (a bit flip, an edit) is said in one line on
stderr, set aside and converted again: a damaged cache never loads under the packaged model's name.

A GGUF file given by path (`model.source=<file.gguf>`, as llama.cpp takes any GGUF) is converted and cached the same
way (`converted_gguf`), keyed and recorded by the file's SHA-256.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvstore.atomic import atomic_directory, temp_path
from kvstore.backends.packaged import BUNDLED, expected_sha256, file_sha256, gguf_path, models_cache
from kvstore.determinism import Determinism

# BUNDLED is kvstore.backends.packaged's
__all__ = ["cache_problem", "converted_checkpoint", "converted_gguf", "is_gguf_file", "write_record"]


CONVERTER = "kvgraft-gguf-dequantize/1"  # what `_convert` does; a change to it is a new version (and a rebuild)
RECORD = "converted.json"


def converted_checkpoint(det: Determinism, name: str = BUNDLED) -> Path:
    """The dense safetensors checkpoint of packaged GGUF `name` in det's dtype, converting it on first use, and
    converting it again when it does not verify against what made it (`cache_problem`)."""
    return _cached(det, name, expected_sha256(name), lambda: gguf_path(name))  # gguf_path verifies the SHA-256


def is_gguf_file(source: str) -> bool:
    """Whether a model source names a GGUF file (`model.source=<file.gguf>`), converted like the packaged ones."""
    return source.lower().endswith(".gguf") and Path(source).is_file()


def converted_gguf(det: Determinism, source: str | Path) -> Path:
    """The dense safetensors checkpoint of the GGUF file `source` in det's dtype: converted once and cached like the
    packaged models, keyed by the file's SHA-256 (so a moved or renamed copy reuses it, an edited one does not), and
    verified against its record before every use (`cache_problem`)."""
    path = Path(source).resolve()
    try:
        sha = file_sha256(path)
    except OSError as e:
        from kvstore.errors import ModelLoadError

        raise ModelLoadError(f"model source {str(source)!r}: the GGUF file cannot be read ({e.strerror or e}); give "
                             "a readable .gguf file") from None

    def verified() -> Path:  # the file must still be the one hashed above when it is converted
        if file_sha256(path) != sha:
            from kvstore.errors import ModelLoadError

            raise ModelLoadError(f"model source {str(source)!r} changed while it was being loaded; load it again")
        return path

    return _cached(det, f"gguf-file:{sha[:16]}", sha, verified, prefix="file-")


def _cached(det: Determinism, name: str, sha: str, gguf: Callable[[], Path], prefix: str = "") -> Path:
    import transformers

    # a file's cache has its own folder even when its bytes are a packaged model's (the records name their source)
    key = f"{prefix}{sha[:16]}-{det.dtype}-tf{transformers.__version__}"
    cached = models_cache() / key
    want = {"source": name, "source_sha256": sha, "converter": CONVERTER, "dtype": det.dtype,
            "transformers": transformers.__version__}
    if cached.exists():
        problem = cache_problem(cached, want)
        if problem is None:
            return cached
        print(f"kvgraft: model cache {cached}: {problem}; converting {name} again", file=sys.stderr, flush=True)
        aside = temp_path(cached)
        try:
            cached.rename(aside)  # out of the way at once (a process that mapped its files keeps them)
        except OSError:
            pass
        shutil.rmtree(aside, ignore_errors=True)
    _convert(gguf(), det, cached, want)
    problem = cache_problem(cached, want)
    if problem is not None:  # another process published a damaged copy meanwhile, or the disk lies
        from kvstore.errors import ModelLoadError

        raise ModelLoadError(f"model cache {cached}: {problem} right after converting it; remove the folder and "
                             "load again (check the disk)")
    return cached


def cache_problem(cached: Path, want: dict[str, Any]) -> str | None:
    """Why the converted checkpoint in `cached` is not verifiably what `want` (source, its SHA-256, converter,
    dtype, transformers) made: its record missing or unreadable, a fact differing, a file missing, added or not
    hashing as recorded. None when it verifies."""
    try:
        record = json.loads((cached / RECORD).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return f"no readable {RECORD} (what made it is not recorded)"
    if not isinstance(record, dict) or not isinstance(record.get("files"), dict):
        return f"{RECORD} is not a conversion record"
    for k, v in want.items():
        if record.get(k) != v:
            return f"{k} is {record.get(k)!r}, this load needs {v!r}"
    files = {p.relative_to(cached).as_posix() for p in cached.rglob("*") if p.is_file() and p.name != RECORD}
    if files != set(record["files"]):
        return f"its files {sorted(files)} are not the recorded {sorted(record['files'])}"
    for rel, sha in sorted(record["files"].items()):
        try:
            got = file_sha256(cached / rel)
        except OSError as e:
            return f"{rel} cannot be read ({e.strerror or e})"
        if got != sha:
            return f"{rel} has SHA-256 {got[:16]}, recorded {str(sha)[:16]} (modified since it was converted)"
    return None


def write_record(folder: Path, want: dict[str, Any]) -> None:
    """Record what made the checkpoint in `folder` and the SHA-256 of each of its files (`RECORD`)."""
    files = {p.relative_to(folder).as_posix(): file_sha256(p) for p in sorted(folder.rglob("*"))
             if p.is_file() and p.name != RECORD}
    (folder / RECORD).write_text(json.dumps({"format": "kvgraft-converted/1", **want, "files": files}, indent=1,
                                            sort_keys=True) + "\n", encoding="utf-8")


def _convert(gguf: Path, det: Determinism, cached: Path, want: dict[str, Any]) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # dequantize=True: a plain dense model (never packed GGUF blocks, even where GGUF kernels exist).
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=det.torch_dtype,
        quantization_config=GgufConfig(gguf_file=gguf.name, dequantize=True),
    )
    # The weights are plain tensors now; drop the GGUF marker so they save as ordinary safetensors.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    with atomic_directory(cached) as tmp:  # one rename publishes it; another process may have won the race
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        write_record(tmp, want)
