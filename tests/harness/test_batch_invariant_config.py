"""determinism.batch_invariant in the harness: absent from the recorded config and the keys at its default (no
default-mode hash moves), recorded when true, and refused in one line on a backend that cannot offer it."""

from __future__ import annotations

import pytest

from harness.config.schema import compose_config, recorded, typed


def test_the_default_is_the_mode_recorded_and_false_records_nothing_new():
    """Exact by default (issue 52): the harness default is determinism.batch_invariant=true, recorded explicitly; the
    old default (false) is left out of the recorded config and the keys, so runs made before keep theirs."""
    assert recorded(compose_config())["determinism"]["batch_invariant"] is True
    assert typed(compose_config()).determinism.batch_invariant is True
    for off in (compose_config(["determinism.batch_invariant=false"]),
                typed(compose_config(["determinism.batch_invariant=false"]))):
        assert "batch_invariant" not in recorded(off)["determinism"]


@pytest.mark.parametrize("overrides", [["model=gemma3_270m_llamacpp"],
                                       ["determinism.dtype=bfloat16"],
                                       ["model=gemma3_270m_llamacpp", "determinism.batch_invariant=true"]])
def test_engines_without_the_mode_and_bf16_keep_the_old_default_and_say_so(overrides, capsys):
    c = typed(compose_config(overrides))
    assert c.determinism.batch_invariant is False
    line = capsys.readouterr().err.strip()
    assert line.startswith("kvgraft: determinism.batch_invariant=false for this run:") and "\n" not in line
    assert "batch_invariant" not in recorded(compose_config(overrides))["determinism"]  # keys as before


@pytest.mark.parametrize("name", ["llamacpp", "vllm"])
def test_the_engines_own_refusal_stays_one_line(name):
    from kvstore import batch_invariant_refusal

    assert "cannot offer a batch-invariant computation on the CPU" in batch_invariant_refusal(name)
    assert "\n" not in batch_invariant_refusal(name)
