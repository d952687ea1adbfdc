"""Query arrival traces (sorted arrival times in seconds) and their traffic envelopes.

The planner provisions for a sample trace; the tuner compares live traffic with it. Both
speak of a trace through its *traffic envelope* (InferLine, section 5): for window sizes
from a base ΔT doubling up to 60 s, the most arrivals seen in any window of that size.
Small windows measure burstiness, large ones the sustained rate.
"""

from __future__ import annotations

import math
from itertools import islice
from pathlib import Path

import numpy as np

from containers.errors import ScenarioError
from containers.load import Gamma, Trace
from results.atomic import write_atomically

MAX_WINDOW_S = 60.0
MIN_BASE_S = 0.010  # below this a window holds too few arrivals to say anything about a rate


def check_trace(times: np.ndarray | list[float]) -> np.ndarray:
    """``times`` as a float array, refused when empty, not finite, negative or unsorted."""
    arr = np.asarray(times, dtype=float)
    if arr.ndim != 1 or arr.size == 0:
        raise ScenarioError("a trace needs at least one arrival time")
    bad = np.flatnonzero(~np.isfinite(arr) | (np.diff(arr, prepend=0.0) < 0))
    if bad.size:
        at = int(bad[0])
        raise ScenarioError(f"trace times must be finite, non-negative and sorted; arrival {at} is at {arr[at]:g} s")
    return arr


def gamma_trace(rate_per_s: float, cv: float, duration_s: float, seed: int = 0) -> np.ndarray:
    """Arrivals over ``[0, duration_s)`` with gamma inter-arrival times (``cv`` 1 is Poisson)."""
    return check_trace(_gamma_times(rate_per_s, cv, duration_s, seed))


def _gamma_times(rate_per_s: float, cv: float, duration_s: float, seed: int) -> np.ndarray:
    """``gamma_trace``'s arrivals, unchecked: a short stretch at a low rate may hold none."""
    if not duration_s > 0:
        raise ScenarioError(f"a trace's duration_s must be a positive number; got {duration_s!r}")
    gaps = Gamma(rate_per_s, cv).gaps(np.random.default_rng(seed))
    chunk = int(rate_per_s * duration_s * 1.1) + 64
    times = np.cumsum(np.fromiter(islice(gaps, chunk), float))
    while times[-1] < duration_s:
        times = np.concatenate([times, times[-1] + np.cumsum(np.fromiter(islice(gaps, chunk), float))])
    return times[times < duration_s]


def spike_trace(rate_per_s: float, spike_rate_per_s: float, spike_at_s: float, spike_s: float, duration_s: float,
                cv: float = 1.0, seed: int = 0) -> np.ndarray:
    """``rate_per_s`` arrivals, except ``spike_rate_per_s`` from ``spike_at_s`` for ``spike_s`` seconds."""
    if not 0 <= spike_at_s < spike_at_s + spike_s <= duration_s:
        raise ScenarioError(f"the spike [{spike_at_s:g}, {spike_at_s + spike_s:g}) s must lie within the "
                            f"{duration_s:g} s trace")
    bounds = [(0.0, spike_at_s, rate_per_s), (spike_at_s, spike_at_s + spike_s, spike_rate_per_s),
              (spike_at_s + spike_s, duration_s, rate_per_s)]
    parts = [start + _gamma_times(rate, cv, end - start, seed + k)  # a stretch may hold none; the whole trace may not
             for k, (start, end, rate) in enumerate(bounds) if end > start]
    return check_trace(np.concatenate(parts))


def resampled(times: np.ndarray, seed: int, block_s: float = 1.0) -> np.ndarray:
    """Another trace of the same kind and span as ``times``: a moving-block bootstrap of its inter-arrival gaps.

    Blocks of about ``block_s`` worth of consecutive gaps are drawn with replacement and laid
    end to end from the first arrival, so bursts shorter than a block come out as they were
    and the trace's busiest stretches come out in other numbers and other places: what a
    fresh minute of the same traffic would bring.
    """
    times = check_trace(times)
    gaps = np.diff(times)
    if gaps.size == 0:
        return times.copy()
    span = float(times[-1] - times[0])
    block = int(min(gaps.size, max(1, round(gaps.size * block_s / span)) if span > 0 else gaps.size))
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, gaps.size - block + 1, size=2 * (gaps.size // block + 1))
    drawn = np.concatenate([gaps[s:s + block] for s in starts])
    while drawn.sum() < span:  # a draw of short blocks: add more
        more = rng.integers(0, gaps.size - block + 1, size=gaps.size // block + 1)
        drawn = np.concatenate([drawn] + [gaps[s:s + block] for s in more])
    out = times[0] + np.concatenate([[0.0], np.cumsum(drawn)])
    return out[out <= times[-1]]


def read_trace(path: str | Path) -> np.ndarray:
    """A trace file: one time in seconds per line, sorted; errors name the line (``containers.load.Trace``)."""
    return check_trace(np.asarray(Trace.read(path).times, dtype=float))


def write_trace(path: str | Path, times: np.ndarray) -> None:
    """Write ``times`` one per line, atomically, in the format ``read_trace`` reads."""
    lines = "\n".join(f"{t:.6f}" for t in check_trace(times))
    write_atomically(path, f"# arrival times, seconds\n{lines}\n")


def envelope_windows(base_s: float, max_s: float = MAX_WINDOW_S) -> list[float]:
    """Window sizes ``base_s * 2^i`` up to ``max_s``, ``base_s`` floored at 10 ms."""
    base = max(base_s, MIN_BASE_S)
    return [base * 2**i for i in range(int(math.floor(math.log2(max_s / base))) + 1)] if base <= max_s else [max_s]


def envelope(times: np.ndarray, base_s: float, max_s: float = MAX_WINDOW_S) -> dict[float, int]:
    """The traffic envelope: for each window size, the most arrivals in any ``[t, t + window)``."""
    times = check_trace(times)
    return {w: max_arrivals(times, w) for w in envelope_windows(base_s, max_s)}


def max_arrivals(times: np.ndarray, window_s: float) -> int:
    """The most arrivals in any window ``[t, t + window_s)``; the busiest window starts at an arrival."""
    if times.size == 0:
        return 0
    ends = np.searchsorted(times, times + window_s, side="left")
    return int((ends - np.arange(times.size)).max())


def peak_rate(times: np.ndarray, window_s: float) -> float:
    """Arrivals per second in the busiest ``window_s`` of the trace.

    Provisioned for this rate over windows as long as the SLO, a black box clears any burst of
    the trace within about one SLO; over longer windows a burst's queue outlasts the SLO
    (at 1 s windows CG-Peak missed 17-18% of a CV-4 trace's queries in the benchmark).
    """
    if not window_s > 0:
        raise ScenarioError(f"a peak rate needs a positive window; got {window_s!r} s")
    return max_arrivals(check_trace(times), window_s) / window_s
