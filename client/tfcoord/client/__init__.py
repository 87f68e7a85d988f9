"""tfcoord's client side: the wire protocol (sans-io), authentication and a blocking client.

This package needs only the standard library and msgpack, so Spark executors and
Mesos task images can load it without aiohttp, pyspark or TensorFlow.
"""

from .client import Client, ClusterInfo, DriverClient, NodeClient
from .errors import (
    AuthenticationFailed,
    ClusterRestarted,
    ConnectionClosed,
    DeadlineExceeded,
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
    RequestRejected,
    TfcoordError,
    TlsError,
    Unreachable,
)
from .messages import JobSpec, make_roles
from .replies import JobFailed, JobStopped
from .vocab import ErrorCode, FailureReason, JobState, NodeState

#: One version for the four distributions (tfcoord-client, tfcoord-node,
#: tfcoord-coordinator, tfcoord): they are released together.
__version__ = "0.1.0"

__all__ = [
    "AuthenticationFailed",
    "Client",
    "ClusterInfo",
    "ClusterRestarted",
    "ConnectionClosed",
    "DeadlineExceeded",
    "DriverClient",
    "ErrorCode",
    "FailureReason",
    "JobFailed",
    "JobSpec",
    "JobState",
    "JobStopped",
    "LocalProtocolError",
    "NodeClient",
    "NodeState",
    "ProtocolError",
    "RemoteProtocolError",
    "RequestRejected",
    "TfcoordError",
    "TlsError",
    "Unreachable",
    "__version__",
    "make_roles",
]
