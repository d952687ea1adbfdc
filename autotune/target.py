"""Where the tuned model runs: the TVM target, its device, and the host's cores."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from autotune.errors import UsageError

TARGET_KINDS = {"cpu": "llvm", "llvm": "llvm", "cuda": "cuda", "gpu": "cuda"}


def host_cores() -> int:
    """Cores this process may run on (its affinity mask, not the machine's total)."""
    from measure.slots import host_cores as cores

    return len(cores())


@dataclass(frozen=True)
class TargetSpec:
    """A resolved target: ``kind`` is TVM's target kind, ``config`` the full target dict."""

    kind: str
    num_cores: int
    config: dict[str, Any] = field(hash=False)
    device_name: str

    @property
    def device_type(self) -> str:
        """The runner's device type ("cpu" or "cuda")."""
        return "cuda" if self.kind == "cuda" else "cpu"

    def tvm_target(self) -> Any:
        import tvm

        return tvm.target.Target(self.config)

    def device(self) -> Any:
        import tvm

        return tvm.cuda(0) if self.kind == "cuda" else tvm.cpu(0)

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "num_cores": self.num_cores, "device": self.device_name, "tvm_target": self.config}


def resolve_target(name: str = "cpu", threads: int | None = None) -> TargetSpec:
    """Resolve a target name; sets ``TVM_NUM_THREADS`` so runtime and runner workers use ``threads``.

    Raises:
        UsageError: the name is unknown, the thread count is out of range, or the device is absent.
    """
    kind = TARGET_KINDS.get(name.lower())
    if kind is None:
        raise UsageError(f"unknown target {name!r}; expected one of: {', '.join(sorted(TARGET_KINDS))}")
    cores = host_cores()
    if threads is not None and not 1 <= threads <= cores:
        raise UsageError(f"--threads must be between 1 and the {cores} cores available; got {threads}")
    num_cores = threads or cores
    os.environ["TVM_NUM_THREADS"] = str(num_cores)
    if kind == "llvm":
        from tvm.target import codegen

        cpu = codegen.llvm_get_system_cpu()
        config = {"kind": "llvm", "num-cores": num_cores, "mcpu": cpu}
        return TargetSpec("llvm", num_cores, config, f"{cpu} ({num_cores} cores)")
    return _cuda_target(num_cores)


def _cuda_target(num_cores: int) -> TargetSpec:
    import tvm

    dev = tvm.cuda(0)
    if not dev.exist:
        raise UsageError("target cuda was asked for, but no CUDA GPU is present on this machine; use --target cpu")
    config = cuda_target_config(dev.compute_version, dev.max_threads_per_block, dev.max_shared_memory_per_block,
                                dev.warp_size, num_cores)
    return TargetSpec("cuda", num_cores, config, f"{dev.device_name} ({config['arch']})")


def cuda_target_config(compute_version: str, max_threads_per_block: int, max_shared_memory_per_block: int,
                       warp_size: int, num_cores: int) -> dict[str, Any]:
    """The CUDA target for a device: MetaSchedule's GPU rules read these limits from the target."""
    return {"kind": "cuda", "arch": "sm_" + compute_version.replace(".", ""), "max_num_threads": max_threads_per_block,
            "max_threads_per_block": max_threads_per_block, "max_shared_memory_per_block": max_shared_memory_per_block,
            "thread_warp_size": warp_size, "host": {"kind": "llvm", "num-cores": num_cores}}
