"""TensorFlowOnSpark's ``util``: single-node set-up and small host helpers."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Sequence

from tfcoord.node.hadoop import expand_classpath

from . import gpu_info

log = logging.getLogger("tfcoord.compat")


def single_node_env(num_gpus: int = 1, worker_index: int = -1, nodes: Sequence[str] = ()) -> None:
    """Prepare this process to run TensorFlow on its own (``TFParallel``-style code).

    Expands Hadoop's class path into ``CLASSPATH`` once (TensorFlow's HDFS support needs
    the jars listed, not globbed) when ``HADOOP_HOME``/``HADOOP_PREFIX`` is set, and sets
    ``CUDA_VISIBLE_DEVICES``: to ``num_gpus`` free GPUs of this host, claimed for this
    process, when it has GPUs, else to ``""`` (the CPU). ``nodes`` is accepted for
    TensorFlowOnSpark's signature; GPU claims need no list of the host's nodes.

    Raises:
        tfcoord.node.gpus.GpuUnavailable: the host has GPUs but too few are free.
    """
    expand_classpath(os.environ)
    if num_gpus > 0 and gpu_info.is_gpu_available():
        gpus = gpu_info.get_gpus(num_gpus, worker_index)
        log.info("using GPU(s) %s", gpus)
        os.environ["CUDA_VISIBLE_DEVICES"] = str(gpus)
    else:
        log.info("using the CPU")
        os.environ["CUDA_VISIBLE_DEVICES"] = ""


def get_ip_address() -> str:
    """This host's address on its default route (no packet is sent), else its name's address."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 80))  # TEST-NET-1: never routed anywhere, only looked up
            host: str = s.getsockname()[0]
            return host
        except OSError:
            return socket.gethostbyname(socket.getfqdn())


def find_in_path(path: str, file: str) -> str | bool:
    """The first ``file`` in the ``os.pathsep``-separated ``path``, else False (as TensorFlowOnSpark)."""
    for directory in path.split(os.pathsep):
        candidate = os.path.join(directory, file)
        if os.path.isfile(candidate):
            return candidate
    return False
