"""The energy and cost bill of a tuning job, per phase.

Work is counted where it happens: CPU-seconds of the search (the tuning process),
of the build workers and of the measurement workers, and seconds each device was
busy measuring. Energy comes from the hardware's own counters where the machine
exposes them (RAPL package energy on CPUs, NVML's total-energy counter on NVIDIA
GPUs) and is split over phases by their share of the work; otherwise it is estimated
from CPU-seconds and a per-core power figure, and labelled as estimated.
"""

from __future__ import annotations

import glob
import os
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

DEFAULT_WATTS_PER_CORE = 7.5  # a busy server core, uncore share included (~280 W / 64 cores, EPYC 7763 class)


class EnergyMeter(ABC):
    """Hardware energy counters, each wrapping to zero at its own range.

    ``start`` it, ``sample`` it at least once per wrap period (the ledger is sampled every round), and
    ``used_j`` is the energy since ``start``. Each counter is unwrapped on its own: a sum of counters
    does not wrap where any one of them does.
    """

    label: str
    ranges_j: list[float]  # per counter: the value it wraps to zero at

    @abstractmethod
    def read_j(self) -> list[float]:
        """Each counter, in joules."""

    def start(self) -> None:
        self._last = self.read_j()
        self.used_j = 0.0

    def sample(self) -> float:
        """Add what each counter rose since the last sample (at most one wrap) and return ``used_j``."""
        now = self.read_j()
        for before, after, wrap in zip(self._last, now, self.ranges_j):
            self.used_j += after - before if after >= before else after + wrap - before
        self._last = now
        return self.used_j


class RaplMeter(EnergyMeter):
    """Intel/AMD RAPL package energy from the powercap sysfs tree (all packages summed).

    A package counter wraps at ``max_energy_range_uj``, about 262 kJ: some 20 minutes of a busy server.
    """

    label = "RAPL package energy"

    def __init__(self, root: str = "/sys/class/powercap") -> None:
        self.zones = sorted(z for z in glob.glob(os.path.join(root, "intel-rapl:*")) if z.count(":") == 1)
        if not self.zones:
            raise OSError(f"no RAPL package zones under {root}")
        self.ranges_j = [_read_int(os.path.join(z, "max_energy_range_uj")) / 1e6 for z in self.zones]
        self.read_j()  # readable (root only on recent kernels)?

    def read_j(self) -> list[float]:
        return [_read_int(os.path.join(z, "energy_uj")) / 1e6 for z in self.zones]


class NvmlMeter(EnergyMeter):
    """NVML's total energy since driver load (a 64-bit count of millijoules), per GPU the job measures on."""

    label = "NVML GPU energy"

    def __init__(self, indices: Sequence[int]) -> None:
        import pynvml

        pynvml.nvmlInit()
        self._nvml = pynvml
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in indices]
        self.ranges_j = [2**64 / 1e3] * len(self._handles)
        self.read_j()

    def read_j(self) -> list[float]:
        return [self._nvml.nvmlDeviceGetTotalEnergyConsumption(h) / 1e3 for h in self._handles]


def _read_int(path: str) -> int:
    with open(path, encoding="ascii") as f:
        return int(f.read().strip())


def cpu_meter() -> EnergyMeter | None:
    """RAPL where this machine exposes it (not in most VMs), else None: CPU energy is then estimated."""
    try:
        return RaplMeter()
    except (OSError, ValueError):
        return None


def gpu_meter(indices: Sequence[int]) -> EnergyMeter | None:
    """NVML's counter for ``indices``; None without GPUs, without NVML, or on GPUs that lack the counter."""
    if not indices:
        return None
    try:
        return NvmlMeter(indices)
    except Exception:  # noqa: BLE001  pynvml raises NVMLError subclasses, or ImportError without the library
        return None


@dataclass
class EnergyLedger:
    """Reads the meters when a job starts, as it goes (``sample``) and at its end, and turns its work into a bill."""

    cpu: EnergyMeter | None = None
    gpu: EnergyMeter | None = None
    watts_per_core: float = DEFAULT_WATTS_PER_CORE
    price_per_device_hour: float | None = None

    def __post_init__(self) -> None:
        if not self.watts_per_core > 0:
            raise ValueError(f"--watts-per-core must be a positive number; got {self.watts_per_core}")
        if self.price_per_device_hour is not None and not self.price_per_device_hour >= 0:
            raise ValueError(f"--price-per-hour must be zero or more; got {self.price_per_device_hour}")
        self.start()

    def start(self) -> None:
        """Read the counters: the bill covers what happens from here on."""
        for meter in self._meters():
            meter.start()

    def sample(self) -> None:
        """Read the counters again; reading them at least once per wrap period keeps the bill right."""
        for meter in self._meters():
            meter.sample()

    def bill(self, work: Mapping[str, Mapping[str, float]], wall_s: float, devices: int,
             wasted: Mapping[str, float]) -> dict[str, Any]:
        """The job's bill: per phase CPU-seconds, device-seconds and joules, totals, waste and cost.

        ``work``: phase -> {"cpu_s", "device_s"}; ``devices``: how many devices the job held;
        ``wasted``: the CPU- and device-seconds of measurements that never improved a task's best.
        """
        cpu_total = sum(p["cpu_s"] for p in work.values())
        device_total = sum(p["device_s"] for p in work.values())
        cpu_j, cpu_label = self._cpu_energy(cpu_total)
        gpu_j = None
        if self.gpu is not None:
            gpu_j = self.gpu.sample()
        phases = {}
        for name, p in work.items():
            share_cpu = p["cpu_s"] / cpu_total if cpu_total else 0.0
            share_dev = p["device_s"] / device_total if device_total else 0.0
            joules = cpu_j * share_cpu + (gpu_j * share_dev if gpu_j is not None else 0.0)
            phases[name] = {"cpu_s": round(p["cpu_s"], 3), "device_s": round(p["device_s"], 3),
                            "energy_j": round(joules, 1)}
        total_j = cpu_j + (gpu_j or 0.0)
        wasted_j = (cpu_j * wasted["cpu_s"] / cpu_total if cpu_total else 0.0) + \
            (gpu_j * wasted["device_s"] / device_total if gpu_j is not None and device_total else 0.0)
        bill = {
            "energy_j": round(total_j, 1),
            "energy_wh": round(total_j / 3600, 4),
            "cpu_energy_j": round(cpu_j, 1),
            "gpu_energy_j": None if gpu_j is None else round(gpu_j, 1),
            "method": {"cpu": cpu_label, "gpu": self.gpu.label + " (measured)" if self.gpu else None},
            "estimated": self.cpu is None,
            "phases": phases,
            "cpu_s": round(cpu_total, 3),
            "device_s_measuring": round(work.get("measure", {}).get("device_s", 0.0), 3),
            "wasted": {**{k: round(v, 3) if isinstance(v, float) else v for k, v in wasted.items()},
                       "energy_j": round(wasted_j, 1)},
            "wall_s": round(wall_s, 2),
            "devices": devices,
        }
        if self.price_per_device_hour is not None:
            bill["price_per_device_hour"] = self.price_per_device_hour
            bill["cost"] = round(self.price_per_device_hour * devices * wall_s / 3600, 6)
        return bill

    def _cpu_energy(self, cpu_s: float) -> tuple[float, str]:
        if self.cpu is not None:
            return self.cpu.sample(), self.cpu.label + " (measured)"
        return cpu_s * self.watts_per_core, f"estimated: {self.watts_per_core:g} W per busy core x CPU-seconds"

    def _meters(self) -> list[EnergyMeter]:
        return [m for m in (self.cpu, self.gpu) if m is not None]
