"""The compute environment is part of what a graft's exactness depends on: an artifact deposited in another
environment is refused naming each difference, unless the caller opts in (then a warning says so); artifacts
recorded before the environment value existed are compared on the fields they have; the portable profile's
kernel variables are in force before torch is imported, or the process is refused."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvstore import Determinism, IncompatibleError, SettingsError, from_bytes, to_bytes
from kvstore.backends.transformers import TransformersBackend, environment_fingerprint
from kvstore.environment import (
    ENVIRONMENT_FORMAT,
    PROFILES,
    check_profile,
    current_environment,
    environment_differences,
    environment_id,
    profile_problems,
)

REPO = Path(__file__).resolve().parents[2]
IDS = [2] + [4 + (i * 7) % 200 for i in range(23)]  # 24 tokens: crosses tiny-gemma3's window of 16


def _elsewhere(snapshot, **changes):
    """The snapshot as if deposited in another environment: its recorded environment rewritten, through bytes."""
    env = {**snapshot.environment, **changes}
    return from_bytes(to_bytes(dataclasses.replace(snapshot, environment=env)))


def test_the_environment_value_is_stable_and_names_the_kernel_paths():
    env = current_environment()
    d = env.to_dict()
    assert d == environment_fingerprint() and list(d) == sorted(d)
    assert d["format"] == ENVIRONMENT_FORMAT and d["device_kind"] == "cpu"
    for key in ("cpu_vendor", "cpu_model", "aten_cpu_capability", "mkl_cbwr", "onednn_max_cpu_isa", "torch",
                "transformers", "torch_threads"):
        assert key in d, key
    assert len(env.id) == 16 and env.id == environment_id(d)
    assert environment_id({**d, "python": "0.0"}) == env.id  # informational fields do not bind
    assert environment_id({**d, "mkl_cbwr": "AVX512"}) != env.id


def test_an_artifact_is_deposited_with_this_environment(tiny_gemma3):
    snap = TransformersBackend.of(tiny_gemma3).deposit(IDS)
    assert snap.environment == environment_fingerprint(tiny_gemma3.device)
    assert snap.determinism["profile"] == "native"
    assert "allow_environment_mismatch" not in snap.determinism  # a graft policy, not a setting


def _foreign_cpu() -> tuple[str, str]:
    """A CPU vendor and model other than this machine's (the tests run on Intel and AMD machines alike)."""
    if environment_fingerprint()["cpu_vendor"] == "GenuineIntel":
        return "AuthenticAMD", "AMD EPYC 9654 96-Core Processor"
    return "GenuineIntel", "Intel(R) Xeon(R) Platinum"


def test_graft_refuses_an_artifact_from_another_environment_naming_each_difference(tiny_gemma3):
    vendor, model = _foreign_cpu()
    snap = _elsewhere(TransformersBackend.of(tiny_gemma3).deposit(IDS), cpu_vendor=vendor, mkl_cbwr="AVX512", cpu_model=model)
    with pytest.raises(IncompatibleError) as info:
        TransformersBackend.of(tiny_gemma3).graft(snap, token_ids=IDS)
    msg = str(info.value)
    assert f"environment.cpu_vendor: artifact {vendor!r}" in msg
    assert "environment.mkl_cbwr: artifact 'AVX512', this process None" in msg
    assert "environment.cpu_model" in msg
    assert "Deposit it again here" in msg and "allow_environment_mismatch=True" in msg  # says what to do, in kvstore's terms


def test_the_opt_in_grafts_anyway_and_warns(tiny_gemma3):
    snap = _elsewhere(TransformersBackend.of(tiny_gemma3).deposit(IDS), cpu_model=_foreign_cpu()[1])
    with pytest.warns(RuntimeWarning, match="not guaranteed exact.*environment.cpu_model"):
        TransformersBackend.of(tiny_gemma3).graft(snap, token_ids=IDS, allow_environment_mismatch=True)
    allowing = dataclasses.replace(tiny_gemma3, determinism=dataclasses.replace(
        tiny_gemma3.determinism, allow_environment_mismatch=True))
    with pytest.warns(RuntimeWarning):
        cache = TransformersBackend.of(allowing).graft(snap, token_ids=IDS)  # the model's policy (determinism config)
    assert cache.get_seq_length() == len(IDS)
    with pytest.raises(IncompatibleError):  # an explicit False wins over the model's policy
        TransformersBackend.of(allowing).graft(snap, token_ids=IDS, allow_environment_mismatch=False)


def test_the_opt_in_does_not_excuse_other_settings(tiny_gemma3):
    snap = TransformersBackend.of(tiny_gemma3).deposit(IDS)
    other = from_bytes(to_bytes(dataclasses.replace(snap, determinism={**snap.determinism, "profile": "portable"})))
    with pytest.raises(IncompatibleError, match="determinism.profile: artifact 'portable', this process 'native'"):
        TransformersBackend.of(tiny_gemma3).graft(other, token_ids=IDS, allow_environment_mismatch=True)


def test_an_artifact_recorded_before_the_environment_value_is_read_by_its_format_and_refused(tiny_gemma3):
    """A record of before kvgraft-env/1 is read by what that format held (issue 61: never "missing = skip"): its
    kernel variables and CUDA facts were unset on a CPU then, so they compare as unset; the CPU vendor, model and
    thread count it never recorded are differences, so it is refused even on the machine that made it."""
    now = environment_fingerprint(tiny_gemma3.device)
    legacy_env = {"cpu_isa": now["aten_cpu_capability"], "device_kind": "cpu", "device_name": now["device_name"],
                  "machine": now["machine"], "python": "3.0.0", "torch": now["torch"],
                  "transformers": now["transformers"]}
    snap = TransformersBackend.of(tiny_gemma3).deposit(IDS[:20])
    legacy_det = {k: v for k, v in snap.determinism.items() if k != "profile"}
    legacy = from_bytes(to_bytes(dataclasses.replace(snap, environment=legacy_env, determinism=legacy_det)))
    legacy.numerics = snap.numerics
    with pytest.raises(IncompatibleError, match="environment.cpu_model: artifact '<not recorded>'"):
        TransformersBackend.of(tiny_gemma3).graft(legacy, token_ids=IDS)
    portable = {**now, "mkl_cbwr": "AVX2", "onednn_max_cpu_isa": "AVX2"}
    assert environment_differences(legacy_env, portable) == [
        f"environment.cpu_model: artifact '<not recorded>', this process {now['cpu_model']!r}",
        f"environment.cpu_vendor: artifact '<not recorded>', this process {now['cpu_vendor']!r}",
        "environment.mkl_cbwr: artifact None, this process 'AVX2'",
        "environment.onednn_max_cpu_isa: artifact None, this process 'AVX2'",
        f"environment.torch_threads: artifact '<not recorded>', this process {now['torch_threads']!r}",
    ]
    missing = {k: v for k, v in legacy_env.items() if k != "torch"}
    assert f"environment.torch: artifact '<not recorded>', this process {now['torch']!r}" in environment_differences(
        missing, now)
    assert environment_differences({}, now)[0].startswith("environment.format: artifact <empty record>")


def test_a_new_style_environment_missing_a_field_is_a_difference():
    now = environment_fingerprint()
    partial = {k: v for k, v in now.items() if k != "cpu_vendor"}
    assert environment_differences(partial, now) == [
        f"environment.cpu_vendor: artifact '<not recorded>', this process {now['cpu_vendor']!r}"]


def test_an_unknown_profile_is_a_settings_error():
    with pytest.raises(SettingsError, match=r"determinism.profile='fast': use one of \['native', 'portable'\]"):
        Determinism(profile="fast")
    assert Determinism(allow_environment_mismatch=True) == Determinism()  # the policy is not a setting


@pytest.mark.skipif(any(os.environ.get(v) for v in PROFILES["portable"]), reason="kernel variables set outside")
def test_the_portable_profile_is_refused_when_its_variables_were_not_set_before_torch():
    assert profile_problems("portable")
    with pytest.raises(SettingsError, match="ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2 ONEDNN_MAX_CPU_ISA=AVX2"):
        check_profile("portable")
    with pytest.raises(SettingsError, match="before torch is imported"):
        Determinism(profile="portable").apply()


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in PROFILES["portable"]}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          env={**base, **env}, timeout=300)


def _profile_probe(torch_first: bool) -> tuple[dict, dict, bool]:
    """In a fresh process: enter_profile('portable') (after importing torch when `torch_first`: it re-executes),
    then the environment fingerprint's kernel fields, the variables the process started with, and whether it was
    re-executed."""
    code = (
        "import json, os, sys\n"
        + ("import torch\n" if torch_first else "assert 'torch' not in sys.modules\n")  # kvstore imports lazily
        + "from kvstore.environment import enter_profile\n"
        "enter_profile('portable')\n"
        "from kvstore import Determinism\n"
        "from kvstore.backends.transformers import environment_fingerprint\n"
        "Determinism(profile='portable').apply()\n"
        "e = environment_fingerprint()\n"
        "print(json.dumps({k: e[k] for k in ('aten_cpu_capability', 'mkl_cbwr', 'onednn_max_cpu_isa', 'profile')}))\n"
        "start = dict(x.split('=', 1) for x in open('/proc/self/environ').read().split('\\0') if '=' in x)\n"
        "print(json.dumps({v: start.get(v) for v in ('ATEN_CPU_CAPABILITY', 'MKL_CBWR', 'ONEDNN_MAX_CPU_ISA')}))\n"
        "print(json.dumps(bool(os.environ.get('KVGRAFT_PROFILE_REEXEC'))))\n"
    )
    r = _python(code)
    assert r.returncode == 0, r.stderr
    env, start, reexec = (json.loads(x) for x in r.stdout.strip().splitlines()[-3:])
    return env, start, reexec


def test_enter_profile_sets_the_variables_before_torch_starts_in_a_fresh_process():
    env, start, _ = _profile_probe(torch_first=True)
    assert env == {"aten_cpu_capability": "AVX2", "mkl_cbwr": "AVX2", "onednn_max_cpu_isa": "AVX2",
                   "profile": "portable"}
    assert start == PROFILES["portable"]  # in force from the start of the process that ran the model


def test_variables_set_after_torch_was_imported_are_refused():
    code = (
        "import os, torch\n"
        "os.environ.update(ATEN_CPU_CAPABILITY='avx2', MKL_CBWR='AVX2', ONEDNN_MAX_CPU_ISA='AVX2')\n"
        "from kvstore import Determinism\n"
        "Determinism(profile='portable').apply()\n"
    )
    r = _python(code)
    assert r.returncode != 0 and "was set after torch was imported" in r.stderr, r.stderr


def test_enter_profile_before_torch_sets_the_variables_without_re_executing():
    env, _, reexec = _profile_probe(torch_first=False)
    env.pop("profile")
    assert env == {"aten_cpu_capability": "AVX2", "mkl_cbwr": "AVX2", "onednn_max_cpu_isa": "AVX2"}
    assert reexec is False
