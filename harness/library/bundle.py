"""A solution library as one bundle file: its folder's files (harness.library.build.LIBRARY_FILES) travel as the
bundle's opaque attachments, its entries' artifacts as the bundle's artifacts (kvstore/bundle/bundle.py, FORMAT.md
section 7). The engine moves and verifies bytes; what makes the files a library is checked here, by the one
owner of the library folder (`harness.library.build.Library`, which re-checks the manifest's hash, every entry's hash
and the index SHA-256), on export before anything is written and on import before anything is published.

    python -m harness.library.bundle export --library runs/library/<lib> --store runs/store -o lib.kvb
    python -m harness.library.bundle import lib.kvb --store other/store --library-dir other/library/<lib>
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

from harness.errors import LibraryError, exit_on_error
from harness.library.build import LIBRARY_FILES, Library
from kvstore import BundleInfo, Store, export_bundle, import_bundle, open_store

__all__ = ["export_library", "import_library", "library_artifact_ids"]


def library_artifact_ids(files: Mapping[str, bytes], where: str) -> list[str]:
    """Check that `files` are a complete, unmodified library (harness.library.build.Library's checks, on a private copy)
    and return the artifact id of every entry. LibraryError names what is wrong."""
    if set(files) != set(LIBRARY_FILES):
        raise LibraryError(f"{where}: a library is exactly {', '.join(LIBRARY_FILES)}, found {sorted(files)}; "
                           "export the library folder with `python -m harness.library.bundle export`")
    with tempfile.TemporaryDirectory(prefix="kvgraft-library-") as tmp:
        for name, data in files.items():
            (Path(tmp) / name).write_bytes(data)
        try:
            entries = Library(Path(tmp), None).entries  # type: ignore[arg-type]  (no lookups: no store needed)
        except LibraryError as e:
            raise LibraryError(f"{where}: {str(e).replace(tmp, 'library')}") from None
    return [e.artifact_id for e in entries]


def export_library(store: Store, folder: str | Path, out: str | Path, ids: Iterable[str] = ()) -> BundleInfo:
    """Write the library in `folder` (its files, every entry's artifact read from `store`), plus any extra
    artifact `ids`, as one bundle at `out`."""
    folder = Path(folder)
    try:
        files = {name: (folder / name).read_bytes() for name in LIBRARY_FILES}
    except OSError as e:
        raise LibraryError(f"{folder} is not a library folder (needs {', '.join(LIBRARY_FILES)}): {e}") from None
    wanted = library_artifact_ids(files, str(folder))
    return export_bundle(store, [*ids, *wanted], out, attachments=files)


def import_library(bundle: str | Path, store: Store, folder: str | Path) -> BundleInfo:
    """Verify the bundle (every byte, and that its attachments are a library whose every entry's artifact it
    carries), then add its artifacts to `store` and write the library into `folder` (manifest.json last: a
    folder without it is an incomplete library). All or nothing, as kvstore.bundle.bundle.import_bundle."""

    def check(files: Mapping[str, bytes], ids: frozenset[str]) -> None:
        missing = [aid for aid in library_artifact_ids(files, f"{bundle}: attachments") if aid not in ids]
        if missing:
            raise LibraryError(f"{bundle}: the library names {len(missing)} artifact(s) the bundle does not carry "
                               f"(first {missing[0]}); export it again with `python -m harness.library.bundle "
                               "export`")

    return import_bundle(bundle, store, attachments_dir=folder, check=check)


@exit_on_error
def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    e = sub.add_parser("export", help="a library folder and its artifacts as one bundle file")
    e.add_argument("--library", type=Path, required=True, metavar="DIR")
    e.add_argument("--store", required=True, help="the store holding its artifacts (folder or s3://bucket/prefix)")
    e.add_argument("-o", "--output", type=Path, required=True, metavar="BUNDLE")
    i = sub.add_parser("import", help="verify a library bundle, then add its artifacts and write the library")
    i.add_argument("bundle", type=Path, metavar="BUNDLE")
    i.add_argument("--store", required=True)
    i.add_argument("--library-dir", type=Path, required=True, metavar="DIR")
    args = ap.parse_args(argv)
    store = open_store(args.store)
    if args.command == "export":
        info = export_library(store, args.library, args.output)
        print(f"exported library {args.library} ({len(info.artifacts)} artifacts, {info.size} bytes) to {info.path}; "
              f"bundle sha256 {info.sha256}")
    else:
        info = import_library(args.bundle, store, args.library_dir)
        print(f"imported {len(info.artifacts)} artifacts ({len(info.added)} new) into {args.store}; library written "
              f"to {args.library_dir}")


if __name__ == "__main__":
    main()
