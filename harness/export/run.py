"""The export entry point: `export_run(run_dir, fmt, out)` reads a finished run folder (common.Exported) and writes it
with the format's writer (lm_eval.write, every_eval_ever.write) under `out`; `python -m harness.export` calls it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from harness.errors import RunFolderError, storage_error
from harness.export.common import Exported
from harness.export.every_eval_ever import write as write_every_eval_ever
from harness.export.lm_eval import write as write_lm_eval

__all__ = ["FORMATS", "export_run"]

WRITERS: dict[str, Callable[[Exported, Path], list[Path]]] = {"lm-eval": write_lm_eval,
                                                             "every-eval-ever": write_every_eval_ever}
FORMATS = tuple(WRITERS)  # --format's choices


def export_run(run_dir: str | Path, fmt: str, out: str | Path) -> list[Path]:
    """Write `run_dir`'s rows in format `fmt` (one of FORMATS) under `out`; returns the files written."""
    if fmt not in WRITERS:
        raise RunFolderError(f"--format {fmt!r}: use one of {', '.join(FORMATS)}")
    out = Path(out)
    run = Exported.read(run_dir)  # audited first: nothing is written for a folder that does not re-check
    try:
        out.mkdir(parents=True, exist_ok=True)
        return WRITERS[fmt](run, out)
    except OSError as exc:
        raise storage_error(exc, out, "writing the export") or RunFolderError(
            f"{out}: cannot write the export there ({exc.strerror or exc}); pass another --out") from None
