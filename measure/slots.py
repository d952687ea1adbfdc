"""Device slots: where a candidate is timed.

A CPU slot is a set of host cores the measuring process is pinned to (the candidate
is built for that many threads); a GPU slot is one CUDA device, found through NVML
with its name, memory and clocks recorded; a remote slot is a device behind TVM's
RPC tracker. Slots are discovered and checked before tuning starts, so a device
that does not exist is an error up front, not a column of failed trials.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


class DeviceNotFound(ValueError):
    """A requested device is not there."""


@dataclass(frozen=True)
class RpcAddress:
    host: str
    port: int
    key: str

    def __str__(self) -> str:
        return f"rpc:{self.host}:{self.port}:{self.key}"


@dataclass(frozen=True)
class DeviceSlot:
    """One place to time candidates; ``device_type`` is TVM's ("cpu", "cuda")."""

    kind: str  # "cpu" | "cuda" | "rpc"
    name: str
    device_type: str = "cpu"
    device_id: int = 0
    cores: tuple[int, ...] = ()
    rpc: RpcAddress | None = None
    info: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    @property
    def threads(self) -> int:
        return len(self.cores) or 1


def host_cores() -> list[int]:
    """The cores this process may run on (its affinity mask, not the machine's total)."""
    return sorted(os.sched_getaffinity(0))


def cpu_slots(threads: int, cores: Sequence[int] | None = None) -> list[DeviceSlot]:
    """As many disjoint slots of ``threads`` cores as the host has (at least one)."""
    cores = list(cores if cores is not None else host_cores())
    if threads < 1 or threads > len(cores):
        raise DeviceNotFound(f"a CPU slot needs 1..{len(cores)} cores (this host's); asked for {threads}")
    chunks = [tuple(cores[i:i + threads]) for i in range(0, len(cores) - threads + 1, threads)]
    return [DeviceSlot("cpu", f"cpu{c[0]}-{c[-1]}" if len(c) > 1 else f"cpu{c[0]}", "cpu", 0, c) for c in chunks]


def cuda_slots(device_ids: Sequence[int] | None = None) -> list[DeviceSlot]:
    """One slot per CUDA device (all of them by default), described through NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as err:  # noqa: BLE001  (no driver, no library: no GPU)
        raise DeviceNotFound(f"no NVIDIA GPU found (NVML: {err}); use --target cpu or a machine with a GPU") from None
    try:
        count = pynvml.nvmlDeviceGetCount()
        ids = list(range(count)) if device_ids is None else list(device_ids)
        if not ids:
            raise DeviceNotFound("no NVIDIA GPU found (NVML reports 0 devices)")
        slots = []
        for i in ids:
            if not 0 <= i < count:
                raise DeviceNotFound(f"cuda:{i} does not exist; this machine has {count} GPU(s): cuda:0..cuda:{count - 1}")
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            slots.append(DeviceSlot("cuda", f"cuda:{i}", "cuda", i, info=gpu_info(pynvml, handle)))
        return slots
    finally:
        pynvml.nvmlShutdown()


def gpu_info(pynvml: Any, handle: Any) -> dict[str, Any]:
    """Name, memory and clocks of one GPU, as recorded with every measurement."""
    name = pynvml.nvmlDeviceGetName(handle)
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    return {
        "name": name.decode() if isinstance(name, bytes) else name,
        "memory_total_mib": memory.total // 2**20,
        "sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
        "max_sm_clock_mhz": pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM),
        "memory_clock_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM),
    }


def rpc_slot(address: RpcAddress, device_type: str = "cpu") -> DeviceSlot:
    """A remote device; the tracker must answer and hold a server under ``address.key``."""
    from tvm import rpc

    try:
        with socket.create_connection((address.host, address.port), timeout=5):
            pass
        summary = rpc.connect_tracker(address.host, address.port).summary()
    except (OSError, RuntimeError) as err:
        raise DeviceNotFound(f"no RPC tracker at {address.host}:{address.port} ({err})") from None
    queues = summary.get("queue_info", {})
    if address.key not in queues:
        keys = ", ".join(sorted(queues)) or "none"
        raise DeviceNotFound(f"the RPC tracker at {address.host}:{address.port} has no server with key "
                             f"{address.key!r}; keys there: {keys}")
    return DeviceSlot("rpc", str(address), device_type, 0, rpc=address, info=dict(queues[address.key]))


def parse_device(text: str) -> tuple[str, Any]:
    """``cpu``, ``cuda:N`` or ``rpc:HOST:PORT:KEY`` to (kind, detail)."""
    parts = text.strip().split(":")
    if parts == ["cpu"]:
        return "cpu", None
    if parts[0] == "cuda" and len(parts) == 2 and parts[1].isdigit():
        return "cuda", int(parts[1])
    if parts[0] == "rpc" and len(parts) == 4 and parts[2].isdigit() and parts[3]:
        return "rpc", RpcAddress(parts[1], int(parts[2]), parts[3])
    raise DeviceNotFound(f"unknown device {text!r}; expected cpu, cuda:N or rpc:HOST:PORT:KEY")


def discover(devices: Sequence[str] | None, target_kind: str, threads: int) -> list[DeviceSlot]:
    """The slots for ``devices`` (default: every local device of the target's kind)."""
    device_type = "cuda" if target_kind == "cuda" else "cpu"
    if not devices:
        return cuda_slots() if device_type == "cuda" else cpu_slots(threads)
    slots: list[DeviceSlot] = []
    gpu_ids = []
    for kind, detail in (parse_device(d) for d in devices):
        if kind == "cpu":
            if device_type != "cpu":
                raise DeviceNotFound("device cpu cannot time candidates built for a CUDA target")
            slots += cpu_slots(threads)
        elif kind == "cuda":
            if device_type != "cuda":
                raise DeviceNotFound(f"device cuda:{detail} needs --target cuda")
            gpu_ids.append(detail)
        else:
            slots.append(rpc_slot(detail, device_type))
    if gpu_ids:
        slots += cuda_slots(gpu_ids)
    return slots


def local_gpu_ids(devices: Sequence[str] | None, target_kind: str, threads: int) -> list[int]:
    """The local CUDA devices that ``discover`` gives slots for: whose energy counters bill the job."""
    return [s.device_id for s in discover(devices, target_kind, threads) if s.kind == "cuda"]
