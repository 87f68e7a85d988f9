"""The driver layer: submit a job and await it, on Spark (``spark``), as local processes
(``local``) or as Mesos tasks (``mesos``).

Drivers sit above the node runtime and the coordinator and below the command line and the
compatibility layers (see the import contracts in pyproject.toml): they start an embedded
coordinator or reach a running one, submit, follow, and clean up, through one path
(:mod:`tfcoord.driver.session`).
"""
