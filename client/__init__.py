"""tfcoord's client side: the wire protocol (sans-io), authentication and a blocking client.

This package needs only the standard library and msgpack, so Spark executors and
Mesos task images can load it without aiohttp, pyspark or TensorFlow.
"""

from .client import Client, ClusterInfo, DriverClient, NodeClient
from .errors import (
    AuthenticationFailed,
    ConnectionClosed,
    DeadlineExceeded,
    JobFailed,
    JobStopped,
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
    RequestRejected,
    TfcoordError,
    TlsError,
)
from .messages import JobSpec, make_roles

__all__ = [
    "AuthenticationFailed", "Client", "ClusterInfo", "ConnectionClosed", "DeadlineExceeded",
    "DriverClient", "JobFailed", "JobSpec", "JobStopped", "LocalProtocolError", "NodeClient",
    "ProtocolError", "RemoteProtocolError", "RequestRejected", "TfcoordError", "TlsError", "make_roles",
]  # fmt: skip
