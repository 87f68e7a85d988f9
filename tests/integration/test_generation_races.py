"""Requests that cross a restart of the job's cluster: real coordinator, real sockets, real
child processes.

A node's requests of a generation are refused (``stale_generation``) once the job has
restarted its cluster. A node whose request was on its way then (its wait for the cluster,
or its RUNNING report while its child started: a server-mode ps waits seconds for its
server to listen) must hear what its stop watch would have told it, stop its work and
rejoin the new generation; before, it exited with the refusal, and the new generation
waited in vain for its slot until the reservation deadline failed the job. The node
supervisor's side of it (its work stopped, the node rejoined) is
``test_supervisor.py::test_a_node_whose_work_was_starting_when_a_peer_died_rejoins_the_new_generation``.
"""

from __future__ import annotations

import pytest

from tfcoord.client import ClusterRestarted, DriverClient, JobSpec, NodeClient, make_roles
from tfcoord.client.vocab import ErrorCode

#: Every wait below ends on an event; this only bounds a broken run.
WAIT_S = 60.0


def _restartable_job(d: DriverClient) -> str:
    return d.submit(
        JobSpec(roles=make_roles(2), reservation_timeout_s=60, max_restarts=1, restart_backoff_s=0)
    )


@pytest.mark.parametrize("late", ["await_cluster", "report_running"])
def test_a_request_that_arrives_after_the_restart_tells_the_node_to_rejoin(coordinator, late):
    with DriverClient(coordinator.address, coordinator.secret) as d:
        job = _restartable_job(d)
        token = d.job_token(job)
        with (
            NodeClient(coordinator.address, token, job, 0) as a,
            NodeClient(coordinator.address, token, job, 1) as b,
        ):
            a.register("127.0.0.1", 20000)
            b.register("127.0.0.1", 20001)
            b.await_cluster(WAIT_S)  # the cluster formed
            if late == "report_running":
                a.await_cluster(WAIT_S)
            # b's process was killed (a signal: the restart policy restarts the cluster)
            b.report("failed", error="killed by signal 9", exit_code=-9)
            with pytest.raises(ClusterRestarted) as refused:
                if late == "await_cluster":
                    a.await_cluster(WAIT_S)
                else:
                    a.report("running")
            assert refused.value.code == ErrorCode.STALE_GENERATION
            assert refused.value.restart_to == 1  # what a's stop watch would have said
            assert a.should_stop() and "the cluster restarts as generation 1" in a.stop_reason

            # Both rejoin generation 1 and finish it.
            b.heartbeat()
            assert a.rejoin() == 1 and b.rejoin() == 1
            a.register("127.0.0.1", 20002)
            b.register("127.0.0.1", 20003)
            for n in (a, b):
                assert n.await_cluster(WAIT_S).cluster == {"worker": ["127.0.0.1:20002", "127.0.0.1:20003"]}
                n.report("running")
            for n in (a, b):
                n.report("succeeded")
        status = d.await_job(job, WAIT_S)
    assert status["state"] == "SUCCEEDED" and status["generation"] == 1
