"""tfcoord: a coordinator for distributed TensorFlow on Apache Spark and Apache Mesos.

The distribution installs ``client/``, ``coordinator/`` and ``node/`` as
``tfcoord.client``, ``tfcoord.coordinator`` and ``tfcoord.node``; this package holds
what belongs to none of them alone: the command line.
"""

__version__ = "0.1.0"
