"""The words every side of tfcoord shares: job and node states, error codes, failure reasons,
and the coordinator's own words for what moves a job (:class:`JobEvent`) and what a
pending request waits for (:class:`WaitKind`).

After h11's ``_state`` and ``_events``: the coordinator, the clients, the nodes, the
engines and the command line import these names instead of writing ``"FAILED"`` or
``"stale_attempt"`` as strings, so a typo is an ``AttributeError`` at import and a
search for a state finds every place that acts on it. This module is the only place
in the code base where such words are spelled out (``tests/unit/test_vocab.py`` reads
the sources and checks).

Every enum is a :class:`enum.StrEnum`: a member *is* its wire value (``JobState.FAILED
== "FAILED"``), so msgpack, JSON and the journal carry it unchanged and a peer that
predates this module reads the same bytes.
"""

from __future__ import annotations

import enum


class JobState(enum.StrEnum):
    """A job's life cycle (the transitions are ``coordinator.state.JOB_TRANSITIONS``)."""

    SUBMITTED = "SUBMITTED"
    RESERVING = "RESERVING"
    READY = "READY"
    RUNNING = "RUNNING"
    STOPPING = "STOPPING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"

    @property
    def terminal(self) -> bool:
        """Has the job ended (nothing changes its state any more)?"""
        return self in TERMINAL_JOB

    @property
    def reserving(self) -> bool:
        """Are slots still being filled (the cluster spec is not out yet)?"""
        return self in RESERVING_JOB

    @property
    def formed(self) -> bool:
        """Does every node hold the cluster spec, and is the job still going?"""
        return self in FORMED_JOB


class NodeState(enum.StrEnum):
    """A node's life cycle (``coordinator.state.NODE_TRANSITIONS``).

    A node reports the last four (:data:`REPORT_STATES`); the coordinator sets the others.
    """

    REGISTERED = "REGISTERED"
    READY = "READY"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    LOST = "LOST"
    STOPPED = "STOPPED"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_NODE


TERMINAL_JOB = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED})
#: Before the cluster spec is out: a node lost now frees its slot for a retry.
RESERVING_JOB = frozenset({JobState.SUBMITTED, JobState.RESERVING})
#: The cluster is formed and the job goes on: a fed cluster takes data in these.
FORMED_JOB = frozenset({JobState.READY, JobState.RUNNING})
TERMINAL_NODE = frozenset({NodeState.SUCCEEDED, NodeState.FAILED, NodeState.LOST, NodeState.STOPPED})
LIVE_NODE = frozenset({NodeState.REGISTERED, NodeState.READY, NodeState.RUNNING})
#: What a node may report about itself (``messages.Report.state``).
REPORT_STATES = (NodeState.RUNNING, NodeState.SUCCEEDED, NodeState.FAILED, NodeState.STOPPED)


class ErrorCode(enum.StrEnum):
    """The stable codes of refused requests and closed connections (``messages.Error.code``),
    of the HTTP API's error bodies and of the data feed's error frames. Messages are for
    people; programs decide on these."""

    # The connection is refused or closed (an Error frame without a request id).
    AUTH_FAILED = "auth_failed"
    VERSION_MISMATCH = "version_mismatch"
    PROTOCOL_ERROR = "protocol_error"
    TOO_MANY_CONNECTIONS = "too_many_connections"
    HANDSHAKE_TIMEOUT = "handshake_timeout"
    FRAME_TIMEOUT = "frame_timeout"
    IDLE_TIMEOUT = "idle_timeout"
    # One request is refused.
    TOO_LARGE = "too_large"
    FORBIDDEN = "forbidden"
    TOO_MANY_REQUESTS = "too_many_requests"
    NO_ENGINE = "no_engine"
    TIMEOUT = "timeout"
    UNKNOWN_JOB = "unknown_job"
    JOB_EXISTS = "job_exists"
    BAD_SLOT = "bad_slot"
    DUPLICATE = "duplicate"
    GPU_CONFLICT = "gpu_conflict"
    NOT_REGISTERED = "not_registered"
    NOT_READY = "not_ready"
    STALE_ATTEMPT = "stale_attempt"
    #: A live, heartbeating node holds the slot: a newer attempt may not displace it.
    SLOT_HELD = "slot_held"
    #: A slot was re-registered more often than a job allows.
    TOO_MANY_ATTEMPTS = "too_many_attempts"
    #: The job restarted its cluster as a newer generation: a node of an older one must exit
    #: (or, told by its stop answer, rejoin the new one).
    STALE_GENERATION = "stale_generation"
    #: A message for a node's slot from another connection of the job, without the credential
    #: its registration handed to the node: only that node may speak for its slot.
    NOT_SLOT_HOLDER = "not_slot_holder"
    ALREADY_TERMINAL = "already_terminal"
    # The job or the node is past the point where the request makes sense.
    JOB_STOPPING = "job_stopping"
    JOB_SUCCEEDED = "job_succeeded"
    JOB_FAILED = "job_failed"
    JOB_STOPPED = "job_stopped"
    NODE_SUCCEEDED = "node_succeeded"
    NODE_FAILED = "node_failed"
    NODE_LOST = "node_lost"
    NODE_STOPPED = "node_stopped"
    # The HTTP API.
    BAD_REQUEST = "bad_request"
    UNAUTHORIZED = "unauthorized"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    HTTP_ERROR = "http_error"
    INTERNAL_ERROR = "internal_error"
    # The data feed (a node's answer to a feeder).
    REFUSED = "refused"
    FEED_TIMEOUT = "feed_timeout"

    @classmethod
    def job_is(cls, state: JobState) -> ErrorCode:
        """The code refusing a request because the job is ``state`` (stopping or ended)."""
        return _JOB_IS[state]

    @classmethod
    def node_is(cls, state: NodeState) -> ErrorCode:
        """The code refusing a request because the node has ended ``state``."""
        return _NODE_IS[state]


_JOB_IS = {
    JobState.STOPPING: ErrorCode.JOB_STOPPING,
    JobState.SUCCEEDED: ErrorCode.JOB_SUCCEEDED,
    JobState.FAILED: ErrorCode.JOB_FAILED,
    JobState.STOPPED: ErrorCode.JOB_STOPPED,
}
_NODE_IS = {
    NodeState.SUCCEEDED: ErrorCode.NODE_SUCCEEDED,
    NodeState.FAILED: ErrorCode.NODE_FAILED,
    NodeState.LOST: ErrorCode.NODE_LOST,
    NodeState.STOPPED: ErrorCode.NODE_STOPPED,
}
#: Connection-level closes after which the same requests on a new connection succeed.
TRANSIENT_CLOSES = frozenset({ErrorCode.IDLE_TIMEOUT, ErrorCode.FRAME_TIMEOUT})
#: Connection-level refusals that retrying cannot cure.
FATAL_REFUSALS = frozenset({ErrorCode.AUTH_FAILED, ErrorCode.VERSION_MISMATCH})


class FailureReason(enum.StrEnum):
    """Why a job did not succeed, as data (``reason`` in a job's status and on
    :class:`~tfcoord.client.replies.JobFailed`), so no caller searches the error text.

    The empty value is a job that has not failed or stopped (yet).
    """

    NONE = ""
    #: A required node reported failure, stopped unasked, or its engine task ended.
    NODE_FAILED = "node_failed"
    #: A required node stopped heartbeating or lost its connection for good.
    NODE_LOST = "node_lost"
    #: The reservation deadline passed with slots still missing.
    RESERVATION_TIMEOUT = "reservation_timeout"
    #: A node restarted after the cluster formed (a TensorFlow cluster cannot change membership).
    MEMBERSHIP_CHANGED = "membership_changed"
    #: What runs the nodes gave up: the Spark job launching them failed, the Mesos master
    #: refused the framework, no offer can ever fit.
    ENGINE_FAILED = "engine_failed"
    #: A stop was requested (``tfcoord stop``, a streaming job's ``terminate()``, the driver).
    STOPPED = "stopped"
    #: A fed node's consumer took nothing from its queue for ``feed_timeout`` seconds: the
    #: node stops its job saying so before it answers its feeders, so the driver decides on
    #: the job's status rather than on the text of the feeding task's failure.
    FEED_TIMEOUT = "feed_timeout"
    #: The job ran past its deadline (``JobSpec.deadline_s``, TFJob's activeDeadlineSeconds).
    DEADLINE_EXCEEDED = "deadline_exceeded"


class RestartOn(enum.StrEnum):
    """Which failures of a node restart the job's cluster (``JobSpec.restart_on``), while it
    has restarts left (``JobSpec.max_restarts``).

    As Kubeflow TFJob's ``restartPolicy: ExitCode``: a node lost, or a process ended by a
    signal (exit codes 128-255, a negative status: preempted, OOM-killed, a machine gone), is
    worth retrying; a Python exception or an exit code 1-127 is the program's own error, and
    retrying it would fail the same way.
    """

    #: Lost nodes and processes ended by a signal restart; other failures are permanent.
    EXIT_CODE = "exit-code"
    #: Every failure of a node restarts (TFJob's OnFailure).
    ANY_FAILURE = "any-failure"

    def restarts(self, lost: bool, exit_code: int) -> bool:
        """Whether a node that was ``lost``, or failed with ``exit_code``, restarts the cluster."""
        if self is RestartOn.ANY_FAILURE or lost:
            return True
        return exit_code < 0 or exit_code >= 128


#: The reasons a stop request may give (``messages.StopJob.cause``).
STOP_CAUSES = (FailureReason.STOPPED, FailureReason.ENGINE_FAILED, FailureReason.FEED_TIMEOUT)


class JobEvent(enum.StrEnum):
    """What moves a job along its life cycle: the keys of each row of
    ``coordinator.state.JOB_TRANSITIONS``. Never on the wire; the coordinator's state
    machine names its transitions with these, not with strings."""

    #: The first node registered: the job's slots are being filled.
    REGISTER = "register"
    #: Every slot is filled and the cluster spec is out.
    COMPLETE = "complete"
    #: Every node reported RUNNING.
    RUN = "run"
    #: Every node that decides the job's success succeeded (and serving nodes had their grace).
    SUCCEED = "succeed"
    #: A required node failed or was lost, the reservation timed out, the engine gave up.
    FAIL = "fail"
    #: A stop was requested.
    STOP = "stop"
    #: The last live node of a stopping job ended.
    ALL_STOPPED = "all_stopped"
    #: A node failed or was lost and the job has restarts left: a new generation of the
    #: cluster reserves its slots again (every node rejoins, the lost one replaced).
    RESTART = "restart"


class WaitKind(enum.StrEnum):
    """What a request left pending on the coordinator waits for (waiting is push, never poll)."""

    #: ``await_cluster``: a node waits for the cluster spec.
    CLUSTER = "cluster"
    #: ``await_stop``: a node waits to be told to stop.
    STOP = "stop"
    #: ``await_job``: a driver waits for its job to end.
    JOB = "job"
    #: ``watch_job``: a driver waits for its job's status to change.
    WATCH = "watch"
