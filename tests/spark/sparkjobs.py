"""What the session's Spark application ran, read once Spark's own books have caught up.

``sc.statusTracker()`` reads the application's status store, which Spark's listener bus
fills in a thread of its own. An action that has returned has had its job's end (and its
tasks' ends) posted to that bus, not necessarily applied: for a moment the store can still
list the job as running, or count fewer failed tasks than there were. Each reader here first
waits until the bus has handled every event posted so far (``LiveListenerBus.waitUntilEmpty``,
what Spark's own tests use for this), so its answer covers everything that already happened.
"""

from __future__ import annotations

from typing import Any

#: The bus handles an event in well under a millisecond; a loaded machine gets ample slack.
LISTENER_DRAIN_S = 60.0


def caught_up(sc: Any) -> Any:
    """Wait until Spark's listener bus has handled every event posted so far; returns the
    application's status tracker, then current."""
    sc._jsc.sc().listenerBus().waitUntilEmpty(int(LISTENER_DRAIN_S * 1000))
    return sc.statusTracker()


def active_jobs(sc: Any) -> set[int]:
    """The ids of the Spark jobs still running, as of every event posted so far."""
    return set(caught_up(sc).getActiveJobsIds())


def failed_tasks(sc: Any, group: str) -> int:
    """Task attempts that failed in the Spark jobs of ``group`` (a retried task counts once per failure)."""
    tracker = caught_up(sc)
    jobs = tracker.getJobIdsForGroup(group)
    assert jobs, f"no Spark job ran in group {group}"
    stages = [s for j in jobs for s in tracker.getJobInfo(j).stageIds]
    infos = [tracker.getStageInfo(s) for s in stages]
    assert all(i is not None for i in infos)
    return sum(i.numFailedTasks for i in infos)
