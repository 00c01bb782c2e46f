"""determinism.batch_invariant in the harness: absent from the recorded config and the keys at its default (no
default-mode hash moves), recorded when true, and refused in one line on a backend that cannot offer it."""

from __future__ import annotations

import pytest

from harness.config.schema import compose_config, recorded, typed
from harness.errors import ConfigError


def test_the_default_records_nothing_new_and_true_is_recorded():
    assert "batch_invariant" not in recorded(compose_config())["determinism"]
    assert "batch_invariant" not in recorded(typed(compose_config()))["determinism"]
    assert recorded(compose_config(["determinism.batch_invariant=true"]))["determinism"]["batch_invariant"] is True


@pytest.mark.parametrize("model", ["gemma3_270m_llamacpp", "gemma3_270m_vllm"])
def test_llamacpp_and_vllm_refuse_the_mode_in_one_line(model):
    with pytest.raises(ConfigError, match="cannot offer a batch-invariant computation on the CPU") as e:
        typed(compose_config([f"model={model}", "determinism.batch_invariant=true"]))
    assert "\n" not in str(e.value)
