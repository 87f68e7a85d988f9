"""Whether a TensorFlow cluster fits the Spark application, or this machine, before it starts.

Every node of a Spark job is one Spark task, and a TensorFlow cluster forms only once every
node has registered, so all of them must run at once: an application with fewer task slots
than nodes can only wait out the reservation timeout (600 s by default). Where the Spark
configuration says how many slots the application will have, :func:`check_application`
refuses such a cluster at once, with the numbers. ``--master local-standalone`` starts a
worker on this machine: :func:`local_standalone_size` sizes it to what the job asks for and
refuses what the machine cannot give, rather than let Spark oversubscribe its cores or
wait for memory it does not have. Pure: the configuration and the machine's figures are
arguments.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

_LOCAL_CLUSTER = re.compile(r"local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,")
#: ``local``, ``local[N]``, ``local[*]``, with ``,F`` (task retries) after either.
_LOCAL = re.compile(r"local(?:\[\s*(\d+|\*)\s*(?:,\s*\d+\s*)?\])?")
_JVM_SIZE = re.compile(r"\s*(\d+)\s*([kmgt]?)b?\s*", re.IGNORECASE)
#: A JVM size's unit in MiB; Spark reads a bare number of ``spark.executor.memory`` as MiB.
_MIB = {"k": 1 / 1024, "": 1, "m": 1, "g": 1024, "t": 1024 * 1024}


def executor_in_driver_jvm(master: str) -> bool:
    """``local``, ``local[N]``: the one executor is the driver's own JVM."""
    return _LOCAL.fullmatch((master or "").strip()) is not None


def executors_on_this_machine(master: str) -> bool:
    """``local``, ``local[N]`` or ``local-cluster[...]``: every executor runs on this machine."""
    return executor_in_driver_jvm(master) or _LOCAL_CLUSTER.match((master or "").strip()) is not None


@dataclass(frozen=True)
class Slots:
    """The task slots the configuration gives the application, and how it says so."""

    count: int
    #: e.g. ``2 executors x 1 core (spark.cores.max=2, spark.executor.cores=1)``.
    shape: str


def _cores(n: int) -> str:
    return f"{n} core" + ("" if n == 1 else "s")


def _executors(n: int) -> str:
    return f"{n} executor" + ("" if n == 1 else "s")


def _shape(executors: int | None, cores: int | None, settings: list[str]) -> str:
    head = f"{_executors(executors)} x {_cores(cores)} " if executors is not None and cores else ""
    return f"{head}({', '.join(settings)})"


def configured_slots(get: Callable[[str], str | None], master: str, machine_cores: int) -> Slots | None:
    """The task slots the Spark configuration asks for (``get(key)`` reads a setting), once
    every executor has registered; None when it does not say (dynamic allocation, a
    standalone application without ``spark.cores.max``). ``machine_cores``: what
    ``local[*]`` runs on."""
    task_cpus = int(get("spark.task.cpus") or 1)
    per_task = [f"spark.task.cpus={task_cpus}"] if task_cpus > 1 else []
    if m := _LOCAL.fullmatch((master or "").strip()):  # the driver's own executor
        threads = machine_cores if m.group(1) == "*" else int(m.group(1) or 1)
        extra = f" ({per_task[0]})" if per_task else ""
        return Slots(threads // task_cpus, f"{master.strip()}: {threads} task thread(s){extra}")
    if m := _LOCAL_CLUSTER.match(master or ""):
        n, c = int(m.group(1)), int(m.group(2))
        return Slots(n * c // task_cpus, _shape(n, c, [master, *per_task]))
    cores = int(get("spark.executor.cores") or 0) or None
    instances = get("spark.executor.instances")
    if instances and cores:  # YARN, Kubernetes
        n = int(instances)
        settings = [f"spark.executor.instances={n}", f"spark.executor.cores={cores}", *per_task]
        return Slots(n * cores // task_cpus, _shape(n, cores, settings))
    if most := get("spark.cores.max"):  # standalone: executors of spark.executor.cores each
        total = int(most)
        settings = [f"spark.cores.max={total}"] + ([f"spark.executor.cores={cores}"] if cores else [])
        return Slots(
            total // task_cpus, _shape(total // cores if cores else None, cores, settings + per_task)
        )
    return None


def check_application(slots: Slots | None, nodes: int) -> None:
    """Refuse a cluster of ``nodes`` nodes the application's ``slots`` can never run at once.

    Raises:
        ValueError: fewer slots than nodes; the message gives both and what to change.
    """
    if slots is None or slots.count >= nodes:
        return
    raise ValueError(
        f"the application has {slots.count} Spark task slot(s), {slots.shape}, but the TensorFlow "
        f"cluster needs {nodes} nodes running at once, one task each, so it could never form: give the "
        f"application {nodes} executors of 1 core (spark.cores.max={nodes} on a standalone cluster, "
        f"spark.executor.instances={nodes} on YARN or Kubernetes; tfcoord submit: --num-executors {nodes}), "
        f"or ask for {slots.count} nodes (num_executors, ps included)"
    )


def jvm_size_mib(value: str) -> int:
    """MiB in a JVM size as Spark writes it (``1g``, ``512m``, ``2048``: MiB).

    Raises:
        ValueError: not such a size.
    """
    m = _JVM_SIZE.fullmatch(value)
    if m is None or int(m.group(1)) == 0:
        raise ValueError(f"executor memory must be a size such as 512m or 2g, not {value!r}")
    return max(1, int(int(m.group(1)) * _MIB[m.group(2).lower()]))


def executors_asked(cores_max: str, executor_cores: str) -> int:
    """The executors ``spark.cores.max`` and ``spark.executor.cores`` ask a standalone master for.

    Raises:
        ValueError: either is not a whole number > 0.
    """
    try:
        total, each = int(cores_max), int(executor_cores)
    except ValueError:
        total = each = 0
    if total < 1 or each < 1:
        raise ValueError(
            f"spark.cores.max and spark.executor.cores must be whole numbers > 0, not {cores_max!r} "
            f"and {executor_cores!r}"
        )
    return max(1, total // each)


def local_standalone_size(
    executors: int, executor_cores: int, executor_memory: str, machine_cores: int, machine_mib: int
) -> tuple[int, int]:
    """(cores, MiB) of the one worker ``--master local-standalone`` starts: exactly what
    ``executors`` executors of ``executor_cores`` cores and ``executor_memory`` take.

    Raises:
        ValueError: this machine (``machine_cores``, ``machine_mib``) has less; the message
            gives the numbers and what to change.
    """
    cores = executors * executor_cores
    mib = executors * jvm_size_mib(executor_memory)
    if cores > machine_cores:
        raise ValueError(
            f"--master local-standalone: {_executors(executors)} x {_cores(executor_cores)} need "
            f"{cores} cores, this machine has {machine_cores}: lower --num-executors or "
            "--executor-cores, or name a cluster with --master spark://HOST:7077"
        )
    if mib > machine_mib:
        raise ValueError(
            f"--master local-standalone: {_executors(executors)} x {executor_memory} need {mib} MiB, "
            f"this machine has {machine_mib} MiB: lower --executor-memory or --num-executors, or "
            "name a cluster with --master spark://HOST:7077"
        )
    return cores, mib


#: What one node of the local engine takes at least, before its program loads anything: its
#: supervisor (``python -m tfcoord.node``, 26 MiB RSS) and the work's own Python (13 MiB for
#: ``python -c``), measured on Python 3.11; a TensorFlow node takes ten times that.
LOCAL_NODE_MIB = 40


def local_nodes_fit(nodes: int, machine_mib: int) -> None:
    """Refuse a local job whose node processes cannot all run on this machine at once.

    Each node of ``--engine local`` is two processes here, and every one must run at once
    for the cluster to form: a count beyond what ``machine_mib`` holds (a typo's extra zero)
    would fork until the machine swaps or the kernel kills them.

    Raises:
        ValueError: with the numbers and what to change.
    """
    need = nodes * LOCAL_NODE_MIB
    if need > machine_mib:
        raise ValueError(
            f"{nodes} local nodes need at least {need:,} MiB ({LOCAL_NODE_MIB} MiB each before the "
            f"program loads anything), this machine has {machine_mib:,} MiB: lower --workers/--ps, "
            "or run them on a cluster (--engine spark or --engine mesos)"
        )
