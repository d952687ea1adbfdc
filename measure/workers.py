"""Warm worker processes: start once, import once, run one job at a time, die alone.

A worker is a TVM ``PopenWorker`` (a ``python -m tvm.exec.popen_worker`` child fed
through pipes) with our own start-up and our own fault handling: the parent waits
with its own clock (a kernel stuck in native code holds the child's GIL, so the
child's timeout thread never fires), kills the child on a timeout, names the signal
that ended a crashed child, and starts a fresh child on the next call. Workers can be
pinned to cores, run at idle priority (builds that must not disturb measurements),
and be paused and resumed (SIGSTOP/SIGCONT) while a measurement needs their cores.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any


class WorkerFault(Exception):
    """A job ended without a result: ``kind`` is "timeout", "crash" or "error"."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class WorkerSetup:
    """How a worker process is prepared before its first job."""

    cores: tuple[int, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    idle_priority: bool = False
    builds: bool = False  # import the compiler up front


def _prepare(setup: WorkerSetup) -> None:
    """Runs in the child: environment, pinning, priority, exit with the parent, imports."""
    os.environ.update(setup.env)
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    if setup.cores:
        os.sched_setaffinity(0, setup.cores)
    if setup.idle_priority:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    if setup.builds:
        import tvm.s_tir.transform  # noqa: F401
        import tvm.tirx  # noqa: F401
    else:
        import tvm.runtime  # noqa: F401


def _exit_with_parent(parent: int) -> None:
    """A worker whose tuning process is gone has no one to answer: leave. (PR_SET_PDEATHSIG would
    follow the parent's starting thread, not the process.) A stopped worker is woken by the kernel's
    orphaned-process-group SIGHUP."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


@dataclass(frozen=True)
class CallCost:
    """What one call cost: wall seconds in the child and the child's CPU-seconds (all its threads)."""

    wall_s: float
    cpu_s: float


def _cpu_seconds(pid: int | None) -> float:
    """User + system CPU time of process ``pid`` so far (0 when it is gone)."""
    import psutil

    try:
        times = psutil.Process(pid).cpu_times() if pid else None
    except psutil.Error:
        times = None
    return times.user + times.system if times else 0.0


class Worker:
    """One warm child process; ``call`` runs a picklable function in it."""

    def __init__(self, name: str, setup: WorkerSetup) -> None:
        self.name = name
        self.setup = setup
        self._popen: Any = None
        self._paused = threading.Event()
        self._lock = threading.RLock()
        self.replaced = 0
        self.last_cost = CallCost(0.0, 0.0)

    @property
    def pid(self) -> int | None:
        proc = getattr(self._popen, "_proc", None)
        return proc.pid if proc is not None else None

    def start(self) -> None:
        """Start the child and run its set-up (blocking, no timeout: imports are slow but finite).

        A child whose set-up fails is killed (it would run unpinned, at the wrong priority, or without its
        imports) and the failure raised as a ``WorkerFault`` "error"; the next call tries again.
        """
        with self._lock:
            if self._popen is None:
                self._popen = _popen_worker()
            if not self._popen.is_alive():
                self._popen.send(_prepare, (self.setup,))
                try:
                    self._popen.recv()
                except ChildProcessError:
                    raise
                except Exception as err:
                    self.kill()
                    self.replaced += 1
                    raise WorkerFault("error", f"worker set-up failed: {_one_line(err)}") from None

    def call(self, fn: Callable[..., Any], args: Sequence[Any], timeout_s: float) -> Any:
        """``fn(*args)`` in the child; raises ``WorkerFault`` and replaces the child on a fault.

        Time spent paused does not count against ``timeout_s``.
        """
        with self._lock:
            self.last_cost = CallCost(0.0, 0.0)  # a call that never reaches its job costs nothing
            try:
                self.start()
            except ChildProcessError:  # killed while it was being replaced: a crash like any other
                raise self._crash(self._popen._proc, "while starting ") from None
            cpu_before, wall_before = _cpu_seconds(self.pid), time.monotonic()
            self._popen.send(fn, tuple(args))
            proc = self._popen._proc
            try:
                self._wait_readable(timeout_s)
            finally:
                cpu_after = _cpu_seconds(self.pid) if self._popen.is_alive() else cpu_before
                self.last_cost = CallCost(time.monotonic() - wall_before, max(cpu_after - cpu_before, 0.0))
            try:
                return self._popen.recv()
            except ChildProcessError:
                raise self._crash(proc) from None
            except Exception as err:  # the job raised in the child (a TimeoutError too): the worker is fine
                raise WorkerFault("error", _one_line(err)) from None

    def _crash(self, proc: Any, when: str = "") -> WorkerFault:
        """The fault for a child that died; the next call starts a fresh one."""
        self.replaced += 1
        return WorkerFault("crash", f"worker died {when}({_describe_exit(proc.poll() if proc is not None else None)})")

    def _wait_readable(self, timeout_s: float) -> None:
        reader = self._popen._reader
        spent, last = 0.0, time.monotonic()
        while True:
            ready, _, _ = select.select([reader], [], [], 0.2)
            now = time.monotonic()
            if not self._paused.is_set():
                spent += now - last
            last = now
            if ready:
                return
            if spent > timeout_s:
                self.kill()
                self.replaced += 1
                raise WorkerFault("timeout", f"no result within {timeout_s:.0f} s; worker killed")

    def pause(self) -> None:
        pid = self.pid
        self._paused.set()
        if pid:
            _signal(pid, signal.SIGSTOP)

    def resume(self) -> None:
        pid = self.pid
        if pid:
            _signal(pid, signal.SIGCONT)
        self._paused.clear()

    def kill(self) -> None:
        if self._popen is not None:
            pid = self.pid
            if pid:
                _signal(pid, signal.SIGCONT)
            self._popen.kill()


class WorkerGroup:
    """Workers that can be paused together while a measurement needs their cores."""

    def __init__(self, workers: Sequence[Worker]) -> None:
        self.workers = list(workers)
        self._pauses = 0
        self._lock = threading.Lock()

    def start(self) -> list[threading.Thread]:
        """Start every worker in the background; join the returned threads to wait."""
        import cloudpickle  # noqa: F401  (imported here, in the caller's thread: concurrent imports of
        from tvm.support import popen_pool  # noqa: F401  one package from several threads can deadlock)

        threads = [threading.Thread(target=_start_quietly, args=(w,), daemon=True) for w in self.workers]
        for t in threads:
            t.start()
        return threads

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Stop every worker's process for the duration (nests; resumes when the last one leaves)."""
        with self._lock:
            self._pauses += 1
            if self._pauses == 1:
                for w in self.workers:
                    w.pause()
        try:
            yield
        finally:
            with self._lock:
                self._pauses -= 1
                if self._pauses == 0:
                    for w in self.workers:
                        w.resume()

    def close(self) -> None:
        for w in self.workers:
            w.kill()


def _popen_worker() -> Any:
    """A ``PopenWorker`` whose child runs ``measure.worker_main`` (TVM's loop, without torch)."""
    import sys

    from tvm.support.popen_pool import PopenWorker

    class LeanPopenWorker(PopenWorker):
        def _start(self) -> None:  # PopenWorker._start (POSIX branch) with our entry module
            if self._proc is not None:
                return
            main_read, worker_write = os.pipe()
            worker_read, main_write = os.pipe()
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "measure.worker_main", str(worker_read), str(worker_write)],
                pass_fds=(worker_read, worker_write), stdout=self._stdout, stderr=self._stderr,
            )
            os.close(worker_read)
            os.close(worker_write)
            self._reader = os.fdopen(main_read, "rb")
            self._writer = os.fdopen(main_write, "wb")

    return LeanPopenWorker(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _start_quietly(worker: Worker) -> None:
    try:
        worker.start()
    except Exception:  # noqa: BLE001  (a worker that fails to start is retried by its first call)
        pass


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "exit status unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _one_line(err: BaseException) -> str:
    """The exception's own message (TVM's last line), without the traceback TVM prepends."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return f"{type(err).__name__}: {(lines[-1] if lines else '')[:300]}"
