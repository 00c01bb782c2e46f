"""Re-checking a run needs only the `audit` extra: `make audit-venv` builds a fresh venv (the package with
--no-deps, then the extra's packages from the configured package index) in which torch does not exist, and
scripts/rescore.py re-checks a run folder there. The extra's list is also checked against what a rescore
really imports, so it cannot silently grow stale. Integration: it installs real packages (~30 s)."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
# import name -> distribution name, for the packages a rescore imports
DISTRIBUTION = {"yaml": "pyyaml", "numpy": "numpy", "sympy": "sympy", "mpmath": "sympy", "rich": "rich",
                "pygments": "rich", "markdown_it": "rich", "mdurl": "rich"}
TRACE = """import json, runpy, sys
for m in ("torch", "transformers"):
    sys.modules[m] = None
sys.argv = ["rescore.py", sys.argv[1]]
code = 0
try:
    runpy.run_path({script!r}, run_name="__main__")
except SystemExit as e:
    code = e.code
tops = {{m.split(".")[0] for m in sys.modules}} - set(sys.stdlib_module_names) - {{"harness", "kvstore"}}
print(json.dumps([code, sorted(t for t in tops if not t.startswith("_") and sys.modules.get(t) is not None)]))
"""


def audit_extra() -> list[str]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["audit"]


def test_the_audit_extra_is_what_a_rescore_imports(fake_run):
    code = TRACE.format(script=str(REPO / "scripts" / "rescore.py"))
    proc = subprocess.run([sys.executable, "-c", code, str(fake_run)], env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin"},
                          capture_output=True, text=True, timeout=120, check=False)
    status, imported = json.loads(proc.stdout.strip().splitlines()[-1])
    assert status == 0, proc.stdout + proc.stderr
    unknown = [m for m in imported if m not in DISTRIBUTION and m != "cython_runtime"]
    assert not unknown, f"rescore now imports {unknown}: add them to the audit extra and to DISTRIBUTION"
    assert sorted({DISTRIBUTION[m] for m in imported if m in DISTRIBUTION}) == sorted(audit_extra())


@pytest.mark.slow
def test_a_fresh_venv_with_only_the_audit_extra_rescores_a_run(fake_run, tmp_path):
    venv = tmp_path / "audit-venv"
    make = subprocess.run(["make", "-s", "audit-venv", f"AUDIT_VENV={venv}"], cwd=REPO, capture_output=True,
                          text=True, timeout=600, check=False)
    assert make.returncode == 0, make.stdout + make.stderr
    python = str(venv / "bin" / "python")
    no_torch = subprocess.run([python, "-c", "import torch"], capture_output=True, text=True, check=False)
    assert no_torch.returncode == 1 and "No module named 'torch'" in no_torch.stderr
    proc = subprocess.run([python, str(REPO / "scripts" / "rescore.py"), str(fake_run)], cwd=tmp_path,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK: 3 rows re-scored, all hashes match" in proc.stdout
