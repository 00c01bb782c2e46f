"""The re-check of a run needs neither torch nor transformers (DESIGN.md invariant 4: hashes re-checked without
the engine): scripts/rescore.py runs in a subprocess where importing either fails."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BLOCK = 'import sys\nfor m in ("torch", "transformers"):\n    sys.modules[m] = None\n'


def rescore_without_torch(folder: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`python scripts/rescore.py folder` with a sitecustomize that makes `import torch` raise ImportError."""
    shim = tmp_path / "no_torch"
    shim.mkdir(exist_ok=True)
    (shim / "sitecustomize.py").write_text(BLOCK)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{shim}:{REPO}", "HOME": str(tmp_path)}
    return subprocess.run([sys.executable, str(REPO / "scripts" / "rescore.py"), str(folder)], env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def test_the_shim_really_blocks_torch(tmp_path):
    shim = tmp_path / "no_torch"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(BLOCK)
    proc = subprocess.run([sys.executable, "-c", "import torch"], env={"PYTHONPATH": str(shim)},
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 1 and "ModuleNotFoundError" in proc.stderr


def test_a_run_folder_rescores_without_torch(fake_run, tmp_path):
    proc = rescore_without_torch(fake_run, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK: 3 rows re-scored, all hashes match" in proc.stdout


def test_an_edited_run_folder_fails_without_torch_too(fake_run, tmp_path):
    summary = fake_run / "summary.json"
    summary.write_text(summary.read_text().replace('"accuracy": ', '"accuracy": 0.5, "was": ', 1))
    proc = rescore_without_torch(fake_run, tmp_path)
    assert proc.returncode == 1 and "FAILED" in proc.stdout, proc.stdout + proc.stderr


def test_a_compare_folder_rechecks_without_torch(tmp_path):
    from harness.compare import job as compare

    compare.main(["model=tiny_gemma3", f"project_root={REPO}", f"runs_dir={tmp_path}/runs", "dataset.limit=1",
                  "decoding.max_new_tokens=2", "tracking=off", f"library.root={tmp_path}/library",
                  f"library.store={tmp_path}/store"])
    folder = next((tmp_path / "runs" / "compare").iterdir())
    proc = rescore_without_torch(folder, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "every figure recomputes" in proc.stdout and "pairing held_out: 1/1" in proc.stdout
