"""A GGUF that llama.cpp cannot load is one line naming the file and llama.cpp's own reason (issue 31, finding 11:
a truncated GGUF gave a 25-line traceback with the reason suppressed). The bundled GGUF, cut to half its size."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("llama_cpp", reason="the llama.cpp backend needs llama-cpp-python")

from kvstore.cli import main  # noqa: E402


@pytest.fixture(scope="module")
def truncated(tmp_path_factory) -> str:
    from kvstore.backends.packaged import BUNDLED, gguf_path

    src = str(gguf_path(BUNDLED))
    out = tmp_path_factory.mktemp("gguf") / "half.gguf"
    with open(src, "rb") as f:
        out.write_bytes(f.read(os.path.getsize(src) // 2))
    return str(out)


def test_a_truncated_gguf_is_one_line_with_llama_cpps_reason(truncated, tmp_path, capsys):
    rc = main(["--store", str(tmp_path / "store"), "deposit", "--backend", "llamacpp", "--setting",
               f"gguf={truncated}", "--token-ids", "2,9"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert f"llamacpp.gguf='{truncated}': llama.cpp cannot load it" in err
    assert "not within the file bounds, model is corrupted or incomplete" in err and "Traceback" not in err
