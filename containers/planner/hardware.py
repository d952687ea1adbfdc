"""Hardware keys and their prices: what the planner may rent for a stage, and what it costs per hour.

A profile entry's ``hardware`` dict names where it was measured in detail (device, cores,
quota); the planner needs a coarser name that a replica can be provisioned as and priced
by. Keys:

- ``cpu-<cores>``: a CPU container with a quota of that many cores (``cpu-0.5``, ``cpu-2``),
  or, for entries measured without a quota, the number of pinned cores (else threads).
- ``gpu-<device>``: one GPU, its device name without spaces (``gpu-NVIDIAH200``).

Prices are per replica-hour in US dollars. CPU is priced per core so fractional containers
cost a fraction; GPUs by model. The defaults are list prices (below, with their sources) and
date quickly: a pipeline file's ``[prices]`` table overrides or adds any key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# AWS c6i.large (2 vCPU) on-demand in us-east-1 is $0.085/h: $0.0425 per vCPU-hour.
CPU_CORE_PRICE = 0.0425

# One GPU-hour, US dollars, AWS us-east-1 on-demand list prices divided by the GPUs per instance.
GPU_PRICES: Mapping[str, float] = {
    "T4": 0.526,  # g4dn.xlarge, 1 x T4
    "V100": 3.06,  # p3.2xlarge, 1 x V100
    "A100": 4.10,  # p4d.24xlarge, $32.77/h for 8 x A100 40GB
    "H100": 12.29,  # p5.48xlarge, $98.32/h for 8 x H100 at launch (2023); AWS has cut P5 prices since
    # No on-demand H200 list price we trust; AWS's Capacity Block rates put an H200 at 1.1x an H100
    # ($5.408 vs $4.916 per GPU-hour, US East, late 2024), applied here to the H100 on-demand price.
    "H200": 13.52,
}

# A warm standby replica (started, warmed up, paused) holds its memory and none of its CPU. Priced as the memory
# share of an instance: Fargate bills $0.04048 per vCPU-hour and $0.004445 per GB-hour (us-east-1, Linux/x86), so
# a c6i's 2 GB per vCPU is 18% of its price; a model server here holds well under 2 GB. A GPU replica paused keeps
# its GPU's memory, so the GPU is not rented to anyone else: full price.
STANDBY_CPU_SHARE = 0.18

_CPU_KEY = re.compile(r"^cpu-(\d+(?:\.\d+)?)$")


def hardware_key(hardware: Mapping[str, Any]) -> str:
    """The key a profile entry's ``hardware`` dict is provisioned and priced as.

    Raises:
        ValueError: a kind that is neither CPU nor GPU, or a CPU entry that says nothing of its size.
    """
    kind = str(hardware.get("kind", "")).lower()
    if kind in ("cuda", "gpu"):
        return "gpu-" + re.sub(r"\s+", "", str(hardware.get("device", "unknown")))
    if kind != "cpu":
        raise ValueError(f"hardware kind {hardware.get('kind')!r} is neither cpu nor cuda/gpu")
    limit = hardware.get("cpu_limit")
    if limit is not None:
        return f"cpu-{float(limit):g}"
    cores = len(hardware.get("cores") or ()) or int(hardware.get("threads") or 0)
    if cores < 1:
        raise ValueError(f"CPU hardware {dict(hardware)} has no cpu_limit, cores or threads")
    return f"cpu-{cores}"


def standby_price(key: str, price: float) -> float:
    """Dollars per hour for a paused standby replica on ``key``, whose serving replica costs ``price``."""
    return price * STANDBY_CPU_SHARE if cpu_cores(key) is not None else price


def cpu_cores(key: str) -> float | None:
    """The cores of a ``cpu-<cores>`` key; None for any other key."""
    m = _CPU_KEY.match(key)
    return float(m.group(1)) if m else None


@dataclass(frozen=True)
class PriceTable:
    """Dollars per replica-hour for hardware keys: ``overrides`` first, then the documented defaults.

    Attributes:
        overrides: exact keys to prices, from a pipeline file's ``[prices]``.
        cpu_core_price: dollars per core-hour for ``cpu-<cores>`` keys.
        gpu_prices: dollars per GPU-hour by model; a ``gpu-`` key takes the first model its name contains.
    """

    overrides: Mapping[str, float] = field(default_factory=dict)
    cpu_core_price: float = CPU_CORE_PRICE
    gpu_prices: Mapping[str, float] = field(default_factory=lambda: dict(GPU_PRICES))

    def __post_init__(self) -> None:
        for key, price in self.overrides.items():
            if isinstance(price, bool) or not isinstance(price, (int, float)) or not price > 0:
                raise ValueError(f"the price of {key!r} must be a positive number of dollars per hour; got {price!r}")

    def price(self, key: str) -> float | None:
        """Dollars per hour for one replica on ``key``; None when neither the overrides nor the defaults know it."""
        if key in self.overrides:
            return float(self.overrides[key])
        cores = cpu_cores(key)
        if cores is not None:
            return cores * self.cpu_core_price
        if key.startswith("gpu-"):
            for model, price in self.gpu_prices.items():
                if re.search(rf"{re.escape(model)}(?![0-9])", key[4:], re.IGNORECASE):
                    return price
        return None
