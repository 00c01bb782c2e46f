"""A library whose artifacts were deposited in another compute environment: grafts are refused, a run that
opts in is marked "not guaranteed exact", and `python -m harness.library --redeposit` re-deposits the entries
here, keeping entry ids, after which grafts are exact again (tiny random-weight model)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from harness.config.model import load_model
from harness.config.schema import compose_config, typed
from harness.library.build import _write_library, build_library, main, open_library, redeposit_library
from harness.run.loop import run
from kvstore import IncompatibleError, check_graft
from kvstore.backends.transformers import TransformersBackend

REPO = Path(__file__).resolve().parents[2]
ELSEWHERE = {"cpu_vendor": "GenuineIntel", "cpu_model": "Intel(R) Xeon(R) Platinum", "mkl_cbwr": "AVX512"}


def _overrides(tmp: Path, *extra: str) -> list[str]:
    # the default mode, bound to the CPU's names (in the batch-invariant mode the mode's numerics fingerprint is the
    # evidence instead, and a library of another CPU kind with an equal one is exact here: test_invariant_moves.py)
    return ["model=tiny_gemma3", f"project_root={REPO}", f"runs_dir={tmp}/runs", f"library.root={tmp}/library",
            f"library.store={tmp}/store", "library.dataset.limit=3", "dataset.limit=2", "decoding.max_new_tokens=3",
            "tracking=off", "determinism.batch_invariant=false", *extra]


@pytest.fixture
def moved(tmp_path):
    """A built library whose every artifact is replaced by the same artifact recorded in another environment.
    Returns (config, model, library path, the artifact ids as first built)."""
    cfg = typed(compose_config(_overrides(tmp_path)))
    fm = load_model(typed(cfg))  # the transformers backend: the harness and check_graft take it
    build_library(cfg.library, fm, REPO, progress=False)
    lib = open_library(cfg.library, fm, REPO)
    built = {e.entry_id: e.artifact_id for e in lib.entries}
    rows = []
    for e in lib.entries:
        snap = lib.store.get(e.artifact_id)
        other = dataclasses.replace(snap, environment={**snap.environment, **ELSEWHERE})
        rows.append({**e.to_row(), "artifact_id": str(lib.store.put(other))})
    _write_library(lib.path, lib.manifest, rows, fm)
    return cfg, fm, lib.path, built


def test_a_moved_library_is_refused_at_graft_naming_the_environment(moved):
    cfg, fm, _, _ = moved
    lib = open_library(cfg.library, fm, REPO)
    snap = lib.store.get(lib.entries[0].artifact_id)
    with pytest.raises(IncompatibleError, match=r"environment.cpu_model: artifact 'Intel\(R\) Xeon\(R\) Platinum'"):
        TransformersBackend.of(fm).graft(snap, token_ids=snap.token_ids)


def test_redeposit_keeps_entry_ids_and_restores_exact_grafts(moved, capsys):
    cfg, fm, path, built = moved
    report = redeposit_library(cfg.library, fm, REPO, progress=False)
    assert report["redeposited"] == len(built) and report["kept"] == 0
    assert all("environment.mkl_cbwr: artifact 'AVX512', this process None" in d
               for d in report["differences"].values())
    lib = open_library(cfg.library, fm, REPO)  # the rewritten index still matches its manifest
    assert {e.entry_id: e.artifact_id for e in lib.entries} == built  # same entries, byte-identical deposits
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["environment"] == fm.environment()  # the library says where it is exact
    e = lib.entries[0]
    snap = lib.store.get(e.artifact_id)
    suffix = fm.encode("Final answer: 7", add_bos=False)
    assert check_graft(fm, snap.token_ids, suffix, snapshot=snap).equal
    assert redeposit_library(cfg.library, fm, REPO, progress=False)["redeposited"] == 0  # nothing left to do


def test_the_redeposit_command_line(moved, capsys, tmp_path):
    here = moved[1].environment()
    differ = ", ".join(f"environment.{k}" for k in sorted(ELSEWHERE) if here.get(k) != ELSEWHERE[k])  # Intel or AMD
    differ += ", numerics"  # another machine's artifacts carry no numerics record here (issue 61: a claim is not one)
    main(["--redeposit", *_overrides(tmp_path)])
    assert f"3 of 3 entries re-deposited in this compute environment (differed in: {differ})" in capsys.readouterr().out


def test_a_run_that_opts_in_is_marked_not_guaranteed_exact(moved, tmp_path):
    cfg = compose_config(_overrides(tmp_path, "condition=graft", "determinism.allow_environment_mismatch=true"))
    with pytest.warns(RuntimeWarning, match="not guaranteed exact"):
        folder, summary = run(cfg, tmp_path / "runs" / "graft" / "r1", progress=False)
    assert summary.exactness and summary.exactness.startswith("not guaranteed exact")
    assert json.loads(folder.file("summary.json").read_text())["exactness"] == summary.exactness
    manifest = json.loads(folder.file("manifest.json").read_text())
    assert manifest["inputs"]["exactness"] == summary.exactness
    assert manifest["inputs"]["environment"]["format"] == "kvgraft-env/1"
    plain = compose_config(_overrides(tmp_path, "condition=baseline"))
    _, base = run(plain, tmp_path / "runs" / "baseline" / "r1", progress=False)
    assert base.exactness is None




def test_a_graft_run_on_a_moved_library_says_how_to_fix_it_in_the_harness_terms(moved, tmp_path):
    """kvstore's refusal names its own parameter (allow_environment_mismatch=True); the harness adds its command and
    config key when it re-raises, in the same one line."""
    from harness.errors import LibraryError

    cfg = compose_config(_overrides(tmp_path, "condition=graft"))
    with pytest.raises(LibraryError) as info:
        run(cfg, tmp_path / "runs" / "graft" / "r2", progress=False)
    msg = str(info.value)
    # the moved artifacts carry no numerics record (put from another machine's bytes: a record read elsewhere is a
    # claim, issue 61), and the harness says so first, in one line
    assert "no numerics record" in msg and "\n" not in msg
    assert "python -m harness.library --redeposit" in msg
