"""harness/experiments/registry.py and harness/experiments/replay.py (run as scripts/replay.py): the comparison of a profile's registrations (one per environment:
this machine's is the check, the others are measurements) with a recomputation, the registry's formats and
--register's replace-or-append (pure, on hand-made entries), and the script end to end on a tiny registry of the
tiny random-weight model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.experiments import registry as replay_registry
from kvstore import KERNEL_RECORD, UNVERSIONED_KERNEL, Determinism
from kvstore.backends.transformers import environment_fingerprint

REPO = Path(__file__).resolve().parents[2]
SCRIPT = "scripts.replay"  # run as `python -m scripts.replay` from the checkout




def _entry(env: dict, hashes=("a1", "b2"), first="c3", tokens=(5, 6), numerics: str | None = "n" * 64) -> dict:
    return {
        "model_fingerprint": "m" * 64, "tokenizer_fingerprint": "t" * 64, "environment": env,
        **({"numerics_sha256": numerics} if numerics is not None else {}),
        "samples": [{"index": i, "prefix_tokens": 10, "suffix_tokens": 4, "tokens_sha256": f"in{i}",
                     "logits_sha256": h, "graft_equal": True} for i, h in enumerate(hashes)],
        "decode": [{"problem_id": "p-1", "prompt_tokens": 9, "prompt_sha256": "pp", "first_logits_sha256": first,
                    "token_ids": list(tokens)}],
    }


ENV = environment_fingerprint()
# another machine than this one (the tests run on Intel and AMD machines alike)
_AMD, _INTEL = ("AuthenticAMD", "AMD EPYC"), ("GenuineIntel", "Intel(R) Xeon(R)")
_VENDOR, _MODEL = _AMD if ENV["cpu_vendor"] == "GenuineIntel" else _INTEL
OTHER = {**ENV, "cpu_vendor": _VENDOR, "cpu_model": _MODEL, "device_name": _MODEL}


def test_same_environment_and_every_hash_reproduced_passes():
    out = replay_registry.replay_profile([_entry(ENV)], _entry(ENV), "native")
    assert out.passed and len(out.checks) == 1 and not out.others
    assert out.checks[0].reproduced == 3 and out.checks[0].matches_environment
    assert out.verdict() == "profile native: 3/3 reproduced; environment matches the registered one -> PASS"


def test_one_hash_not_reproduced_fails_and_is_named():
    out = replay_registry.compare(_entry(ENV), _entry(ENV, hashes=("a1", "XX")), "native")
    assert not out.all_reproduced and out.reproduced == 2
    assert [r["name"] for r in out.rows if not r["reproduced"]] == ["sample 1 (10+4)"]
    assert not replay_registry.replay_profile([_entry(ENV)], _entry(ENV, hashes=("a1", "XX")), "native").passed
    bad_decode = replay_registry.compare(_entry(ENV), _entry(ENV, tokens=(5, 7)), "native")
    assert not bad_decode.all_reproduced and not bad_decode.rows[-1]["reproduced"]


def test_a_graft_that_is_not_exact_is_not_reproduced_even_when_the_reference_is():
    now = _entry(ENV)
    now["samples"][0]["graft_equal"] = False
    assert not replay_registry.compare(_entry(ENV), now, "native").all_reproduced
    assert not replay_registry.replay_profile([_entry(ENV)], now, "native").passed


def test_another_environments_registration_is_a_measurement_that_does_not_decide():
    # this machine's registration reproduces; the other machine's does not (its bits differ)
    regs = [_entry(OTHER, first="zz"), _entry(ENV)]
    out = replay_registry.replay_profile(regs, _entry(ENV), "portable")  # portable promises nothing (PORTABLE_PROFILES)
    assert out.passed and not out.portable and len(out.checks) == 1 and len(out.others) == 1
    other = out.others[0]
    assert other.reproduced == 2 and not other.all_reproduced and other.source == f"{_MODEL} ({_VENDOR})"
    assert {d.split(":")[0] for d in other.environment_differences} == {
        "environment.cpu_model", "environment.cpu_vendor", "environment.device_name"}
    assert [key for key, _, _, same in other.environment if not same] == ["cpu_model", "cpu_vendor", "device_name"]
    line = out.measurement_line(other)
    assert line.startswith(f"profile portable: against the registration from {_MODEL} ({_VENDOR}): 2/3 reproduced; "
                           f"3 facts differ: cpu_model {_MODEL!r} -> {ENV['cpu_model']!r}, ")
    assert line.endswith("(a portability measurement; it does not decide the exit status)")
    assert out.verdict() == "profile portable: 3/3 reproduced; environment matches the registered one -> PASS"
    # this machine's registration still decides: not reproduced here fails, whatever the other one says
    assert not replay_registry.replay_profile([_entry(OTHER), _entry(ENV, first="zz")], _entry(ENV), "portable").passed


def test_no_registration_of_this_environment_fails_with_the_register_command():
    out = replay_registry.replay_profile([_entry(OTHER)], _entry(ENV), "native")  # every hash reproduced, elsewhere
    assert not out.passed and not out.checks and out.others[0].all_reproduced
    assert out.verdict() == (
        f"profile native: no registration matches this machine's environment and numerics fingerprint "
        f"({ENV['device_name']} "
        f"({ENV['cpu_vendor']}); registered: {_MODEL} ({_VENDOR})); register it with "
        "`make replay PROFILE=native ARGS=--register` -> FAIL")
    custom = replay_registry.replay_profile([_entry(OTHER)], _entry(ENV), "native", registry="/tmp/r.json")
    assert "`make replay PROFILE=native ARGS='--register --registry /tmp/r.json'` -> FAIL" in custom.verdict()


@pytest.mark.parametrize("registered", ["other numerics", "no numerics"])
def test_an_equal_environment_with_other_or_unknown_numerics_is_no_match_not_a_failed_check(registered):
    # issue 41, finding 0: every environment field equal, the kernels compute other bits (or the registration
    # predates the fingerprint): "no registration matches", never a hash mismatch under an environment called equal
    reg = _entry(ENV, first="zz", numerics="o" * 64 if registered == "other numerics" else None)
    out = replay_registry.replay_profile([reg], _entry(ENV), "native")
    assert not out.passed and not out.checks and len(out.others) == 1
    verdict = out.verdict()
    assert verdict.startswith("profile native: no registration matches") and verdict.endswith("-> FAIL")
    assert "environment matches the registered one" not in verdict
    line = out.measurement_line(out.others[0])
    assert "1 facts differ: numerics_sha256" in line
    # registering this machine appends its own registration beside the other one, which is kept
    book = {"format": "kvgraft-replay/2", "params": {}, "profiles": {"native": [reg]}}
    book, replaced = replay_registry.register(book, "native", _entry(ENV))
    assert not replaced and book["profiles"]["native"] == [reg, _entry(ENV)]
    assert replay_registry.replay_profile(book["profiles"]["native"], _entry(ENV), "native").passed


def test_a_profile_that_promises_portability_needs_every_registration_to_reproduce(monkeypatch):
    import kvstore

    monkeypatch.setattr(kvstore, "PORTABLE_PROFILES", ("portable",), raising=False)  # the harness reads the face
    kept = replay_registry.replay_profile([_entry(OTHER), _entry(ENV)], _entry(ENV), "portable")
    assert kept.portable and kept.passed
    assert kept.measurement_line(kept.others[0]).endswith("(the profile promises portability) -> PASS")
    broken = replay_registry.replay_profile([_entry(OTHER, first="zz"), _entry(ENV)], _entry(ENV), "portable")
    assert not broken.passed
    assert broken.measurement_line(broken.others[0]).endswith("(the profile promises portability) -> FAIL")
    assert broken.verdict() == ("profile portable: 3/3 reproduced; environment matches the registered one; the "
                                "profile promises portability: 0/1 other registrations reproduced in full -> FAIL")
    assert replay_registry.replay_profile([_entry(OTHER, first="zz"), _entry(ENV)], _entry(ENV), "native").passed


def test_other_inputs_are_not_comparable():
    now = _entry(ENV)
    now["model_fingerprint"] = "n" * 64
    out = replay_registry.replay_profile([_entry(ENV)], now, "native")
    assert not out.passed and "NOT COMPARABLE: model_fingerprint" in out.verdict()
    moved = _entry(ENV)
    moved["samples"][1]["tokens_sha256"] = "other"
    assert "sample 1: its tokens differ" in replay_registry.replay_profile([_entry(ENV)], moved, "native").verdict()


def test_a_format_1_registry_is_read_as_one_registration_per_profile(tmp_path):
    old = {"format": "kvgraft-replay/1", "params": {"samples": 2},
           "profiles": {"native": _entry(OTHER), "portable": _entry(ENV)}}
    path = tmp_path / "registry.json"
    path.write_text(json.dumps(old))
    reg = replay_registry.read_registry(path)
    assert reg["format"] == "kvgraft-replay/2" and reg["params"] == {"samples": 2}
    assert reg["profiles"] == {"native": [_entry(OTHER)], "portable": [_entry(ENV)]}
    replay_registry.write_registry(path, reg)  # writing always writes format 2
    assert json.loads(path.read_text()) == {**old, "format": "kvgraft-replay/2", "profiles": reg["profiles"]}
    assert replay_registry.read_registry(path) == reg
    path.write_text(json.dumps({"format": "kvgraft-replay/9", "profiles": {}}))
    with pytest.raises(SystemExit, match="format 'kvgraft-replay/9'"):
        replay_registry.read_registry(path)


def test_register_replaces_this_environments_registration_and_appends_another():
    reg = {"format": "kvgraft-replay/2", "params": {}, "profiles": {"native": [_entry(OTHER), _entry(ENV)]}}
    other_before = json.loads(json.dumps(reg["profiles"]["native"][0]))
    reg, replaced = replay_registry.register(reg, "native", _entry(ENV, first="new"))
    assert replaced and len(reg["profiles"]["native"]) == 2
    assert reg["profiles"]["native"][0] == other_before  # the other machine's is kept as it was
    assert reg["profiles"]["native"][1]["decode"][0]["first_logits_sha256"] == "new"
    third = {**ENV, "aten_cpu_capability": "SOMETHING_ELSE"}
    reg, replaced = replay_registry.register(reg, "native", _entry(third))
    assert not replaced and [r["environment"] for r in reg["profiles"]["native"]] == [OTHER, ENV, third]
    reg, replaced = replay_registry.register(reg, "portable", _entry(ENV))  # a profile not registered yet
    assert not replaced and reg["profiles"]["portable"] == [_entry(ENV)]
    assert len(reg["profiles"]["native"]) == 3


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run([sys.executable, "-m", SCRIPT, *args], capture_output=True, text=True, cwd=REPO, env=env,
                          timeout=600)


def test_register_then_replay_on_the_tiny_model(tmp_path):
    reg = tmp_path / "registry.json"
    small = ["--registry", str(reg), "--model", "tiny-gemma3", "--samples", "3", "--decode-problems", "2",
             "--decode-tokens", "3"]
    r = _run("--profile", "native", "--register", *small)
    assert r.returncode == 0, r.stderr
    assert "appended (1 registration of the profile)" in r.stdout
    registry = json.loads(reg.read_text())
    assert registry["format"] == "kvgraft-replay/2"
    [entry] = registry["profiles"]["native"]
    assert registry["params"]["samples"] == 3 and len(entry["samples"]) == 3 and len(entry["decode"]) == 2
    # the subprocess ran under the default pinned settings; earlier tests may have changed this process's threads
    Determinism().apply()
    assert entry["environment"] == environment_fingerprint() and entry["determinism"]["profile"] == "native"
    assert len(entry["numerics_sha256"]) == 64  # the measured numerics fingerprint (issue 41)

    r = _run("--profile", "native", "--registry", str(reg))  # the parameters come from the registry
    assert r.returncode == 0, r.stdout + r.stderr
    assert "profile native: 5/5 reproduced; environment matches the registered one -> PASS" in r.stdout

    # another machine's registration (one hash off) beside this one's: measured, the exit status stays 0
    other = json.loads(json.dumps(entry))
    other["samples"][1]["logits_sha256"] = "0" * 64
    other["environment"]["cpu_model"] = OTHER["cpu_model"]
    registry["profiles"]["native"] = [other, entry]
    reg.write_text(json.dumps(registry))
    r = _run("--registry", str(reg))  # every registered profile, each in its own process
    assert r.returncode == 0, r.stdout + r.stderr
    assert "profile native: against the registration from " in r.stdout
    assert "4/5 reproduced; 1 facts differ: cpu_model" in r.stdout
    assert "profile native: 5/5 reproduced; environment matches the registered one -> PASS" in r.stdout
    assert "replay: native PASS" in r.stdout

    # registering again replaces this machine's registration and keeps the other one
    r = _run("--profile", "native", "--register", *small)
    assert r.returncode == 0, r.stderr
    assert "replaced this environment's registration (2 registrations of the profile)" in r.stdout
    assert json.loads(reg.read_text())["profiles"]["native"][0] == other

    # a machine whose environment record equals this one's but whose kernels compute other bits (issue 41): its
    # registration is no match here, so a hash mismatch is never reported under an equal environment
    twin = json.loads(json.dumps(entry))
    twin["numerics_sha256"] = "0" * 64
    twin["samples"][0]["logits_sha256"] = "0" * 64
    registry["profiles"]["native"] = [twin]
    reg.write_text(json.dumps(registry))
    r = _run("--registry", str(reg))
    assert r.returncode == 1 and "environment matches the registered one -> FAIL" not in r.stdout
    assert "profile native: no registration matches this machine's environment and numerics" in r.stdout
    assert "1 facts differ: numerics_sha256" in r.stdout

    # only the other machine's registration: no check here -> FAIL, naming the command that registers
    registry["profiles"]["native"] = [other]
    reg.write_text(json.dumps(registry))
    r = _run("--registry", str(reg))
    assert r.returncode == 1
    assert "DIFFERS" not in r.stdout and "4/5 reproduced; 1 facts differ" in r.stdout
    assert "profile native: no registration matches this machine's environment" in r.stdout
    assert f"`make replay PROFILE=native ARGS='--register --registry {reg}'` -> FAIL" in r.stdout
    assert "replay: native FAIL" in r.stdout


@pytest.mark.slow
def test_the_batch_invariant_mode_registers_and_replays_under_its_own_key(tmp_path):
    """Issue 43: `--profile native+batch_invariant` is the native kernel profile with determinism.batch_invariant=true,
    registered beside the default mode's `native` (never replacing it) and replayed like any profile."""
    reg = tmp_path / "registry.json"
    small = ["--registry", str(reg), "--model", "tiny-gemma3", "--samples", "3", "--decode-problems", "2",
             "--decode-tokens", "3"]
    for key in ("native", "native+batch_invariant"):
        r = _run("--profile", key, "--register", *small)
        assert r.returncode == 0, r.stderr
        assert f"registered profile {key} " in r.stdout
    registry = json.loads(reg.read_text())
    [default], [invariant] = registry["profiles"]["native"], registry["profiles"]["native+batch_invariant"]
    assert "batch_invariant" not in default["determinism"]  # the default mode's record as before the setting
    assert invariant["determinism"]["batch_invariant"] is True and invariant["determinism"]["profile"] == "native"
    assert all(s["graft_equal"] for s in invariant["samples"])
    r = _run("--registry", str(reg))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "profile native+batch_invariant: 5/5 reproduced; environment matches the registered one -> PASS" in r.stdout
    assert "replay: native PASS, native+batch_invariant PASS" in r.stdout


def _mode(entry: dict) -> dict:
    """`entry` registered in the batch-invariant mode (its recorded determinism says so)."""
    return {**entry, "determinism": {**Determinism(batch_invariant=True).to_dict()}}


ZEN5 = {**ENV, "cpu_model": "AMD EPYC 9R45 (Zen 5)", "device_name": "AMD EPYC 9R45 (Zen 5)",
        "aten_cpu_capability": "AVX512" if ENV["aten_cpu_capability"] != "AVX512" else "AVX2"}


def test_in_the_mode_another_cpu_with_an_equal_fingerprint_is_a_check_that_must_reproduce():
    """Issue 52: the mode's bits move between CPUs whose numerics fingerprint for the mode is equal. Two
    registrations (this machine's and another CPU kind's, same mode fingerprint): both are checks, both reproduce,
    PASS; where the other CPU's hashes are not reproduced here the replay fails, naming it."""
    regs = [_mode(_entry(ZEN5)), _mode(_entry(ENV))]
    out = replay_registry.replay_profile(regs, _mode(_entry(ENV)), "native+batch_invariant")
    assert out.passed and len(out.checks) == 2 and not out.others
    assert out.verdict() == ("profile native+batch_invariant: 2 registrations match this machine's environment: "
                             "3/3 reproduced, 3/3 reproduced -> PASS")
    moved = [_mode(_entry(ZEN5, first="zz")), _mode(_entry(ENV))]
    out = replay_registry.replay_profile(moved, _mode(_entry(ENV)), "native+batch_invariant")
    assert not out.passed and out.verdict().endswith("2/3 reproduced, 3/3 reproduced -> FAIL")


def test_in_the_mode_another_fingerprint_or_the_default_mode_keeps_the_cpu_binding():
    # the mode with another fingerprint for it: a measurement, not a check
    out = replay_registry.replay_profile([_mode(_entry(ZEN5, numerics="z" * 64)), _mode(_entry(ENV))],
                                         _mode(_entry(ENV)), "native+batch_invariant")
    assert len(out.checks) == 1 and len(out.others) == 1
    # the default mode: another CPU is another environment whatever its fingerprint
    out = replay_registry.replay_profile([_entry(ZEN5), _entry(ENV)], _entry(ENV), "native")
    assert len(out.checks) == 1 and len(out.others) == 1
    assert "environment.cpu_model" in " ".join(out.others[0].environment_differences)


def test_registering_the_mode_on_a_second_cpu_kind_appends_beside_the_first():
    reg = {"format": replay_registry.REGISTRY_FORMAT, "params": {}, "profiles": {}}
    reg, replaced = replay_registry.register(reg, "native+batch_invariant", _mode(_entry(ZEN5)))
    reg, replaced = replay_registry.register(reg, "native+batch_invariant", _mode(_entry(ENV)))
    assert not replaced and len(reg["profiles"]["native+batch_invariant"]) == 2
    reg, replaced = replay_registry.register(reg, "native+batch_invariant", _mode(_entry(ENV, first="new")))
    assert replaced and len(reg["profiles"]["native+batch_invariant"]) == 2


def test_a_registration_under_the_batterys_former_format_is_this_machines_when_that_fingerprint_is():
    """The mode's battery changed format (kvgraft-numerics-invariant/2): a registration recorded under /1 is this
    machine's check when the machine's /1 fingerprint (`numerics_former` of the measurement) is the one recorded; a
    /1 fingerprint of another machine stays a measurement."""
    now = {**_mode(_entry(ENV, numerics="2" * 64)), "numerics_former": ["1" * 64]}
    out = replay_registry.replay_profile([_mode(_entry(ENV, numerics="1" * 64))], now, "native+batch_invariant")
    assert out.passed and len(out.checks) == 1
    out = replay_registry.replay_profile([_mode(_entry(ENV, numerics="9" * 64))], now, "native+batch_invariant")
    assert not out.passed and not out.checks and len(out.others) == 1


def _kernel(entry: dict, kernel: str) -> dict:
    """`entry` of the mode recorded by version `kernel` of its kernel (kvstore.KERNEL_RECORD)."""
    return {**entry, "determinism": {**entry["determinism"], KERNEL_RECORD: kernel}}


def test_a_registration_of_another_kernel_of_the_mode_is_never_compared():
    """Issue 58: the mode's kernel version is part of its recorded determinism. A registration made by the MKL-tile
    kernel (recorded before versions: none named) against a recomputation by a new kernel, same environment and
    every hash equal: not this machine's check (NOT COMPARABLE, named), so the replay says to register this kernel;
    --register keeps it beside the new kernel's registration."""
    old, now = _mode(_entry(ENV)), _kernel(_mode(_entry(ENV)), "fixed-dot16/1")
    out = replay_registry.replay_profile([old], now, "native+batch_invariant")
    assert not out.passed and not out.checks and len(out.others) == 1
    assert out.others[0].counted() == (
        f"NOT COMPARABLE: determinism.{KERNEL_RECORD}: registered {UNVERSIONED_KERNEL}, now fixed-dot16/1 (another "
        "kernel of the mode computes other bits: register this one)")
    assert "no registration matches" in out.verdict() and out.verdict().endswith("-> FAIL")
    reg = {"format": replay_registry.REGISTRY_FORMAT, "params": {}, "profiles": {"native+batch_invariant": [old]}}
    reg, replaced = replay_registry.register(reg, "native+batch_invariant", now)
    assert not replaced and reg["profiles"]["native+batch_invariant"] == [old, now]
    out = replay_registry.replay_profile(reg["profiles"]["native+batch_invariant"], now, "native+batch_invariant")
    assert out.passed and len(out.checks) == 1 and len(out.others) == 1  # the new kernel's registration is the check
