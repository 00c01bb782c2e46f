"""Energy of runs: measured from a hardware counter, else estimated by a named method, else declared unavailable.

Design invariant 5: energy is measured or declared unavailable — never 0 for a failed source, never an
estimate under a measured name. Three statuses, carried as the `energy_status` string of every row and run:
``measured:<source>`` (a counter), ``estimated:<method>`` (a model's guess, the method spelled out; never added
to, compared with or shown as a measured figure) and ``unavailable:<reason>``. Two sources are read directly:

- **nvml**: ``nvmlDeviceGetTotalEnergyConsumption`` (millijoules since driver load, Volta or newer),
  summed over all visible NVIDIA GPUs (package ``nvidia-ml-py``, module ``pynvml``). The counter
  updates every ~10-100 ms, so a zero delta (typical for windows under ~0.1 s) is reported unavailable.
- **rapl**: Linux powercap ``/sys/class/powercap/intel-rapl:<n>/energy_uj`` (microjoules), summed over
  the CPU package domains. Counters wrap at ``max_energy_range_uj``; a background thread samples them
  often enough to see every wrap. Reading ``energy_uj`` usually needs root (or a udev rule) since
  CVE-2020-8694; a permission error makes the source unavailable with that reason.

Where neither is readable (a VM), **codecarbon** (PyPI `codecarbon`, pinned in constraints.txt) estimates the
CPU's power with its own model: the CPU's TDP from its table (or 4 W per thread for a CPU it does not know) times
the share of the machine's CPUs this process and its children used over the window (its ``cpu_load`` mode,
``process`` tracking). Kinds: ``auto`` (NVML, else RAPL, else the estimate, else unavailable), ``measured``
(NVML, else RAPL, else unavailable: never an estimate), ``nvml``, ``rapl``, ``codecarbon``, ``none``.

Usage::

    meter = make_meter("auto")          # "auto" | "measured" | "nvml" | "rapl" | "codecarbon" | "none"
    with meter:
        run_the_work()
    reading = meter.reading             # EnergyReading(joules=..., source=..., reason=...)
    row["energy_j"], row["energy_status"] = reading.joules, reading.status

``python -c "from harness.run.energy import describe_energy; print(describe_energy())"`` prints what this
machine offers.
"""

from __future__ import annotations

import logging
import math
import re
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

__all__ = [
    "DEFAULT_RAPL_ROOT",
    "ENERGY_KINDS",
    "EnergyMeter",
    "EnergyReading",
    "describe_energy",
    "make_meter",
    "rapl_delta_uj",
]

ENERGY_KINDS = ("auto", "measured", "nvml", "rapl", "codecarbon", "none")
DEFAULT_RAPL_ROOT = Path("/sys/class/powercap")
NVML_MIN_WINDOW_S = 0.1  # NVML's energy counter updates every ~10-100 ms
_RAPL_PACKAGE_DIR = re.compile(r"^intel-rapl:\d+$")  # top-level domains; "intel-rapl:0:0" are subdomains
_RAPL_POLL_S = 10.0  # wrap period = max_energy_range_uj / power, e.g. 262 kJ / 500 W ~ 9 min


@dataclass(frozen=True)
class EnergyReading:
    """Energy of one window: ``joules`` with its ``source`` (and, for an estimate, its ``method``), or None with a
    ``reason``."""

    joules: float | None
    source: str | None
    reason: str | None
    method: str | None = None  # set: the joules are an estimate made by this method, not a measurement

    def __post_init__(self) -> None:
        if self.joules is None:
            if not self.reason:
                raise ValueError("an unavailable EnergyReading needs a reason")
        else:
            if not self.source:
                raise ValueError("a measured or estimated EnergyReading needs a source")
            if isinstance(self.joules, bool) or not math.isfinite(self.joules) or self.joules < 0:
                raise ValueError(f"measured joules must be a finite number >= 0, got {self.joules!r}")

    @classmethod
    def unavailable(cls, reason: str) -> EnergyReading:
        """A reading that declares energy unavailable, with the reason."""
        return cls(joules=None, source=None, reason=reason)

    @property
    def measured(self) -> bool:
        """True when ``joules`` holds a measured value (not an estimate)."""
        return self.joules is not None and self.method is None

    @property
    def estimated(self) -> bool:
        """True when ``joules`` holds an estimate (``method`` says how it was made)."""
        return self.joules is not None and self.method is not None

    @property
    def status(self) -> str:
        """``"measured:<source>"``, ``"estimated:<method>"`` or ``"unavailable:<reason>"`` (``energy_status``)."""
        if self.joules is None:
            return f"unavailable:{self.reason}"
        return f"estimated:{self.method}" if self.method is not None else f"measured:{self.source}"


class EnergyMeter:
    """Measures the energy of one window: ``start()`` then ``stop()``, or use it as a context manager.

    This base class is the *unavailable* meter: ``stop()`` returns ``EnergyReading.unavailable(reason)``.
    Sources subclass it and implement :meth:`_begin` / :meth:`_end`.
    """

    source: str | None = None

    def __init__(self, reason: str = "energy measurement disabled") -> None:
        self.reason = reason
        self.reading: EnergyReading | None = None
        self._t0: float | None = None

    def describe(self) -> str:
        """One line: what this meter measures, or why it cannot."""
        return f"energy: unavailable ({self.reason})"

    def start(self) -> Self:
        """Begin a window (restarts any window in progress)."""
        self.reading = None
        self._t0 = time.monotonic()
        self._begin()
        return self

    def stop(self) -> EnergyReading:
        """End the window and return its reading (also kept in :attr:`reading`)."""
        if self._t0 is None:
            raise RuntimeError("EnergyMeter.stop() called before start()")
        elapsed = time.monotonic() - self._t0
        self._t0 = None
        try:
            self.reading = self._end(elapsed)
        except Exception as exc:  # noqa: BLE001 - a failing counter means unavailable, never 0
            self.reading = EnergyReading.unavailable(f"{self.source or 'meter'} read failed: {exc}")
        return self.reading

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _begin(self) -> None:
        pass

    def _end(self, elapsed: float) -> EnergyReading:
        return EnergyReading.unavailable(self.reason)


# --- NVML -------------------------------------------------------------------------------------------


class _NvmlMeter(EnergyMeter):
    """Sum of ``nvmlDeviceGetTotalEnergyConsumption`` deltas (mJ) over all NVIDIA GPUs."""

    source = "nvml"

    def __init__(self, pynvml: Any, handles: list[Any], names: list[str]) -> None:
        super().__init__(reason="")
        self._nvml = pynvml
        self._handles = handles
        self._names = names
        self._start_mj: list[int] = []

    def describe(self) -> str:
        return f"energy: measured via nvml ({len(self._handles)} GPU(s): {', '.join(self._names)})"

    def _read(self) -> list[int]:
        return [int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(h)) for h in self._handles]

    def _begin(self) -> None:
        self._start_mj = self._read()

    def _end(self, elapsed: float) -> EnergyReading:
        end = self._read()
        delta_mj = sum(b - a for a, b in zip(self._start_mj, end, strict=True))
        if delta_mj < 0:
            return EnergyReading.unavailable("nvml counter went backwards (driver reloaded?)")
        if delta_mj == 0:
            if elapsed < NVML_MIN_WINDOW_S:
                return EnergyReading.unavailable("nvml window too short (counter updates every 10-100 ms)")
            return EnergyReading.unavailable(f"nvml counter did not advance over {elapsed:.3f} s")
        return EnergyReading(joules=delta_mj / 1000.0, source="nvml", reason=None)


def _probe_nvml() -> EnergyMeter:
    """An NVML meter, or an unavailable meter whose reason says why NVML cannot be used."""
    try:
        import pynvml
    except ImportError as exc:
        return EnergyMeter(f"pynvml not installed ({exc}); install nvidia-ml-py")
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError_* or OSError when libnvidia-ml is absent
        return EnergyMeter(f"no NVIDIA GPU (NVML init failed: {exc})")
    try:
        count = pynvml.nvmlDeviceGetCount()
        if count == 0:
            return EnergyMeter("no NVIDIA GPU (NVML sees 0 devices)")
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        names = []
        for h in handles:
            name = pynvml.nvmlDeviceGetName(h)
            names.append(name.decode() if isinstance(name, bytes) else str(name))
            pynvml.nvmlDeviceGetTotalEnergyConsumption(h)  # raises NotSupported on pre-Volta / MIG
    except Exception as exc:  # noqa: BLE001
        return EnergyMeter(f"NVML energy counter not readable ({exc})")
    return _NvmlMeter(pynvml, handles, names)


# --- RAPL -------------------------------------------------------------------------------------------


def rapl_delta_uj(start_uj: int, end_uj: int, max_range_uj: int) -> int:
    """Microjoules between two readings of one RAPL counter that wraps at ``max_range_uj``.

    Assumes at most one wrap between the readings (the meter samples often enough to ensure it).
    """
    if end_uj >= start_uj:
        return end_uj - start_uj
    return max_range_uj - start_uj + end_uj


@dataclass
class _RaplDomain:
    name: str
    energy_path: Path
    max_range_uj: int

    def read(self) -> int:
        return int(self.energy_path.read_text().strip())


class _RaplMeter(EnergyMeter):
    """Sum over RAPL package domains, sampled by a daemon thread so no counter wrap is missed."""

    source = "rapl"

    def __init__(self, domains: list[_RaplDomain], poll_s: float = _RAPL_POLL_S) -> None:
        super().__init__(reason="")
        self._domains = domains
        self._poll_s = poll_s
        self._lock = threading.Lock()
        self._last: list[int] = []
        self._total_uj = 0
        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None

    def describe(self) -> str:
        return f"energy: measured via rapl ({', '.join(d.name for d in self._domains)})"

    def _sample(self) -> None:
        with self._lock:
            now = [d.read() for d in self._domains]
            for d, prev, cur in zip(self._domains, self._last, now, strict=True):
                self._total_uj += rapl_delta_uj(prev, cur, d.max_range_uj)
            self._last = now

    def _poll(self) -> None:
        while not self._stop_event.wait(self._poll_s):
            try:
                self._sample()
            except OSError:
                return  # the final read in _end reports the failure

    def _begin(self) -> None:
        self._halt_thread()
        with self._lock:
            self._last = [d.read() for d in self._domains]
            self._total_uj = 0
        self._stop_event = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="rapl-energy-poll", daemon=True)
        self._thread.start()

    def _halt_thread(self) -> None:
        if self._thread is not None:
            self._stop_event.set()
            self._thread.join()
            self._thread = None

    def _end(self, elapsed: float) -> EnergyReading:
        self._halt_thread()
        self._sample()
        if self._total_uj <= 0:
            return EnergyReading.unavailable(f"rapl counter did not advance over {elapsed:.3f} s")
        return EnergyReading(joules=self._total_uj / 1e6, source="rapl", reason=None)


def _probe_rapl(root: Path = DEFAULT_RAPL_ROOT) -> EnergyMeter:
    """A RAPL meter over the package domains under ``root``, or an unavailable meter with the reason."""
    try:
        entries = sorted(p for p in root.iterdir() if _RAPL_PACKAGE_DIR.match(p.name))
    except FileNotFoundError:
        return EnergyMeter(f"RAPL not readable ({root} does not exist)")
    except OSError as exc:
        return EnergyMeter(f"RAPL not readable ({root}: {exc.strerror or exc})")
    domains: list[_RaplDomain] = []
    for entry in entries:
        try:
            name = (entry / "name").read_text().strip()
        except OSError:
            name = entry.name
        if not name.startswith("package") and name != entry.name:
            continue  # psys / dram-style top-level domains overlap the packages
        try:
            domain = _RaplDomain(
                name=f"{entry.name}({name})" if name != entry.name else entry.name,
                energy_path=entry / "energy_uj",
                max_range_uj=int((entry / "max_energy_range_uj").read_text().strip()),
            )
            domain.read()
        except PermissionError:
            return EnergyMeter(
                f"RAPL not readable ({entry / 'energy_uj'}: permission denied; needs root or a udev rule)"
            )
        except (OSError, ValueError) as exc:
            return EnergyMeter(f"RAPL not readable ({entry}: {exc})")
        domains.append(domain)
    if not domains:
        return EnergyMeter(f"RAPL not readable (no package domains under {root})")
    return _RaplMeter(domains)


# --- CodeCarbon: an estimate where no meter is readable -----------------------------------------------------------


class _CodeCarbonEstimate(EnergyMeter):
    """CodeCarbon's CPU power model (``cpu_load`` mode, ``process`` tracking): power = the CPU's TDP from CodeCarbon's
    table (or its default of 4 W per thread for a CPU it does not know) x the share of the machine's CPUs this
    process and its children used over the window (CPU seconds / wall seconds / CPU count). An estimate, labelled
    ``estimated:<method>`` everywhere; never added to or compared with measured joules."""

    source = "codecarbon"

    def __init__(self, cpu: Any, method: str) -> None:
        super().__init__(reason="")
        self._cpu = cpu
        self.method = method

    def describe(self) -> str:
        return f"energy: estimated ({self.method})"

    def _begin(self) -> None:
        self._cpu.start()

    def _end(self, elapsed: float) -> EnergyReading:
        _power, energy = self._cpu.measure_power_and_energy(last_duration=elapsed)
        joules = float(energy.kWh) * 3.6e6
        if not joules > 0:
            return EnergyReading.unavailable(f"codecarbon estimate is 0 J over {elapsed:.3f} s (no CPU time used)")
        return EnergyReading(joules=joules, source=self.source, reason=None, method=self.method)


def _probe_codecarbon() -> EnergyMeter:
    """A CodeCarbon estimate, or an unavailable meter saying why (not installed, no CPU model, no TDP)."""
    try:
        import codecarbon
        from codecarbon.core.cpu import DEFAULT_POWER_PER_CORE, TDP
        from codecarbon.core.util import count_cpus
        from codecarbon.external.hardware import CPU
    except ImportError as exc:
        return EnergyMeter(f"no estimate either: codecarbon not installed ({exc}); pip install -c constraints.txt "
                           "codecarbon")
    logging.getLogger("codecarbon").setLevel(logging.ERROR)  # it warns about unknown CPUs; the method says so
    try:
        tdp = TDP()
        if not tdp.tdp:
            return EnergyMeter(f"no estimate either: codecarbon knows no TDP for CPU {tdp.model!r}")
        known = tdp._get_cpu_power_from_registry(tdp.model) is not None  # noqa: SLF001 - how its TDP was chosen
        cpu = CPU.from_utils(output_dir=tempfile.gettempdir(), mode="cpu_load", model=tdp.model, tdp=tdp.tdp,
                             tracking_mode="process")
    except Exception as exc:  # noqa: BLE001 - its hardware probes vary by machine; any failure = unavailable
        return EnergyMeter(f"no estimate either: codecarbon failed ({type(exc).__name__}: {exc})")
    origin = "its table" if known else f"not in its table: {DEFAULT_POWER_PER_CORE} W x {count_cpus()} threads"
    method = (f"codecarbon {codecarbon.__version__} cpu_load: TDP {tdp.tdp:g} W for {tdp.model} ({origin}) x this "
              "process's CPU share")
    return _CodeCarbonEstimate(cpu, method)


# --- selection --------------------------------------------------------------------------------------


def make_meter(kind: str = "auto", *, rapl_root: Path = DEFAULT_RAPL_ROOT) -> EnergyMeter:
    """A meter for ``kind`` (``auto``: NVML, else RAPL, else CodeCarbon's estimate, else unavailable; ``measured``:
    the same without the estimate; ``none``: always unavailable).

    Never raises for a missing source: the returned meter then reports ``unavailable:<reason>``.
    Raises ValueError for an unknown ``kind``.
    """
    if kind not in ENERGY_KINDS:
        raise ValueError(f"unknown energy meter kind {kind!r}; choose one of {', '.join(ENERGY_KINDS)}")
    if kind == "none":
        return EnergyMeter("energy measurement disabled (energy=none)")
    if kind == "nvml":
        return _probe_nvml()
    if kind == "rapl":
        return _probe_rapl(rapl_root)
    if kind == "codecarbon":
        return _probe_codecarbon()
    nvml = _probe_nvml()
    if nvml.source is not None:
        return nvml
    rapl = _probe_rapl(rapl_root)
    if rapl.source is not None:
        return rapl
    if kind == "auto":
        estimate = _probe_codecarbon()
        if estimate.source is not None:
            return estimate
        return EnergyMeter(f"{nvml.reason} and {rapl.reason}; {estimate.reason}")
    return EnergyMeter(f"{nvml.reason} and {rapl.reason}")


def describe_energy(kind: str = "auto", *, rapl_root: Path = DEFAULT_RAPL_ROOT) -> str:
    """One-line status of energy measurement on this machine, for printing at the start of a run."""
    return make_meter(kind, rapl_root=rapl_root).describe()
