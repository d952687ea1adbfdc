"""Load generation: clients that send inference requests to a container, and when containers join.

Arrival patterns: a closed loop (``concurrency`` clients, each sending its next request when
the previous answers, after an optional think time), or an open loop whose send times come
from Poisson or gamma inter-arrivals or from a trace file. Every request sent leaves one
record, answered or failed, so a load run can prove it lost none. Join schedules are the
paper's: burst (all at once), fixed (one every ``interval_s``), random (uniform in a window).
"""

from __future__ import annotations

import math
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from containers.errors import ScenarioError

NOT_SENT = "not sent: still queued when the load stopped"


@dataclass(frozen=True)
class RequestRecord:
    sent_at: float  # seconds since the client started
    latency_s: float  # client-observed, send to answer
    ok: bool
    error: str | None = None
    model_ms: float | None = None
    server_ms: float | None = None


class Arrivals(ABC):
    """When an open-loop client sends: gaps in seconds between consecutive requests."""

    @abstractmethod
    def gaps(self, rng: np.random.Generator) -> Iterator[float]: ...


@dataclass(frozen=True)
class Poisson(Arrivals):
    rate_per_s: float

    def __post_init__(self) -> None:
        _positive("rate_per_s", self.rate_per_s)

    def gaps(self, rng: np.random.Generator) -> Iterator[float]:
        while True:
            yield float(rng.exponential(1 / self.rate_per_s))


@dataclass(frozen=True)
class Gamma(Arrivals):
    """Gamma inter-arrivals with mean ``1 / rate_per_s`` and coefficient of variation ``cv`` (1 = Poisson)."""

    rate_per_s: float
    cv: float

    def __post_init__(self) -> None:
        _positive("rate_per_s", self.rate_per_s)
        _positive("cv", self.cv)

    def gaps(self, rng: np.random.Generator) -> Iterator[float]:
        shape = 1 / self.cv**2
        while True:
            yield float(rng.gamma(shape, 1 / (self.rate_per_s * shape)))


@dataclass(frozen=True)
class Trace(Arrivals):
    """Send times read from a file: one time in seconds per line, non-decreasing; ``#`` starts a comment."""

    times: tuple[float, ...]

    @classmethod
    def read(cls, path: str | Path) -> Trace:
        times: list[float] = []
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except OSError as err:
            raise ScenarioError(f"cannot read trace {path}: {err.strerror}") from None
        for number, line in enumerate(lines, 1):
            text = line.split("#", 1)[0].strip()
            if not text:
                continue
            try:
                t = float(text)
            except ValueError:
                t = math.nan
            if not math.isfinite(t):
                raise ScenarioError(f"{path}, line {number}: expected a time in seconds; got {text!r}")
            if t < 0 or (times and t < times[-1]):
                raise ScenarioError(f"{path}, line {number}: times must be non-negative and sorted; {t} follows "
                                    f"{times[-1] if times else 'the start'}")
            times.append(t)
        if not times:
            raise ScenarioError(f"trace {path} holds no arrival times")
        return cls(tuple(times))

    def gaps(self, rng: np.random.Generator) -> Iterator[float]:
        yield from np.diff((0.0, *self.times)).tolist()


class Balancer:
    """Client-side balancing over replicas: each request goes to the one with the fewest requests in flight."""

    def __init__(self, urls: Sequence[str]) -> None:
        if not urls:
            raise ScenarioError("a load needs at least one server URL")
        self.urls = list(urls)
        self._in_flight = [0] * len(self.urls)
        self._turn = 0
        self._lock = threading.Lock()

    @contextmanager
    def pick(self) -> Iterator[str]:
        with self._lock:
            n = len(self.urls)
            i = min(range(n), key=lambda k: (self._in_flight[(self._turn + k) % n], k))
            i = (self._turn + i) % n
            self._turn = (self._turn + 1) % n
            self._in_flight[i] += 1
        try:
            yield self.urls[i]
        finally:
            with self._lock:
                self._in_flight[i] -= 1


@dataclass
class LoadClient:
    """Sends ``inputs`` to the servers at ``urls`` (balanced): closed loop when ``arrivals`` is None, else open loop.

    Attributes:
        concurrency: closed loop: clients in flight; open loop: most requests in flight at once.
        think_s: closed loop: pause between an answer and the next request.
    """

    urls: Sequence[str]
    inputs: Sequence[np.ndarray]
    arrivals: Arrivals | None = None
    concurrency: int = 1
    think_s: float = 0.0
    seed: int = 0
    timeout_s: float = 30.0
    records: list[RequestRecord] = field(default_factory=list, init=False)
    _stop: threading.Event = field(default_factory=threading.Event, init=False)
    _threads: list[threading.Thread] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ScenarioError(f"load concurrency must be at least 1; got {self.concurrency}")
        self.balancer = Balancer(self.urls)

    def start(self) -> LoadClient:
        self._t0 = time.monotonic()
        if self.arrivals is None:
            self._threads = [threading.Thread(target=self._closed_loop, daemon=True) for _ in range(self.concurrency)]
        else:
            self._threads = [threading.Thread(target=self._open_loop, args=(self.arrivals,), daemon=True)]
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> list[RequestRecord]:
        """Stop sending, wait for requests in flight, and return every record.

        An open loop's arrivals due before the stop and still waiting (for a free sender: more due than
        ``concurrency`` allows in flight; or to be queued, on a busy host) are not sent; each is recorded as
        failed (``NOT_SENT``), its latency the wait until the stop.
        """
        self._stop.set()
        for t in self._threads:
            t.join()
        return self.records

    def run_for(self, seconds: float) -> list[RequestRecord]:
        self.start()
        self._stop.wait(seconds)
        return self.stop()

    def _send(self, clients: dict[str, object], due: float | None = None) -> None:
        """One request; an open loop's latency counts from when it was due, so client-side queueing shows."""
        from containers.client import InferenceClient

        sent = time.monotonic() if due is None else due
        with self.balancer.pick() as url:
            client = clients.get(url) or clients.setdefault(url, InferenceClient(url, self.timeout_s))
            try:
                reply = client.infer(list(self.inputs))  # type: ignore[attr-defined]
                record = RequestRecord(sent - self._t0, time.monotonic() - sent, True, None, reply.model_ms,
                                       reply.server_ms)
            except Exception as err:  # noqa: BLE001 - a failed request is a result, recorded with its reason
                record = RequestRecord(sent - self._t0, time.monotonic() - sent, False, f"{type(err).__name__}: {err}")
        self.records.append(record)  # list.append is atomic under the GIL

    def _closed_loop(self) -> None:
        clients: dict[str, object] = {}
        while not self._stop.is_set():
            self._send(clients)
            if self.think_s:
                self._stop.wait(self.think_s)

    def _open_loop(self, arrivals: Arrivals) -> None:
        local = threading.local()

        def send(due: float) -> None:
            if not hasattr(local, "clients"):
                local.clients = {}
            self._send(local.clients, due)

        due = time.monotonic()
        gaps = iter(arrivals.gaps(np.random.default_rng(self.seed)))
        queued: list[tuple[Future[None], float]] = []
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            for gap in gaps:
                due += gap
                if self._stop.wait(max(due - time.monotonic(), 0)):
                    break
                queued.append((pool.submit(send, due), due))
            else:
                self._stop.wait()  # a trace that ran out still sends its backlog, until stopped
                due = math.inf
            halted = time.monotonic()
            pool.shutdown(cancel_futures=True)  # stopped: what is in flight finishes, the backlog is not sent
        unsent = [d for f, d in queued if f.cancelled()]
        while due <= halted:  # due before the stop but not queued yet (a busy host): not sent either
            unsent.append(due)
            due += next(gaps, math.inf)
        stopped = time.monotonic()
        self.records += [RequestRecord(d - self._t0, stopped - d, False, NOT_SENT) for d in unsent]


def join_times(kind: str, count: int, interval_s: float = 30.0, window_s: float = 120.0, seed: int = 0) -> list[float]:
    """Seconds after the start at which each of ``count`` containers joins, by schedule ``kind``."""
    if kind == "burst":
        return [0.0] * count
    if kind == "fixed":
        _positive("interval_s", interval_s)
        return [i * interval_s for i in range(count)]
    if kind == "random":
        _positive("window_s", window_s)
        return sorted(np.random.default_rng(seed).uniform(0, window_s, count).round(2).tolist())
    raise ScenarioError(f"unknown schedule {kind!r}; expected burst, fixed or random")


def _positive(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and value > 0):
        raise ScenarioError(f"{name} must be a positive number; got {value!r}")
