"""The pinned determinism settings: a bad value is a SettingsError (a KVStoreError) naming the setting, never a
plain ValueError or TypeError; the recorded dict round-trips; an unknown recorded key is named."""

from __future__ import annotations

import pytest

from kvstore import Determinism, KVStoreError, SettingsError


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"dtype": "float64"}, "determinism.dtype='float64'"),
        ({"dtype": "fp32"}, "determinism.dtype='fp32'"),
        ({"threads": 0}, "determinism.threads=0"),
        ({"threads": 1.5}, "determinism.threads=1.5"),
        ({"threads": True}, "determinism.threads=True"),
        ({"prefill_chunk": -1}, "determinism.prefill_chunk=-1"),
        ({"prefill_chunk": "512"}, "determinism.prefill_chunk='512'"),
        ({"attn_implementation": "flash_attention_2"}, "determinism.attn_implementation='flash_attention_2'"),
        ({"deterministic_algorithms": "yes"}, "determinism.deterministic_algorithms='yes'"),
    ],
)
def test_a_bad_setting_is_a_settings_error_naming_it(kwargs, named):
    with pytest.raises(SettingsError) as info:
        Determinism(**kwargs)
    assert named in str(info.value)
    assert isinstance(info.value, KVStoreError) and not isinstance(info.value, ValueError)


def test_the_error_says_what_is_accepted():
    with pytest.raises(SettingsError, match=r"\['bfloat16', 'float16', 'float32'\]"):
        Determinism(dtype="float64")
    with pytest.raises(SettingsError, match=r"use one of \['sdpa', 'eager'\]"):
        Determinism(attn_implementation="flex")


def test_the_defaults_and_every_accepted_value_are_valid():
    assert Determinism() == Determinism(threads=2, deterministic_algorithms=True, attn_implementation="sdpa",
                                        dtype="float32", prefill_chunk=512)
    for dtype in ("float32", "bfloat16", "float16"):
        assert Determinism(dtype=dtype).torch_dtype.__repr__().endswith(dtype)
    assert Determinism(attn_implementation="eager", prefill_chunk=0, threads=1).prefill_chunk == 0


def test_to_dict_from_dict_round_trip():
    det = Determinism(threads=1, attn_implementation="eager", dtype="bfloat16", prefill_chunk=7)
    assert Determinism.from_dict(det.to_dict()) == det
    assert Determinism.from_dict({}) == Determinism()  # missing keys take their defaults
    assert Determinism.from_dict({"prefill_chunk": 7}).prefill_chunk == 7


def test_from_dict_with_an_unknown_key_names_it():
    with pytest.raises(SettingsError, match=r"determinism\.prefil_chunk") as info:
        Determinism.from_dict({"threads": 2, "prefil_chunk": 64})
    assert "prefill_chunk" in str(info.value)  # the known settings are listed, so the typo is visible


def test_from_dict_validates_values_too():
    with pytest.raises(SettingsError, match="determinism.threads=-3"):
        Determinism.from_dict({"threads": -3})
    with pytest.raises(SettingsError, match="mapping"):
        Determinism.from_dict([("threads", 2)])  # type: ignore[arg-type]


def test_every_field_is_a_script_flag_and_a_flag_not_given_keeps_its_default():
    """kvstore.determinism.add_arguments reads the dataclass: a field added to Determinism is a flag of every script
    that uses it, with no script edited."""
    import argparse
    from dataclasses import fields

    from kvstore.determinism import add_arguments, from_arguments

    p = argparse.ArgumentParser()
    add_arguments(p)
    assert {a.dest for a in p._actions} - {"help"} == {f.name for f in fields(Determinism)}
    assert from_arguments(p.parse_args([])) == Determinism()
    d = from_arguments(p.parse_args(["--threads", "3", "--prefill-chunk", "0", "--no-deterministic-algorithms",
                                     "--attn-implementation", "eager"]))
    assert (d.threads, d.prefill_chunk, d.deterministic_algorithms, d.attn_implementation) == (3, 0, False, "eager")
