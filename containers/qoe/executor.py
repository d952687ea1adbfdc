"""The Executor: reads each container's CPU usage and applies new limits through the backend."""

from __future__ import annotations

from dataclasses import dataclass, field

from containers.backends.base import ContainerBackend
from containers.errors import ContainerError, UnknownContainer


@dataclass
class Executor:
    backend: ContainerBackend
    limits: dict[str, float | None] = field(default_factory=dict)
    updates: int = 0  # limit changes applied, all containers together

    def usage(self, name: str) -> float:
        return self.backend.usage(name)

    def apply(self, limits: dict[str, float | None]) -> int:
        """Set every limit in ``limits`` live; returns how many changed.

        A container that stopped since its usage was read is skipped, not an error: the engine
        refuses to resize it, and the manager's next iteration restarts or drops it.
        """
        changed = 0
        for name, cpus in limits.items():
            if self.limits.get(name, "unset") == cpus:
                continue
            try:
                self.backend.resize(name, cpus)
            except ContainerError:
                if self._running(name):
                    raise
                continue
            self.limits[name] = cpus
            changed += 1
        self.updates += changed
        return changed

    def limit(self, name: str) -> float | None:
        return self.limits.get(name)

    def _running(self, name: str) -> bool:
        try:
            return self.backend.info(name).running
        except UnknownContainer:
            return False

    def forget(self, name: str) -> None:
        self.limits.pop(name, None)
