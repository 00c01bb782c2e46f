"""Energy is measured from a counter, else estimated under its method's name, else declared unavailable with a
reason: never 0, never an estimate under a measured name."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.run.energy import EnergyReading, describe_energy, make_meter, rapl_delta_uj

MAX_RANGE = 262_143_328_850  # a typical package max_energy_range_uj


def _fake_rapl(root: Path, domains: dict[str, tuple[str, int]]) -> Path:
    """``{dir: (name, energy_uj)}`` as a fake /sys/class/powercap tree."""
    for dirname, (name, energy) in domains.items():
        d = root / dirname
        d.mkdir(parents=True)
        (d / "name").write_text(name + "\n")
        (d / "energy_uj").write_text(f"{energy}\n")
        (d / "max_energy_range_uj").write_text(f"{MAX_RANGE}\n")
    return root


def _set(root: Path, dirname: str, energy: int) -> None:
    (root / dirname / "energy_uj").write_text(f"{energy}\n")


def test_none_kind_is_unavailable_with_a_reason() -> None:
    meter = make_meter("none")
    with meter:
        pass
    reading = meter.reading
    assert reading is not None
    assert reading.joules is None and reading.source is None
    assert reading.reason
    assert reading.status.startswith("unavailable:")


def test_auto_on_this_machine_is_measured_with_a_source_or_unavailable_with_a_reason() -> None:
    meter = make_meter("auto")
    meter.start()
    time.sleep(0.2)
    reading = meter.stop()
    if reading.measured:
        assert reading.source and reading.joules >= 0
        assert reading.status == f"measured:{reading.source}"
    elif reading.estimated:
        assert reading.joules > 0 and reading.status == f"estimated:{reading.method}"
    else:
        assert reading.reason and reading.status == f"unavailable:{reading.reason}"
    assert describe_energy().startswith("energy: ")


def test_unknown_kind_is_rejected() -> None:
    with pytest.raises(ValueError, match="auto, measured, nvml, rapl, codecarbon, none"):
        make_meter("zeus")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"joules": None, "source": None, "reason": None},  # unavailable needs a reason
        {"joules": 1.0, "source": None, "reason": None},  # measured needs a source
        {"joules": -1.0, "source": "rapl", "reason": None},
        {"joules": float("nan"), "source": "rapl", "reason": None},
    ],
)
def test_inconsistent_readings_cannot_be_built(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        EnergyReading(**kwargs)


def test_rapl_delta_handles_wraparound() -> None:
    assert rapl_delta_uj(100, 600, MAX_RANGE) == 500
    assert rapl_delta_uj(MAX_RANGE - 100, 400, MAX_RANGE) == 500


def test_rapl_sums_package_domains_across_a_wrap(tmp_path: Path) -> None:
    root = _fake_rapl(
        tmp_path,
        {
            "intel-rapl:0": ("package-0", MAX_RANGE - 1_000_000),
            "intel-rapl:0:0": ("core", 5),  # subdomain: part of package-0, not added again
            "intel-rapl:1": ("package-1", 10_000_000),
            "intel-rapl:2": ("psys", 0),  # platform domain overlaps the packages
        },
    )
    meter = make_meter("rapl", rapl_root=root)
    assert meter.describe().startswith("energy: measured via rapl")
    meter.start()
    _set(root, "intel-rapl:0", 2_000_000)  # wrapped: 1 J before the wrap + 2 J after
    _set(root, "intel-rapl:0:0", 999_999_999)
    _set(root, "intel-rapl:1", 14_000_000)  # 4 J
    _set(root, "intel-rapl:2", 999_999_999)
    reading = meter.stop()
    assert reading.status == "measured:rapl"
    assert reading.joules == pytest.approx(7.0)


def test_rapl_counter_that_does_not_move_is_not_reported_as_zero(tmp_path: Path) -> None:
    root = _fake_rapl(tmp_path, {"intel-rapl:0": ("package-0", 42)})
    meter = make_meter("rapl", rapl_root=root)
    with meter:
        pass
    assert meter.reading is not None and meter.reading.joules is None
    assert "did not advance" in meter.reading.status


def test_rapl_missing_or_unreadable_is_unavailable_with_the_reason(tmp_path: Path) -> None:
    reading = make_meter("rapl", rapl_root=tmp_path / "absent").start().stop()
    assert reading.joules is None and "does not exist" in reading.reason
    if os.geteuid() == 0:
        pytest.skip("root reads mode-000 files; permission case needs an unprivileged user")
    root = _fake_rapl(tmp_path / "sys", {"intel-rapl:0": ("package-0", 1)})
    (root / "intel-rapl:0" / "energy_uj").chmod(0)
    reading = make_meter("rapl", rapl_root=root).start().stop()
    assert reading.joules is None and "permission denied" in reading.reason


def test_failed_nvml_and_rapl_give_a_combined_reason(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def fail() -> None:
        raise RuntimeError("NVML Shared Library Not Found")

    monkeypatch.setitem(sys.modules, "pynvml", SimpleNamespace(nvmlInit=fail))
    reading = make_meter("measured", rapl_root=tmp_path / "absent").start().stop()
    assert reading.joules is None
    assert reading.reason.startswith("no NVIDIA GPU (NVML init failed: NVML Shared Library Not Found)")
    assert "RAPL not readable" in reading.reason


def _fake_pynvml(counter: list[int]) -> SimpleNamespace:
    return SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: b"Fake GPU",
        nvmlDeviceGetTotalEnergyConsumption=lambda h: counter[0] * (h + 1),
    )


def test_nvml_sums_devices_in_joules(monkeypatch: pytest.MonkeyPatch) -> None:
    counter = [1000]
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(counter))
    meter = make_meter("nvml")
    meter.start()
    counter[0] += 500  # device 0: +500 mJ, device 1: +1000 mJ
    reading = meter.stop()
    assert reading.status == "measured:nvml"
    assert reading.joules == pytest.approx(1.5)


def test_nvml_zero_delta_over_a_short_window_is_flagged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml([1000]))
    with make_meter("nvml") as meter:
        pass
    assert meter.reading == EnergyReading(
        joules=None, source=None, reason="nvml window too short (counter updates every 10-100 ms)"
    )


def _busy(seconds: float) -> None:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        pass


def test_without_a_meter_auto_estimates_with_codecarbon_and_says_so(monkeypatch: pytest.MonkeyPatch,
                                                                    tmp_path: Path) -> None:
    pytest.importorskip("codecarbon", reason="codecarbon is a dependency (pyproject.toml); make setup installs it")
    monkeypatch.setitem(sys.modules, "pynvml", SimpleNamespace(nvmlInit=lambda: (_ for _ in ()).throw(OSError("no"))))
    meter = make_meter("auto", rapl_root=tmp_path / "absent")
    assert meter.describe().startswith("energy: estimated (codecarbon ")
    meter.start()
    _busy(0.3)
    reading = meter.stop()
    assert reading.estimated and not reading.measured and reading.joules > 0
    assert reading.status.startswith("estimated:codecarbon ") and "TDP" in reading.status
    assert reading.method and reading.method in reading.status


def test_an_estimate_of_zero_joules_is_unavailable_not_zero() -> None:
    pytest.importorskip("codecarbon", reason="codecarbon is a dependency (pyproject.toml); make setup installs it")
    meter = make_meter("codecarbon")
    meter.start()
    time.sleep(0.2)  # sleeping uses no CPU time: CodeCarbon's process model estimates ~0 W
    reading = meter.stop()
    assert reading.joules is None or reading.joules > 0
    if reading.joules is None:
        assert reading.status.startswith("unavailable:codecarbon estimate is 0 J")


def test_an_estimated_reading_is_never_a_measured_one() -> None:
    r = EnergyReading(joules=1.5, source="codecarbon", reason=None, method="codecarbon 3.3.2 cpu_load: TDP 8 W")
    assert r.estimated and not r.measured and r.status == "estimated:codecarbon 3.3.2 cpu_load: TDP 8 W"
    m = EnergyReading(joules=1.5, source="rapl", reason=None)
    assert m.measured and not m.estimated and m.status == "measured:rapl"
