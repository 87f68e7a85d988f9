"""Hadoop's class path for TensorFlow's HDFS support, on nodes (TensorFlowOnSpark does the same).

libhdfs, which TensorFlow loads for ``hdfs://`` paths, starts a JVM from ``CLASSPATH`` and
cannot expand the wildcards ``hadoop classpath`` prints by default, so the jars are listed one
by one (``hadoop classpath --glob``) when ``HADOOP_HOME`` or ``HADOOP_PREFIX`` is set.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import MutableMapping

#: Set once the expansion is done, so a process (and its children) does it once.
DONE_ENV = "TFOS_CLASSPATH_UPDATED"
#: ``hadoop classpath`` starts a JVM: a second or two, more on a loaded host.
HADOOP_TIMEOUT_S = 60.0


def expand_classpath(environ: MutableMapping[str, str]) -> bool:
    """Append Hadoop's jars to ``environ["CLASSPATH"]``; returns whether it did.

    Raises:
        RuntimeError: ``hadoop classpath --glob`` failed (the message says which command).
    """
    hadoop = environ.get("HADOOP_HOME") or environ.get("HADOOP_PREFIX")
    if not hadoop or DONE_ENV in environ:
        return False
    cmd = [os.path.join(hadoop, "bin", "hadoop"), "classpath", "--glob"]
    try:
        jars = subprocess.run(
            cmd, capture_output=True, text=True, check=True, timeout=HADOOP_TIMEOUT_S, env=dict(environ)
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        raise RuntimeError(
            f"{' '.join(cmd)} failed ({e}): check HADOOP_HOME/HADOOP_PREFIX, or unset them "
            "when the job reads no hdfs:// paths"
        ) from None
    environ["CLASSPATH"] = os.pathsep.join(p for p in (environ.get("CLASSPATH", ""), jars) if p)
    environ[DONE_ENV] = "1"
    return True
