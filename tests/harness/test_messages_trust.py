"""Messages that name what is wrong (issue 31, finding 11): a per-run table in an 80-column terminal shows every value
(one line per figure, not eleven columns cut to ellipses); a llama.cpp setting changed since the library was built
names the setting and both values, not hashes that did not change; no S3 credentials is a line about credentials,
not "start the S3 server"."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_a_per_run_table_in_80_columns_shows_every_value(fakerun: ModuleType, tmp_path, capsys, monkeypatch):
    from harness.record.folder import RunFolder
    from harness.record.rows import Summary
    from harness.run import loop

    s = Summary.of(fakerun.make_rows("baseline"), condition="baseline", model="gemma3-270m", dataset="kvgraft_original",
                   run_dir=str(tmp_path), comparable_key="k", run_wall_s=12.5, energy_status="unavailable:no meter",
                   energy_j=None, group=None)
    for width in (80, 200):
        monkeypatch.setattr(loop.console, "width", width)
        loop.print_summary(s, RunFolder(tmp_path))
        out = capsys.readouterr().out
        table = out.split("run folder:")[0]
        assert "…" not in table, table
        assert max(len(line) for line in table.splitlines()) <= width, table
        for value in (f"{s.scores.accuracy:.3f} [{s.scores.accuracy_ci_low:.3f}, {s.scores.accuracy_ci_high:.3f}]",
                      str(s.tokens.decode), f"{s.time.wall_s:.1f}", "stops eos/stop/length"):
            assert value in table, (width, value, table)


@pytest.mark.slow
def test_a_llamacpp_setting_changed_since_the_library_was_built_is_named(tmp_path):
    pytest.importorskip("llama_cpp", reason="the llama.cpp backend needs llama-cpp-python")
    from harness.config.model import load_model
    from harness.config.schema import compose_config, typed
    from harness.errors import LibraryError
    from harness.library.build import build_library, open_library

    base = ["model=gemma3_270m_llamacpp", "library.dataset.limit=2", f"library.root={tmp_path}/library",
            f"library.store={tmp_path}/store", f"project_root={REPO}"]
    built = typed(compose_config(base))
    build_library(built.library, load_model(built), REPO)
    changed = typed(compose_config([*base, "model.llamacpp.n_batch=256"]))
    with pytest.raises(LibraryError) as err:
        open_library(changed.library, load_model(changed), REPO)
    message = str(err.value)
    assert "backend_settings.n_batch: 512 there, 256 here" in message, message
    assert "backend_settings.prefill_chunk: 512 there, 256 here" in message and "source rows" not in message


def test_no_s3_credentials_is_a_line_about_credentials(tmp_path):
    pytest.importorskip("boto3")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update({"PYTHONPATH": str(REPO), "AWS_EC2_METADATA_DISABLED": "true", "HOME": str(tmp_path),
                "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"), "AWS_CONFIG_FILE": str(tmp_path / "none"),
                "AWS_ENDPOINT_URL": "http://127.0.0.1:9"})  # nothing is sent: boto3 finds no key first
    out = subprocess.run([sys.executable, "-m", "kvstore.cli", "--store", "s3://kvgraft/lib", "ls"], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=120)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert "Unable to locate credentials" in lines[0] and "AWS_ACCESS_KEY_ID" in lines[0], lines[0]
    assert "Start the S3 server" not in lines[0]
