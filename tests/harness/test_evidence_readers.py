"""Issue 61, items 5 and 6 (harness): a reader uses the bytes it audited (one read), harvest_table audits the
sampling run, and building a library whose identity exists against another store leaves the existing folder's
manifest as it is. Each test fails at 7180e3a (said per test)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

import harness.record.audit as audit_module
from harness.config.model import load_model
from harness.config.schema import compose_config, typed
from harness.errors import HarnessError
from harness.library.build import build_library
from harness.record.audit import audited
from harness.record.folder import RunFolder

REPO = Path(__file__).resolve().parents[2]
OUTPUTS = "outputs.jsonl"


def _flip_first_score(run: Path) -> None:
    path = run / OUTPUTS
    text = path.read_text(encoding="utf-8")
    flipped = text.replace('"correct":true', '"correct":false', 1) if '"correct":true' in text else \
        text.replace('"correct":false', '"correct":true', 1)
    assert flipped != text
    path.write_text(flipped, encoding="utf-8")


def test_audited_returns_the_rows_of_the_bytes_it_audited(fake_run, monkeypatch):
    """A writer that edits outputs.jsonl between the audit and the read: at 7180e3a `audited` read the folder again
    (`finished()`), so the edited rows came back from a folder that re-checked."""
    intact = RunFolder(fake_run).read_rows()
    real = audit_module.audit

    def audit_then_edit(folder):
        check = real(folder)
        _flip_first_score(fake_run)  # after the check, before the records are taken
        return check

    monkeypatch.setattr(audit_module, "audit", audit_then_edit)
    got = audited(fake_run, "this test")
    assert [r.correct for r in got.rows] == [r.correct for r in intact]
    assert [r.correct for r in RunFolder(fake_run).read_rows()] != [r.correct for r in intact]  # the disk changed


def test_harvest_table_audits_the_sampling_run(fake_run, tmp_path):
    """At 7180e3a harvest_table read the sampling run's rows without the audit (an edited samples folder gave other
    figures); now the edit is refused naming the folder before anything is read."""
    from scripts import harvest_table

    _flip_first_score(fake_run)
    with pytest.raises(HarnessError, match="harvest_table"):
        harvest_table.main([str(fake_run), str(tmp_path / "no-compare")])


def _library(tmp: Path, store: str):
    cfg = typed(compose_config(["model=fake", f"project_root={REPO}", f"runs_dir={tmp}/runs",
                                f"library.root={tmp}/library", f"library.store={store}", "library.dataset.limit=2",
                                "dataset.limit=2", "tracking=off"]))
    return cfg, load_model(cfg)


def test_building_an_existing_library_against_another_store_keeps_its_manifest(tmp_path, capsys):
    """At 7180e3a the second build rewrote manifest.json naming the other store (another manifest SHA-256: runs that
    recorded the first no longer found their library)."""
    cfg, be = _library(tmp_path, str(tmp_path / "store-a"))
    path = build_library(cfg.library, be, REPO, progress=False)
    before = hashlib.sha256((path / "manifest.json").read_bytes()).hexdigest()
    cfg_b, be_b = _library(tmp_path, str(tmp_path / "store-b"))
    again = build_library(cfg_b.library, be_b, REPO, progress=False)
    assert again == path
    assert hashlib.sha256((path / "manifest.json").read_bytes()).hexdigest() == before
    assert "left as it is" in capsys.readouterr().out


_SAMPLER = """
import hashlib, torch
from harness.run.decode import _pick_rows, fixed_order_softmax
g = torch.Generator().manual_seed(7)
probs, draws = [], []
for step in range(12):
    logits = torch.randn(3, 262144, generator=g) * 3
    probs.append(fixed_order_softmax(logits, 0.7).numpy().tobytes())
    gens = [torch.Generator().manual_seed(100 + r) for r in range(3)]
    draws += _pick_rows(logits, "sample", 0.7, 0.95, gens) + _pick_rows(logits, "sample", 1.0, 1.0, gens)
print(torch.backends.cpu.get_cpu_capability(), hashlib.sha256(b"".join(probs)).hexdigest(), draws)
"""


def test_the_sampler_draws_the_same_bits_under_atens_avx2_and_avx512_builds():
    """Item 7: the sampler's probabilities come from correctly rounded elementwise operations in a fixed order
    (harness.run.decode.fixed_order_softmax), so ATen's AVX2 and AVX-512 builds give the same bits and draws. At
    7180e3a it used torch.softmax, whose bits differ between the builds (measured: d094bc39.. vs 04e7602d.. on this
    AMD EPYC Zen 4; the function this test imports did not exist)."""
    import os
    import subprocess
    import sys

    import torch

    if torch.backends.cpu.get_cpu_capability() != "AVX512":
        pytest.skip("needs an AVX-512 CPU: on this one ATen's AVX2 build is the only vector build to compare")
    out = {}
    for cap in ("avx2", "avx512"):
        env = {**os.environ, "ATEN_CPU_CAPABILITY": cap, "PYTHONPATH": str(REPO)}
        r = subprocess.run([sys.executable, "-c", _SAMPLER], capture_output=True, text=True, env=env, cwd=REPO,
                           timeout=300)
        assert r.returncode == 0, r.stderr
        out[cap] = r.stdout.split(" ", 1)
    assert out["avx2"][0] == "AVX2" and out["avx512"][0] == "AVX512"  # two builds really ran
    assert out["avx2"][1] == out["avx512"][1]
