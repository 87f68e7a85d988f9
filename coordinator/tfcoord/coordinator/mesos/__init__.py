"""The Mesos engine: the coordinator runs one Mesos framework that places TensorFlow tasks.

Pure parts (no I/O): :mod:`.offers` (offer matching), :mod:`.jobs` (a Mesos job's
description carried in its job spec's labels), :mod:`.tasks` (TaskInfo building),
:mod:`.recordio` (the event stream's framing) and :mod:`.config`. The parts that talk:
:mod:`.scheduler` (the v1 scheduler HTTP API on aiohttp), :mod:`.engine` (jobs to tasks
and task states to state-machine events, on the coordinator's event loop) and
:mod:`.driver` (what ``tfcoord submit --engine mesos`` and ``tfmesos2.cluster`` call).

Importing this package imports nothing heavy: drivers load :mod:`.jobs` without aiohttp.
"""
