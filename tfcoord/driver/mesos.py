"""The driver's side of a Mesos job: start a coordinator with the framework, submit, follow.

``tfcoord submit --engine mesos`` and ``tfcoord.compat.tfmesos2.cluster`` share this. It is
blocking code on a :class:`~tfcoord.client.DriverClient`; every wait is a ``watch_job``
answered by push when the job changes, never a poll.
"""

from __future__ import annotations

import base64
import json
import logging
import socket
import ssl
import urllib.request
from collections.abc import Callable, Collection, Mapping
from typing import Any

from tfcoord.client import DriverClient
from tfcoord.client.client import check_outcome
from tfcoord.client.errors import DeadlineExceeded
from tfcoord.client.jobreplies import JobStatus
from tfcoord.client.progress import TimelineLines
from tfcoord.client.vocab import TERMINAL_JOB, JobState, NodeState
from tfcoord.client.watcher import watch_until
from tfcoord.coordinator.embedded import EmbeddedCoordinator
from tfcoord.coordinator.mesos.config import MesosConfig

from . import session
from .session import CoordinatorLink
from .session import stop_and_wait as stop_and_wait  # the Mesos drivers stop jobs as every driver does

log = logging.getLogger("tfcoord.mesos")

#: Once a cluster is left (``with cluster(...)`` exits), its nodes are told to stop and
#: acknowledge within a second or two; past this the framework's TEARDOWN kills them anyway.
STOP_WAIT_S = session.STOP_WAIT_S
#: After the reservation deadline, nodes still have to start serving (TensorFlow imports in
#: about 6 s, slower on a loaded agent); past this extra time a wait for RUNNING gives up.
RUNNING_GRACE_S = 120.0


def default_advertise_host() -> str:
    """The address Mesos tasks dial back to, as tfmesos2 picks it: this host's name resolved."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def start_coordinator(
    config: MesosConfig,
    *,
    host: str = "0.0.0.0",
    port: int = 0,
    advertise_host: str | None = None,
    gpus: bool = False,
    plaintext: bool = False,
) -> EmbeddedCoordinator:
    """An embedded coordinator running the Mesos framework, subscribed when this returns.

    It serves TLS with a certificate of its own (the embedded coordinator's default); its tasks pin the CA
    (``TFCOORD_TLS_CA_PEM`` in their environment) and so must the driver
    (:func:`driver_tls`). ``plaintext`` opts out (logged as a warning).

    Raises:
        MesosError: the framework could not subscribe (credentials, TLS, no master).
    """
    return EmbeddedCoordinator(
        host=host,
        port=port,
        advertise_host=advertise_host or default_advertise_host(),
        mesos=config,
        mesos_gpus=gpus,
        plaintext=plaintext,
    ).start()


def start_link(config: MesosConfig, **options: Any) -> CoordinatorLink:
    """:func:`start_coordinator`, as the driver's link to it (its CA pinned)."""
    return CoordinatorLink.of_embedded(start_coordinator(config, **options))


def driver_tls(coord: EmbeddedCoordinator) -> ssl.SSLContext | None:
    """The driver's TLS context toward ``coord``: its own CA pinned; None if it serves plaintext."""
    return CoordinatorLink.of_embedded(coord).ssl_context


def await_state(
    driver: DriverClient,
    job: str,
    *,
    until: Collection[JobState] = TERMINAL_JOB,
    timeout_s: float,
    emit: Callable[[str], None] | None = None,
) -> JobStatus:
    """Wait until the job's state is in ``until`` (or terminal); emit each new timeline line.

    Raises:
        DeadlineExceeded: not there within ``timeout_s``; the message says what is missing.
    """

    def there(st: JobStatus) -> bool:
        return st.state in until or st.terminal

    status = watch_until(
        driver, job, there, timeout_s=timeout_s, on_change=TimelineLines(emit) if emit is not None else None
    )
    if not there(status):
        waiting = [f"{n.name} {n.state}" for n in status.nodes if n.state != NodeState.RUNNING]
        raise DeadlineExceeded(
            f"job {job} is still {status.state} after {timeout_s:g} s; missing: "
            + "; ".join([*status.missing, *waiting])
        )
    return status


def wait_running(
    driver: DriverClient, job: str, *, timeout_s: float, emit: Callable[[str], None] | None = None
) -> JobStatus:
    """Block until every node runs (for server mode: every TensorFlow server listens).

    Raises:
        JobFailed: the job failed first (a task died, no offer, the reservation timed out).
        JobStopped: it was stopped first.
        DeadlineExceeded: not running in time.
    """
    status = await_state(driver, job, until={JobState.RUNNING}, timeout_s=timeout_s, emit=emit)
    check_outcome(status)  # FAILED and STOPPED raise; SUCCEEDED (a quick command) is fine
    return status


def targets(cluster: Mapping[str, list[str]]) -> dict[str, str]:
    """``{"/job:ps/task:0": "grpc://host:port", ...}`` for a cluster spec."""
    return {
        f"/job:{role}/task:{i}": f"grpc://{addr}"
        for role, addrs in cluster.items()
        for i, addr in enumerate(addrs)
    }


def master_get(config: MesosConfig, url: str, timeout_s: float) -> dict[str, Any]:
    """GET a master endpoint (``/tasks``, ``/state``) with the framework's credentials and TLS
    settings; redirects to the leader are followed. ``{}`` (logged) when it cannot be read,
    as tfmesos2's ``get_task_info`` answers."""
    req = urllib.request.Request(url, headers={"Accept": "application/json"})
    if config.username:
        raw = f"{config.username}:{config.password or ''}".encode()
        req.add_header("Authorization", "Basic " + base64.b64encode(raw).decode("ascii"))
    context = None
    if url.startswith("https://"):
        context = ssl.create_default_context(cafile=config.ca_file)
        if not config.verify_ssl:
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    try:
        with urllib.request.urlopen(req, timeout=timeout_s, context=context) as resp:
            answer = json.loads(resp.read())
    except (OSError, ValueError) as e:  # URLError and HTTPError are OSErrors
        log.error("could not read %s from the Mesos master: %s", url, e)
        return {}
    return answer if isinstance(answer, dict) else {}
