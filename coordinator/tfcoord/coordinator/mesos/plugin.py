"""The Mesos engine as the coordinator service's plug-in (see ``coordinator.service``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .config import MesosConfig
from .jobs import ENGINE

if TYPE_CHECKING:
    from ..server import CoordinatorServer
    from ..service import ArchiveSite
    from .engine import MesosEngine


@dataclass(frozen=True)
class MesosEngineFactory:
    """Run a Mesos framework for the coordinator's jobs of engine "mesos"."""

    mesos: MesosConfig
    #: Advertise GPU_RESOURCES from the start (a job that wants GPUs is coming).
    gpu_resources: bool = False
    name: str = ENGINE

    @property
    def start_budget_s(self) -> float:
        """The framework's first subscription has its own deadline."""
        return self.mesos.first_subscribe_deadline_s + self.mesos.connect_timeout_s

    def create(
        self, server: CoordinatorServer, address: str, *, durable: bool, archive: ArchiveSite | None = None
    ) -> MesosEngine:
        from .engine import MesosEngine  # aiohttp's client only when a Mesos engine runs

        # With a journal the framework outlives this process (a restart resubscribes and keeps
        # its tasks); without one nothing could pick it up again, so it is torn down on close.
        return MesosEngine(
            server,
            self.mesos,
            address,
            teardown_on_close=not durable,
            gpu_resources=self.gpu_resources,
            archive=archive,
        )
