"""The run folder: the one owner of its on-disk layout (harness/RUN_FORMAT.md). It names a new folder, appends
rows as they finish, writes every file atomically with the manifest last, and reads a folder back into the
typed records of harness/record/rows.py. Auditing a folder is harness/record/audit.py; building a manifest is
harness/record/manifest.py.

    folder = RunFolder.new(runs_dir, "baseline")   # runs/baseline/<YYYY-mm-dd_HH-MM-SS-ffffff>/, created exclusively
    folder.begin(resume_key); folder.append(row) ...
    folder.finish(config=..., problems=..., rows=rows, summary=summary, prompt_template=..., ...)
    RunFolder(path).read_rows(), .read_summary(), .read_config()

Names never collide: `claim` creates a folder with mkdir (no exist_ok) and takes the next `-2`, `-3` ... suffix
when the name is taken, so two writers never share one (Hydra's run and sweep dirs go through it too, via the
`kvgraft.claim_dir` resolver in harness/config/schema.py). A writer holds an flock on `run.lock` while it writes; a
folder whose writer died (kill -9) keeps `resume.json` and `outputs.partial.jsonl`, and `find_resumable` hands
it to the next run with the same resume key (harness/run/loop.py).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from harness.errors import RunFolderError, storage_error
from harness.record.hashing import atomic_write_text, jsonl_bytes, write_json, write_jsonl
from harness.record.manifest import build_manifest
from harness.record.rows import Row, Summary

CONFIG, PROBLEMS, OUTPUTS, PARTIAL = "config.yaml", "problems.jsonl", "outputs.jsonl", "outputs.partial.jsonl"
SUMMARY, MANIFEST, TRACKING = "summary.json", "manifest.json", "tracking.json"
RESUME, LOCK = "resume.json", "run.lock"  # only while a run is incomplete (removed by finish)
#: What an unfinished folder may hold and still count as empty (no rows): Hydra's record of the job, our markers.
_EMPTY_OK = {".hydra", "__main__.log", RESUME, LOCK, PARTIAL}
#: The one spelling of a run folder's name (configs/config.yaml's hydra.run.dir uses the same pattern).
STAMP_FORMAT = "%Y-%m-%d_%H-%M-%S-%f"
_NOT_RUNS = {"mlartifacts", "library", "store", "compare"}  # folders under runs/ that hold no run folders


def stamp() -> str:
    """The current time as a run-folder name (STAMP_FORMAT)."""
    return datetime.now().strftime(STAMP_FORMAT)


def claim(parent: str | Path, name: str) -> Path:
    """Create `parent/name` exclusively and return it; `name-2`, `name-3` ... when it exists (another run, another
    sweep, the same second). A full disk or a read-only `parent` is a one-line StorageError naming it."""
    parent = Path(parent)
    try:
        parent.mkdir(parents=True, exist_ok=True)
        for i in range(1, 10_000):
            path = parent / (name if i == 1 else f"{name}-{i}")
            try:
                path.mkdir()
            except FileExistsError:
                continue
            return path
    except OSError as exc:
        raise storage_error(exc, parent, "creating a run folder") or RunFolderError(
            f"{parent}: cannot create a run folder there ({exc.strerror or exc})"
        ) from None
    raise RunFolderError(f"{parent}: 10,000 folders named {name}[-N] exist; clean it up or use another runs_dir")


@dataclass(frozen=True)
class FinishedRun:
    """What a finished run folder holds, as written (`RunFolder.finish`) or read back (`RunFolder.finished`):
    the typed records a logger or a comparison takes instead of re-reading the files."""

    folder: RunFolder
    config: dict[str, Any]
    problems: list[dict[str, Any]]
    rows: list[Row]
    summary: Summary
    manifest: dict[str, Any]


class RunFolder:
    """One run's folder: `runs/<condition>/<stamp>[-<label>]/` (a multirun job: `<sweep>/<job>_<condition>/`)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock_fd: int | None = None
        self._held: dict[str, bytes] | None = None  # `held`: the bytes of each file as first read

    def held(self) -> RunFolder:
        """The same folder read once: each file's bytes are kept as first read, and every later read of it returns
        those bytes. An audit and the records taken after it then see the same bytes (issue 61: a reader uses the
        bytes it audited, never a second read a writer could have changed in between)."""
        folder = RunFolder(self.path)
        folder._held = {}
        return folder

    @classmethod
    def new(cls, runs_dir: str | Path, condition: str, label: str | None = None) -> RunFolder:
        """A fresh folder under `runs_dir/condition`, created now and exclusively (`claim`): no other writer gets
        the same one. A run that fails before its first row removes it again (`discard`)."""
        return cls(claim(Path(runs_dir) / condition, stamp() + (f"-{label}" if label else "")))

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

    def _storage(self, exc: OSError, doing: str) -> Exception:
        return storage_error(exc, self.path, doing) or RunFolderError(
            f"{exc.filename or self.path}: {exc.strerror or exc} while {doing}"
        )

    def lock(self) -> bool:
        """Take this folder's writer lock (an flock on run.lock, released when the process dies, kill -9 included);
        False when another live process holds it. Creates the folder."""
        if self._lock_fd is not None:
            return True
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.file(LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise self._storage(exc, "locking the run folder") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._lock_fd = fd
        return True

    def release(self) -> None:
        """Drop the writer lock (the folder stays resumable when it is incomplete)."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def begin(self, resume_key: str | None = None, started_at: str | None = None) -> None:
        """Start a fresh attempt: lock the folder, drop rows a previous attempt left in it and record the key a
        later run resumes it by (resume.json)."""
        if not self.lock():
            raise RunFolderError(f"{self.path}: another process is writing this run folder; use another folder")
        try:
            self.file(PARTIAL).unlink(missing_ok=True)
            write_json(self.file(RESUME), {"resume_key": resume_key, "started_at": started_at})
        except OSError as exc:
            raise self._storage(exc, "starting the run") from None

    def resume_info(self) -> dict[str, Any]:
        """resume.json ({resume_key, started_at}), or {} when there is none or it cannot be read."""
        try:
            info = json.loads(self.file(RESUME).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            return {}
        return info if isinstance(info, dict) else {}

    def resume(self) -> list[Row]:
        """The rows an interrupted attempt left (outputs.partial.jsonl), the folder locked for this one. A last line
        cut off by the kill (no newline) is dropped and the file rewritten without it; any other bad line is a
        RunFolderError naming it."""
        if not self.lock():
            raise RunFolderError(f"{self.path}: another process is writing this run folder; use another folder")
        path = self.file(PARTIAL)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise self._storage(exc, "reading the interrupted run's rows") from None
        complete = data[: data.rfind(b"\n") + 1]  # a torn last line (killed mid-write) has no newline
        rows = []
        for i, line in enumerate(complete.splitlines(), start=1):
            try:
                rows.append(Row.from_json(json.loads(line.decode("utf-8"))))
            except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
                raise RunFolderError(
                    f"{path}, line {i}: not a row of this run ({type(exc).__name__}: {exc}); start over with "
                    "run.fresh=true"
                ) from None
        if complete != data:
            self.keep_rows(rows)
        return rows

    def keep_rows(self, rows: Sequence[Row]) -> None:
        """Rewrite outputs.partial.jsonl with exactly `rows` (atomically): what a resumed attempt continues from."""
        try:
            write_jsonl(self.file(PARTIAL), [r.to_json() for r in rows])
        except OSError as exc:
            raise self._storage(exc, "rewriting the interrupted run's rows") from None

    def append(self, row: Row) -> None:
        """Append one finished row to outputs.partial.jsonl: nothing is lost if the run is interrupted."""
        try:
            with self.file(PARTIAL).open("ab") as f:
                f.write(jsonl_bytes([row.to_json()]))
                f.flush()
        except OSError as exc:
            raise self._storage(exc, "appending a row to the run folder") from None

    def has_rows(self) -> bool:
        p = self.file(PARTIAL)
        return self.is_complete() or (p.is_file() and p.stat().st_size > 0)

    def discard(self) -> bool:
        """Remove the folder when it holds no rows and nothing but Hydra's record and our markers (a run that failed
        or stopped before its first row); True when removed. A folder with rows, or anything else, is kept."""
        try:
            names = {p.name for p in self.path.iterdir()}
        except FileNotFoundError:
            return False
        if self.has_rows() or not names <= _EMPTY_OK:
            return False
        self.release()
        shutil.rmtree(self.path, ignore_errors=True)
        return not self.path.exists()

    @staticmethod
    def find_resumable(search: str | Path, resume_key: str) -> RunFolder | None:
        """The newest incomplete folder directly under `search` left by a run with `resume_key` whose writer is
        gone, returned locked; None when there is none."""
        candidates = []
        for marker in Path(search).glob(f"*/{RESUME}"):
            folder = RunFolder(marker.parent)
            if not folder.is_complete() and folder.resume_info().get("resume_key") == resume_key:
                candidates.append((marker.stat().st_mtime, folder))
        for _, folder in sorted(candidates, key=lambda t: t[0], reverse=True):
            if folder.lock():
                return folder
        return None

    def finish(
        self,
        *,
        config: dict[str, Any],
        problems: list[dict[str, Any]],
        rows: Sequence[Row],
        summary: Summary,
        **manifest_inputs: Any,
    ) -> FinishedRun:
        """Write config.yaml, problems.jsonl, outputs.jsonl, summary.json, then manifest.json (last: a folder
        without it is incomplete), each atomically; remove the partial rows. `manifest_inputs` are the other
        keyword arguments of `harness.record.manifest.build_manifest`. Returns the records it wrote."""
        from omegaconf import OmegaConf

        row_dicts = [r.to_json() for r in rows]
        outputs = jsonl_bytes(row_dicts)
        summary_dict = summary.to_json()
        manifest = build_manifest(
            problems=problems, config=config, rows=row_dicts, outputs_bytes=outputs, summary=summary_dict,
            **manifest_inputs,
        )
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.file(CONFIG), OmegaConf.to_yaml(OmegaConf.create(config)))
            write_jsonl(self.file(PROBLEMS), problems)
            write_jsonl(self.file(OUTPUTS), row_dicts)
            write_json(self.file(SUMMARY), summary_dict)
            write_json(self.file(MANIFEST), manifest)
            for name in (PARTIAL, RESUME, LOCK):
                self.file(name).unlink(missing_ok=True)
        except OSError as exc:
            raise self._storage(exc, "writing the finished run (its rows stay in outputs.partial.jsonl)") from None
        self.release()
        return FinishedRun(self, config, list(problems), list(rows), summary, manifest)

    def finished(self) -> FinishedRun:
        """The records of this complete folder, read back (a RunFolderError names the file that is missing)."""
        return FinishedRun(self, self.read_config(), self.read_problems(), self.read_rows(), self.read_summary(),
                           self.read_manifest())

    def write_tracking(self, record: dict[str, Any]) -> None:
        """tracking.json: the MLflow run id and URI, or why logging is pending (written by harness.tracking.log)."""
        write_json(self.file(TRACKING), record)

    # --- reading ----------------------------------------------------------------------------------------

    def read_bytes(self, name: str) -> bytes:
        if self._held is not None and name in self._held:
            return self._held[name]
        path = self.file(name)
        try:
            data = path.read_bytes()
            if self._held is not None:
                self._held[name] = data
            return data
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
