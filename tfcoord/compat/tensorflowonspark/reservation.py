"""TensorFlowOnSpark's ``reservation.Client`` as its ``utils/stop_streaming.py`` uses it.

TensorFlowOnSpark's driver runs a reservation server that anyone who can reach it may tell
to stop, unauthenticated: ``stop_streaming.py HOST PORT`` does
``reservation.Client((host, port)).request_stop()``. tfcoord's driver runs an embedded
coordinator instead, which takes a stop only with its admin credential; that credential is
in the coordinator's connection file (:mod:`tfcoord.client.connfile`), readable only by the
user who started the driver. So the same script works unchanged from another shell of that
user on the driver's machine, given the host and port the driver logs ("coordinator
listening at HOST:PORT"); from elsewhere, use ``tfcoord stop JOB --address HOST:PORT
--admin-secret-file FILE``.
"""

from __future__ import annotations

import os
from typing import Any

from tfcoord.client import DriverClient, TfcoordError, connfile
from tfcoord.client import tls as _tls

#: Why the jobs stop, as their status shows it.
STOP_REASON = "stop requested by reservation.Client.request_stop() (utils/stop_streaming.py)"
#: Connecting and stopping take milliseconds on a live coordinator.
TIMEOUT_S = 30.0


class Client:
    """Reaches the coordinator at ``server_addr`` (``(host, port)``, as TensorFlowOnSpark's).

    Raises:
        ConnectionError: no embedded coordinator of this user listens on that port on this
            machine (the message says where it looked and what to do instead).
    """

    def __init__(self, server_addr: Any) -> None:
        host, port = server_addr
        directory = connfile.runtime_dir(os.environ)
        found = [c for c in connfile.find(directory) if c.port == int(port)]
        if not found:
            raise ConnectionError(
                f"no tfcoord coordinator of yours listens at {host}:{port} on this machine (looked for "
                f"its connection file in {directory}); run this as the user who started the driver, on "
                "the driver's machine, or use tfcoord stop JOB --address HOST:PORT --admin-secret-file FILE"
            )
        conn = found[0]
        context = _tls.client_context(ca_pem=conn.ca_pem) if conn.ca_pem else None
        self._client = DriverClient(
            conn.address,
            conn.admin_secret,
            role="admin",
            ssl_context=context,
            connect_deadline_s=TIMEOUT_S,
            reconnect_deadline_s=TIMEOUT_S,
            fail_fast=True,
            request_timeout_s=TIMEOUT_S,
        ).connect()

    def request_stop(self) -> list[str]:
        """Stop every job of this coordinator that has not ended (a driver's coordinator runs
        its own cluster); returns the jobs told to stop. A streaming job's ``shutdown(ssc)``
        then stops the streaming context."""
        stopped = []
        for job in self._client.status().jobs:
            if not job.state.terminal:
                try:
                    self._client.stop(job.job, STOP_REASON)
                except TfcoordError:  # it ended meanwhile
                    continue
                stopped.append(job.job)
        return stopped

    def close(self) -> None:
        self._client.close()
