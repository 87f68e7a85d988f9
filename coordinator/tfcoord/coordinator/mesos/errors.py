"""Errors of the Mesos engine. Each says which side failed and what to change."""

from __future__ import annotations

from tfcoord.client.errors import TfcoordError


class MesosError(TfcoordError):
    """The Mesos framework cannot do what was asked; the message says what to fix."""


class MesosConfigError(MesosError, ValueError):
    """Bad Mesos settings (MESOS_* variables, resource specs, attribute constraints)."""


class MesosAuthError(MesosError):
    """The master refused our credentials (HTTP 401). Retrying cannot help."""


class MesosUnreachable(MesosError, ConnectionError):
    """No Mesos master answered before the deadline."""


class MesosProtocolError(MesosError):
    """The master sent something the v1 scheduler API does not allow (bad RecordIO, JSON)."""


class FrameworkRemoved(MesosError):
    """The master removed our framework (torn down, or failover timeout passed)."""
