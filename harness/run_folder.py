"""The run folder: the one owner of its on-disk layout (harness/RUN_FORMAT.md). It names a new folder, appends
rows as they finish, writes every file atomically with the manifest last, and reads a folder back into the
typed records of harness/record.py. Auditing a folder is harness/audit.py; building a manifest is
harness/manifest.py.

    folder = RunFolder.new(runs_dir, "baseline")           # runs/baseline/<YYYY-mm-dd_HH-MM-SS-ffffff>/
    folder.begin(); folder.append(row) ...
    folder.finish(config=..., problems=..., rows=rows, summary=summary, prompt_template=..., ...)
    RunFolder(path).read_rows(), .read_summary(), .read_config()
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from harness.errors import RunFolderError
from harness.hashing import atomic_write_text, jsonl_bytes, write_json, write_jsonl
from harness.manifest import build_manifest
from harness.record import Row, Summary

CONFIG, PROBLEMS, OUTPUTS, PARTIAL = "config.yaml", "problems.jsonl", "outputs.jsonl", "outputs.partial.jsonl"
SUMMARY, MANIFEST, TRACKING = "summary.json", "manifest.json", "tracking.json"
#: The one spelling of a run folder's name (configs/config.yaml's hydra.run.dir uses the same pattern).
STAMP_FORMAT = "%Y-%m-%d_%H-%M-%S-%f"
_NOT_RUNS = {"mlartifacts", "library", "store", "compare"}  # folders under runs/ that hold no run folders


def stamp() -> str:
    """The current time as a run-folder name (STAMP_FORMAT)."""
    return datetime.now().strftime(STAMP_FORMAT)


class RunFolder:
    """One run's folder: `runs/<condition>/<stamp>[-<label>]/` (a multirun job: `<sweep>/<job>_<condition>/`)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    @classmethod
    def new(cls, runs_dir: str | Path, condition: str, label: str | None = None) -> RunFolder:
        """A fresh folder name under `runs_dir` (not created until `begin`)."""
        return cls(Path(runs_dir) / condition / (stamp() + (f"-{label}" if label else "")))

    @property
    def name(self) -> str:
        return self.path.name

    def __repr__(self) -> str:
        return f"RunFolder({str(self.path)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RunFolder) and self.path.resolve() == other.path.resolve()

    def __hash__(self) -> int:
        return hash(self.path.resolve())

    def file(self, name: str) -> Path:
        return self.path / name

    def is_complete(self) -> bool:
        """A folder is complete once its manifest exists (it is written last)."""
        return self.file(MANIFEST).is_file()

    # --- writing ----------------------------------------------------------------------------------------

    def begin(self) -> None:
        """Create the folder and drop rows a previous, interrupted attempt left in it."""
        self.path.mkdir(parents=True, exist_ok=True)
        self.file(PARTIAL).unlink(missing_ok=True)

    def append(self, row: Row) -> None:
        """Append one finished row to outputs.partial.jsonl: nothing is lost if the run is interrupted."""
        with self.file(PARTIAL).open("ab") as f:
            f.write(jsonl_bytes([row.to_json()]))

    def finish(
        self,
        *,
        config: dict[str, Any],
        problems: list[dict[str, Any]],
        rows: Sequence[Row],
        summary: Summary,
        **manifest_inputs: Any,
    ) -> dict[str, Any]:
        """Write config.yaml, problems.jsonl, outputs.jsonl, summary.json, then manifest.json (last: a folder
        without it is incomplete), each atomically; remove the partial rows. `manifest_inputs` are the other
        keyword arguments of `harness.manifest.build_manifest`. Returns the manifest."""
        from omegaconf import OmegaConf

        self.path.mkdir(parents=True, exist_ok=True)
        row_dicts = [r.to_json() for r in rows]
        outputs = jsonl_bytes(row_dicts)
        summary_dict = summary.to_json()
        atomic_write_text(self.file(CONFIG), OmegaConf.to_yaml(OmegaConf.create(config)))
        write_jsonl(self.file(PROBLEMS), problems)
        write_jsonl(self.file(OUTPUTS), row_dicts)
        write_json(self.file(SUMMARY), summary_dict)
        manifest = build_manifest(
            problems=problems, config=config, rows=row_dicts, outputs_bytes=outputs, summary=summary_dict,
            **manifest_inputs,
        )  # fmt: skip
        write_json(self.file(MANIFEST), manifest)
        self.file(PARTIAL).unlink(missing_ok=True)
        return manifest

    def write_tracking(self, record: dict[str, Any]) -> None:
        """tracking.json: the MLflow run id and URI, or why logging is pending (written by harness.tracking)."""
        write_json(self.file(TRACKING), record)

    # --- reading ----------------------------------------------------------------------------------------

    def read_bytes(self, name: str) -> bytes:
        path = self.file(name)
        try:
            return path.read_bytes()
        except FileNotFoundError:
            raise RunFolderError(
                f"{path}: file is missing; a complete run folder has it (harness/RUN_FORMAT.md). "
                "Pass a finished run folder, or re-run."
            ) from None
        except OSError as exc:
            raise RunFolderError(f"{path}: cannot read it ({exc.strerror or exc}); check permissions") from exc

    def read_json(self, name: str) -> dict[str, Any]:
        path = self.file(name)
        try:
            obj = json.loads(self.read_bytes(name).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise RunFolderError(f"{path}: not valid UTF-8 JSON ({exc}); restore the file from the run") from exc
        if not isinstance(obj, dict):
            raise RunFolderError(f"{path}: expected a JSON object, found {type(obj).__name__}")
        return obj

    def read_jsonl(self, name: str) -> list[dict[str, Any]]:
        out = []
        for i, line in enumerate(self.read_bytes(name).splitlines(), start=1):
            try:
                obj = json.loads(line.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise RunFolderError(f"{self.file(name)}, line {i}: not valid UTF-8 JSON ({exc})") from exc
            if not isinstance(obj, dict):
                raise RunFolderError(f"{self.file(name)}, line {i}: expected a JSON object")
            out.append(obj)
        return out

    def read_config(self) -> dict[str, Any]:
        """The resolved config as written (config.yaml)."""
        import yaml

        try:
            config = yaml.safe_load(self.read_bytes(CONFIG).decode("utf-8"))
        except (UnicodeDecodeError, yaml.YAMLError) as exc:
            raise RunFolderError(f"{self.file(CONFIG)}: not valid YAML ({exc}); restore it from the run") from exc
        if config is None:
            return {}
        if not isinstance(config, dict):
            raise RunFolderError(f"{self.file(CONFIG)}: expected a mapping, found {type(config).__name__}")
        return config

    def read_problems(self) -> list[dict[str, Any]]:
        return self.read_jsonl(PROBLEMS)

    def read_rows(self, partial: bool = False) -> list[Row]:
        """outputs.jsonl (or, with `partial`, the rows an interrupted run left) as typed rows."""
        name = PARTIAL if partial else OUTPUTS
        rows = []
        for i, d in enumerate(self.read_jsonl(name), start=1):
            try:
                rows.append(Row.from_json(d))
            except KeyError as exc:
                raise RunFolderError(
                    f"{self.file(name)}, line {i}: field {exc.args[0]!r} is missing; the row does not follow "
                    "harness/RUN_FORMAT.md (edited, or written by another format)"
                ) from None
        return rows

    def read_summary(self) -> Summary:
        d = self.read_json(SUMMARY)
        try:
            return Summary.from_json(d)
        except KeyError as exc:
            raise RunFolderError(f"{self.file(SUMMARY)}: field {exc.args[0]!r} is missing") from None

    def read_manifest(self) -> dict[str, Any]:
        return self.read_json(MANIFEST)

    def read_tracking(self) -> dict[str, Any]:
        """tracking.json, or {} when the run was never logged (or the file is unreadable)."""
        try:
            return self.read_json(TRACKING)
        except RunFolderError:
            return {}

    @staticmethod
    def find(runs_dir: str | Path) -> Iterator[RunFolder]:
        """Every complete run folder under `runs_dir` (skipping MLflow's copies, libraries and comparisons)."""
        root = Path(runs_dir)
        for manifest in sorted(root.glob(f"**/{MANIFEST}")):
            rel = manifest.relative_to(root).parts
            if rel and rel[0] in _NOT_RUNS:
                continue
            if manifest.parent.joinpath(SUMMARY).is_file():
                yield RunFolder(manifest.parent)
