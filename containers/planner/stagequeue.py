"""One stage's centralized batched queue, live: queries wait here, one dispatcher thread per replica serves them.

The live counterpart of ``batchqueue.serve``, with the same rule so that what the Estimator
predicts is what runs: a free replica dispatches when ``batch_size`` queries wait or the
oldest has waited ``batch_timeout_s``, takes what is queued (up to ``batch_size``) and sends
it as ONE inference request of that many items; the next batch waits for its reply. This is
InferLine's centralized batched queue on Clipper: one queue per stage, not one per replica,
so a slow replica never holds queries another could serve.

Replicas join and leave while queries flow (the Tuner's changes): a removed replica's
dispatcher finishes the batch in hand and takes no other. A failed request is reported
like an answered one, with its error: the front end decides what it means for the queries.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from containers.client import InferenceClient
from containers.errors import ScenarioError


@dataclass(frozen=True)
class Batch:
    """One inference request a dispatcher made, and how it ended.

    Attributes:
        queries: the trace indices of the queries it carried, oldest first.
        oldest_ready_s: when its first query joined the queue (front-end clock, seconds).
        sent_s: when the request was sent; ``done_s``: when its reply (or failure) came back.
        error: why the request failed; None when it was answered.
        server_ms: how long the replica's server held the request, by its own clock; None when it failed.
    """

    stage: str
    url: str
    queries: tuple[int, ...]
    oldest_ready_s: float
    sent_s: float
    done_s: float
    error: str | None = None
    server_ms: float | None = None


class StageQueue:
    """The queue of one stage and the dispatchers of its replicas.

    Args:
        name: the stage, for batches and errors.
        batch_size: the most queries one request carries.
        batch_timeout_s: how long a free replica waits, from the oldest query's arrival, for a full batch.
        inputs: ``inputs(k)`` is the request body's arrays for a batch of k items.
        clock: seconds on the front end's clock.
        on_batch: called from the dispatcher thread with every batch, answered or failed.
        request_timeout_s: the most one inference request may take.
    """

    def __init__(self, name: str, batch_size: int, batch_timeout_s: float,
                 inputs: Callable[[int], Sequence[np.ndarray]], clock: Callable[[], float],
                 on_batch: Callable[[Batch], None], request_timeout_s: float = 30.0) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ScenarioError(f"stage {name}: batch_size must be an integer of at least 1; got {batch_size!r}")
        if not batch_timeout_s >= 0:
            raise ScenarioError(f"stage {name}: batch_timeout_s must be >= 0; got {batch_timeout_s!r}")
        self.name, self.batch_size, self.batch_timeout_s = name, batch_size, batch_timeout_s
        self.inputs, self.clock, self.on_batch, self.request_timeout_s = inputs, clock, on_batch, request_timeout_s
        self._queue: deque[tuple[int, float]] = deque()
        self._cond = threading.Condition()
        self._dispatchers: dict[str, tuple[threading.Thread, threading.Event]] = {}

    @property
    def replicas(self) -> tuple[str, ...]:
        """The URLs served now, in the order they joined."""
        with self._cond:
            return tuple(self._dispatchers)

    def put(self, query: int, ready_s: float) -> None:
        """Queue ``query``, which became ready (its parents done, or it arrived) at ``ready_s``."""
        with self._cond:
            self._queue.append((query, ready_s))
            self._cond.notify_all()

    def pending(self) -> list[int]:
        """The queries still waiting for a replica."""
        with self._cond:
            return [q for q, _ in self._queue]

    def add_replica(self, url: str) -> None:
        """Start serving from the replica at ``url``: a dispatcher thread of its own."""
        with self._cond:
            if url in self._dispatchers:
                raise ScenarioError(f"stage {self.name} already sends to {url}")
            stop = threading.Event()
            thread = threading.Thread(target=self._dispatch, args=(url, stop), daemon=True,
                                      name=f"dispatch-{self.name}-{url}")
            self._dispatchers[url] = (thread, stop)
        thread.start()

    def remove_replica(self, url: str) -> None:
        """Stop sending to ``url``; returns once the batch it has in hand (if any) is answered."""
        with self._cond:
            if url not in self._dispatchers:
                raise ScenarioError(f"stage {self.name} does not send to {url}; it sends to "
                                    f"{', '.join(self._dispatchers) or 'nothing'}")
            thread, stop = self._dispatchers.pop(url)
            stop.set()
            self._cond.notify_all()
        thread.join()

    def close(self) -> None:
        """Remove every replica, each after its batch in hand; queries still queued stay queued (see ``pending``)."""
        for url in self.replicas:
            self.remove_replica(url)

    def _dispatch(self, url: str, stop: threading.Event) -> None:
        """One replica's loop: take a batch, send it as one request, report it, until told to stop."""
        client = InferenceClient(url, self.request_timeout_s)
        try:
            while (taken := self._take(stop)) is not None:
                sent = self.clock()
                try:
                    server_ms, error = client.infer(list(self.inputs(len(taken)))).server_ms, None
                except Exception as err:  # noqa: BLE001 - a failed request is a result, reported with its reason
                    server_ms, error = None, f"{type(err).__name__}: {err}"
                self.on_batch(Batch(self.name, url, tuple(q for q, _ in taken), taken[0][1], sent, self.clock(), error,
                                    server_ms))
        finally:
            client.close()

    def _take(self, stop: threading.Event) -> list[tuple[int, float]] | None:
        """The next batch, once it is due (full, or its oldest query waited the timeout); None once stopped."""
        with self._cond:
            while not stop.is_set():
                if not self._queue:
                    self._cond.wait()
                    continue
                wait = self._queue[0][1] + self.batch_timeout_s - self.clock()
                if len(self._queue) >= self.batch_size or wait <= 0:
                    return [self._queue.popleft() for _ in range(min(self.batch_size, len(self._queue)))]
                self._cond.wait(wait)
            return None
