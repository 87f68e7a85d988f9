"""The Spark driver API, in TensorFlowOnSpark's shapes: ``run``, ``parallel``, ``InputMode``.

The driver only submits and awaits. ``run`` starts an embedded coordinator (unless
``TFCOORD_ADDRESS`` or the ``coordinator`` argument names a running one), submits
the job, launches one Spark task per node in a background thread, and returns once
every node holds the cluster spec — or raises the moment the job fails, naming the
node and carrying its traceback. ``SparkCluster.shutdown`` awaits the end.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from tfcoord.client import (
    DeadlineExceeded,
    DriverClient,
    JobFailed,
    JobSpec,
    TfcoordError,
    auth,
    connfile,
    make_roles,
)
from tfcoord.client.entry import ADDRESS_ENV, SECRET_FILE_ENV
from tfcoord.client.jobreplies import JobStatus
from tfcoord.client.messages import MAX_TIMEOUT_S
from tfcoord.client.progress import ProgressLines
from tfcoord.client.replies import TENSORBOARD_PID_META
from tfcoord.client.terminal import TRACEBACK, printable
from tfcoord.client.vocab import FORMED_JOB, FailureReason, JobState, NodeState, RestartOn
from tfcoord.client.watcher import FOREVER_S, ended, watch_until
from tfcoord.node import feedtls, feedwire
from tfcoord.node.executor import NodeSpec, run_node, spark_partition
from tfcoord.node.feeder import FeedPlan, FeedTarget, control, inference_partition, train_partition
from tfcoord.node.parallel import ParallelTask, ParallelTaskFailed
from tfcoord.node.tlsfiles import TlsFiles

from . import capacity, console, resources, sparkconf
from .nodeoutput import NodeOutput, executors_print_here
from .session import INTERRUPT_REASON, CoordinatorLink, Interrupted, stop_interrupted
from .sparksubmit import SubmitOptions, submit_args

log = logging.getLogger("tfcoord.spark")

#: Where executors reach the driver's embedded coordinator, when the driver host's
#: default address is not routable from them (TFOS_SERVER_HOST is TensorFlowOnSpark's name).
SERVER_HOST_ENVS = ("TFCOORD_SERVER_HOST", "TFOS_SERVER_HOST")
#: Nodes told to stop terminate their map_fun within the executor's grace (5 s, or 10 s
#: for a fed node that may finish its queue first); allow for Spark to notice the tasks
#: ending before cancelling what is left.
STOP_WAIT_S = 15.0
#: After a feeding Spark job fails, how long to wait for the coordinator to hear of the
#: node failure that caused it (the node reports right after its feeders hear it), so the
#: driver raises the node's traceback rather than Spark's summary of the feeder's error.
FEED_FAILURE_SETTLE_S = 10.0
#: Job states in which a fed cluster still takes data.
FEEDING_STATES = FORMED_JOB
#: ``train(rdd, num_epochs=0)`` feeds this many epochs: TensorFlowOnSpark's choice for an
#: unspecified count, kept so its code trains the same amount unchanged.
DEFAULT_EPOCHS = 10
RESERVATION_HINTS = (
    "Usual causes: fewer Spark executors (or executor cores) than num_executors; dynamic "
    "allocation on (set spark.dynamicAllocation.enabled=false); spark.task.cpus above the "
    "executor's cores; other applications holding the cluster's cores."
)


class InputMode:
    """How data reaches TensorFlow (TensorFlowOnSpark's names)."""

    TENSORFLOW = 0  #: the TensorFlow code reads its own data
    SPARK = 1  #: Spark feeds RDD partitions to the nodes (cluster.train / inference)


def _coordinator(
    conf: Mapping[str, str],
    address: str | None,
    secret: bytes | None,
    tls: TlsFiles | None,
    plaintext: bool = False,
) -> tuple[CoordinatorLink, TlsFiles | None]:
    """The driver's link to its coordinator, and the TLS files its nodes read to reach it.

    An embedded coordinator serves TLS with a certificate of its own (its default),
    whose CA its nodes pin through the job (``TlsFiles.ca_pem``): executors dial it across
    the cluster's network, where anyone on the path could otherwise read cluster specs and
    tracebacks or inject frames. ``plaintext`` opts out, with a warning.
    """
    address = address or os.environ.get(ADDRESS_ENV)
    if address:
        if secret is None:
            path = os.environ.get(SECRET_FILE_ENV)
            if not path:
                raise ValueError(
                    f"{ADDRESS_ENV} is set but {SECRET_FILE_ENV} is not; set both, or neither "
                    "to use an embedded coordinator"
                )
            secret = auth.read_secret(path)
        # A driver program configured like the CLI (TFCOORD_TLS_*) reaches the coordinator like it.
        tls = tls or TlsFiles.from_env(os.environ)
        return CoordinatorLink(address, secret, tls.context() if tls is not None else None), tls
    if tls is not None:
        raise ValueError(
            "tls= is for a running coordinator that serves TLS: give its address too "
            f"(coordinator= or {ADDRESS_ENV}); the embedded coordinator makes its own certificate, "
            "which its nodes pin"
        )
    host = next((os.environ[e] for e in SERVER_HOST_ENVS if os.environ.get(e)), None)
    host = host or conf.get("spark.driver.host") or socket.gethostbyname(socket.gethostname())
    # TensorFlowOnSpark's TFOS_SERVER_PORT fixes its reservation server's port (a firewall lets
    # only it through); here it is the embedded coordinator's.
    port = os.environ.get("TFOS_SERVER_PORT", "").strip()
    if port and not port.isdigit():
        raise ValueError(f"TFOS_SERVER_PORT must be a port number, not {port!r}")
    link = CoordinatorLink.start_embedded(
        host="0.0.0.0",
        advertise_host=host,
        port=int(port or 0),
        plaintext=plaintext,  # logged as a warning there
        # Another shell of this user stops a streaming job with `tfcoord stop JOB` or
        # TensorFlowOnSpark's utils/stop_streaming.py HOST PORT, without flags.
        connection_dir=connfile.runtime_dir(os.environ),
    )
    log.info(
        "coordinator listening at %s (stop a job from another shell: tfcoord stop JOB, or "
        "stop_streaming.py %s %s)",
        link.address,
        host,
        link.address.rpartition(":")[2],
    )
    return link, TlsFiles(ca_pem=link.ca_pem) if link.ca_pem else None


#: Spark configuration keys for the restart policy, read by :func:`run` when its arguments
#: leave them unset: a TensorFlowOnSpark program (``TFCluster.run``) gains restarts unchanged
#: (``spark-submit --conf spark.tfcoord.maxRestarts=3``, ``tfcoord submit --max-restarts 3``).
MAX_RESTARTS_CONF = "spark.tfcoord.maxRestarts"
RESTART_ON_CONF = "spark.tfcoord.restartOn"
RESTART_BACKOFF_CONF = "spark.tfcoord.restartBackoff"
DEADLINE_CONF = "spark.tfcoord.deadline"


def restart_policy(
    sc: Any,
    max_restarts: int | None,
    restart_on: RestartOn | str | None,
    restart_backoff_s: float | None,
    deadline_s: float | None,
) -> dict[str, Any]:
    """JobSpec's restart fields: the arguments given, else the Spark configuration's keys.

    Raises:
        ValueError: a key's value is not a number (or not a RestartOn), naming the key.
    """
    return _restart_policy(
        sparkconf.read_settings(sc), max_restarts, restart_on, restart_backoff_s, deadline_s
    )


def _restart_policy(
    conf: Mapping[str, str],
    max_restarts: int | None,
    restart_on: RestartOn | str | None,
    restart_backoff_s: float | None,
    deadline_s: float | None,
) -> dict[str, Any]:

    def read(value: Any, key: str, parse: Callable[[str], Any], default: Any) -> Any:
        if value is not None:
            return value
        raw = conf.get(key)
        if raw is None or not str(raw).strip():
            return default
        try:
            return parse(str(raw).strip())
        except ValueError:
            raise ValueError(f"Spark configuration {key}={raw!r} is not valid: {parse.__doc__}") from None

    def count(text: str) -> int:
        """a whole number of restarts, 0 or more"""
        return int(text)

    def seconds(text: str) -> float:
        """a number of seconds"""
        return float(text)

    def policy(text: str) -> RestartOn:
        """exit-code or any-failure"""
        return RestartOn(text)

    return {
        "max_restarts": int(read(max_restarts, MAX_RESTARTS_CONF, count, 0)),
        "restart_on": RestartOn(read(restart_on, RESTART_ON_CONF, policy, RestartOn.EXIT_CODE)),
        "restart_backoff_s": float(read(restart_backoff_s, RESTART_BACKOFF_CONF, seconds, 1.0)),
        "deadline_s": float(read(deadline_s, DEADLINE_CONF, seconds, 0.0)),
    }


def _default_fs(sc: Any) -> str:
    fs = sc._jsc.hadoopConfiguration().get("fs.defaultFS") or "file://"
    return fs[:-1] if fs.startswith("file://") and len(fs) > 7 and fs.endswith("/") else fs


#: The job's label with the Spark UI's address (the dashboard links it).
SPARK_UI_LABEL = "spark_ui_url"


def _labels(sc: Any) -> dict[str, str]:
    """What the dashboard shows of the Spark application: its id, and its UI where it has one."""
    labels = {"spark_app_id": sc.applicationId}
    ui = getattr(sc, "uiWebUrl", None)  # None when spark.ui.enabled is false
    if isinstance(ui, str) and ui.startswith(("http://", "https://")) and len(ui) <= 1024:
        labels[SPARK_UI_LABEL] = ui
    return labels


def cluster_roles(
    num_executors: int, num_ps: int, master_node: str | None = None, eval_node: bool = False
) -> tuple[tuple[str, int], ...]:
    """The cluster's roles for ``num_executors`` nodes: ps, chief/master and evaluator as
    asked, workers for the rest. Needs no Spark: ``tfcoord submit`` checks its flags with it
    before Spark starts.

    Raises:
        ValueError: the numbers describe no cluster (the message says what to change).
    """
    if master_node not in (None, "chief", "master"):
        raise ValueError(f"master_node must be None, 'chief' or 'master', not {master_node!r}")
    if num_ps < 0 or num_executors < 1:
        raise ValueError(f"num_executors must be >= 1 and num_ps >= 0 (got {num_executors}, {num_ps})")
    num_workers = num_executors - num_ps - (1 if master_node else 0) - (1 if eval_node else 0)
    if num_workers < 0:
        raise ValueError(
            f"num_executors={num_executors} leaves no room for {num_ps} ps"
            + (f", a {master_node}" if master_node else "")
            + (", an evaluator" if eval_node else "")
            + "; raise num_executors"
        )
    if num_workers == 0 and not master_node:
        raise ValueError(
            "the cluster needs at least one worker or a chief/master: raise num_executors or lower num_ps"
        )
    return make_roles(num_workers, num_ps, chief=master_node, evaluator=eval_node)


def run(
    sc: Any,
    map_fun: Any,
    tf_args: Any,
    num_executors: int,
    num_ps: int,
    tensorboard: bool = False,
    input_mode: int = InputMode.TENSORFLOW,
    log_dir: str | None = None,
    driver_ps_nodes: bool = False,
    master_node: str | None = None,
    reservation_timeout: float = 600,
    queues: Any = ("input", "output", "error"),
    eval_node: bool = False,
    release_port: bool = True,
    *,
    coordinator: str | None = None,
    secret: bytes | None = None,
    name: str = "",
    tls: TlsFiles | None = None,
    legacy_keras: bool = False,
    plaintext: bool = False,
    executor_setup: Callable[[], None] | None = None,
    max_restarts: int | None = None,
    restart_on: RestartOn | str | None = None,
    restart_backoff_s: float | None = None,
    deadline_s: float | None = None,
    feed_bind: str | None = None,
    role_resources: Mapping[str, Any] | None = None,
    quiet: bool | None = None,
) -> SparkCluster:
    """Start a TensorFlow cluster on Spark executors and run ``map_fun(tf_args, ctx)`` on each.

    Returns once every node holds the cluster spec.

    ``legacy_keras``: ``tf.keras`` is Keras 2 in the nodes when tf-keras is installed there
    (TensorFlowOnSpark's programs are written for it; see :mod:`tfcoord.node.keras2`).

    ``max_restarts``, ``restart_on``, ``restart_backoff_s``, ``deadline_s``: the job's restart
    policy (see :class:`~tfcoord.client.messages.JobSpec` and docs/src/fault-tolerance.md): a
    node lost, or killed by a signal, restarts the whole cluster up to ``max_restarts`` times;
    every node runs ``map_fun`` again with ``ctx.restart_count`` set, and resumes from its
    checkpoint. Left as None, each comes from the Spark configuration (``spark.tfcoord.maxRestarts``,
    ``spark.tfcoord.restartOn``, ``spark.tfcoord.restartBackoff``, ``spark.tfcoord.deadline``),
    so TensorFlowOnSpark's programs gain it unchanged. Not with ``InputMode.SPARK``: the
    partitions already fed cannot be fed again.

    ``feed_bind``: where a fed node's feed port listens (``InputMode.SPARK``): by default the
    address the node registered, the one feeders dial; ``"0.0.0.0"`` widens it to every
    interface.

    ``role_resources``: what each task of a role needs, ``{"ps": {"cpus": 1}, "worker": {"cpus": 2,
    "gpus": 1, "memory": "4g"}}`` (see :mod:`tfcoord.driver.resources` and docs/src/resources.md):
    each role named runs as its own Spark job with a ResourceProfile (task cpus and GPUs; with
    dynamic allocation the executors' cores, memory and GPUs too), and the coordinator joins every
    job's nodes into one cluster. GPUs then follow the profile alone: a node uses the addresses
    Spark gave its task, and a role without GPUs runs with ``CUDA_VISIBLE_DEVICES=""``. Left as
    None, it comes from the Spark configuration (``spark.tfcoord.resources.<role>.<cpus|gpus|memory>``).
    ``ctx.resources`` tells each node what its task was given.
    ``quiet``: no progress and no node output on stderr. Left as None, from the Spark setting
    ``spark.tfcoord.quiet`` or the environment variable ``TFCOORD_QUIET``. Otherwise, unless
    the program configured logging itself, the reservation's progress (who is still
    missing), readiness, each node's end and the outcome are printed on stderr (see
    :mod:`tfcoord.driver.console`), and, in any case, each node's output lines as they come,
    ``[worker:0] ...`` (see :mod:`tfcoord.driver.nodeoutput`).

    ``executor_setup``: called in each node's process before ``map_fun`` (it is pickled, so
    a module-level function of a module the executors can import); the TensorFlowOnSpark layer
    installs its import aliases this way.

    ``coordinator`` and ``secret`` (or ``TFCOORD_ADDRESS`` and ``TFCOORD_SECRET_FILE``) name
    a running coordinator instead of an embedded one; ``tls`` (or ``TFCOORD_TLS_CA``,
    ``TFCOORD_TLS_CERT``, ``TFCOORD_TLS_KEY``) the files to reach it over TLS, which the
    driver and every node read (the paths must be valid where the nodes run). An embedded
    coordinator speaks TLS with a certificate it makes itself, pinned by the nodes;
    ``plaintext=True`` turns that off (logged as a warning).

    Raises:
        ValueError: the arguments do not describe a valid cluster (the message says what to change).
        JobFailed: a node failed, or the reservation timed out (naming every missing executor).
    """
    if input_mode not in (InputMode.TENSORFLOW, InputMode.SPARK):
        raise ValueError(f"input_mode must be InputMode.TENSORFLOW or InputMode.SPARK, not {input_mode!r}")
    if driver_ps_nodes and input_mode != InputMode.TENSORFLOW:
        raise ValueError("driver_ps_nodes=True works only with InputMode.TENSORFLOW")
    roles = cluster_roles(num_executors, num_ps, master_node, eval_node)
    if isinstance(queues, str) or not all(isinstance(q, str) and q for q in queues):
        raise ValueError(f"queues must be a list of queue names, not {queues!r}")
    conf = sparkconf.read_settings(sc)
    given, profiles = _role_profiles(sc, conf, role_resources, roles, driver_ps_nodes)
    # Every node on an executor is a Spark task and all must run at once: refused now, with
    # the numbers, rather than after the reservation timeout (roles with resources of their
    # own are checked against their profiles instead).
    nodes = num_executors - (num_ps if driver_ps_nodes else 0)
    configured = _configured_slots(sc, conf)
    if not given:
        capacity.check_application(configured, nodes)
    if quiet is None:
        quiet = console.quiet_from(os.environ, conf.get(console.QUIET_CONF))
    console.show_progress(quiet)
    executors_python(sc)
    policy = _restart_policy(conf, max_restarts, restart_on, restart_backoff_s, deadline_s)
    if policy["max_restarts"] and input_mode == InputMode.SPARK:
        raise ValueError(
            "max_restarts needs InputMode.TENSORFLOW: with InputMode.SPARK the partitions Spark already "
            "fed to the nodes cannot be fed again after a restart (read the data in map_fun, or set "
            f"max_restarts=0 / {MAX_RESTARTS_CONF}=0)"
        )
    spec = JobSpec(
        **policy,
        roles=roles,
        reservation_timeout_s=float(reservation_timeout),
        engine="spark",
        name=name or sc.appName,
        labels=_labels(sc),
    )
    link, tls = _coordinator(conf, coordinator, secret, tls, plaintext)
    address = link.address
    # A coordinator that refuses the first connection is a wrong address, not one restarting:
    # said at once (a refused address took the 30 s connect deadline), like the CLI's clients.
    try:
        driver = link.connect(fail_fast=True).connect()
    except BaseException:
        link.close()
        raise
    try:
        job = driver.submit(spec)
        node = NodeSpec(
            address=address,
            token=driver.job_token(job),
            job=job,
            map_fun=map_fun,
            tf_args=tf_args,
            slots=tuple(spec.slots()),
            tensorboard=tensorboard,
            log_dir=log_dir,
            release_port=release_port,
            default_fs=_default_fs(sc),
            working_dir=os.getcwd(),
            wait_timeout_s=float(reservation_timeout) + 60,
            feed=input_mode == InputMode.SPARK,
            tls=tls,
            background=input_mode == InputMode.SPARK,
            legacy_keras=legacy_keras,
            setup=executor_setup,
            feed_bind=feed_bind,
            queues=tuple(queues),
            role_resources=_node_resources(given),
        )
        cluster = SparkCluster(sc, driver, job, spec, node, link, input_mode, tensorboard)
        cluster.profiles = profiles
        # The nodes' output, as the local engine shows it (unless it is on this stderr already).
        if not quiet and not executors_print_here(sc.master):
            cluster.output = NodeOutput(driver, job).start()
    except BaseException:
        driver.close()
        link.close()
        raise
    cluster.queues = tuple(queues)
    cluster._restore_sigint = _plain_interrupts()
    _Started.count += 1
    _Started.last = cluster
    try:
        cluster._launch(driver_ps_nodes, num_ps)
        if configured is None and not given:
            # The configuration did not say: the executors that register will.
            threading.Thread(
                target=cluster._warn_if_short, args=(nodes,), name="tfcoord-task-slots", daemon=True
            ).start()
        cluster._await_ready()
        if node.background:
            cluster._await_launched()
    except Interrupted:
        raise
    except KeyboardInterrupt:
        raise cluster._interrupt() from None
    except BaseException:
        cluster._abort("the driver gave up waiting for the cluster")
        raise
    return cluster


def _role_profiles(
    sc: Any,
    conf: Mapping[str, str],
    role_resources: Mapping[str, Any] | None,
    roles: Any,
    driver_ps_nodes: bool,
) -> tuple[dict[str, resources.Resources], dict[str, Any]]:
    """The roles' resources (the argument, else the Spark configuration's keys), checked against
    what this application can honour, and the ResourceProfile of each role named.

    Raises:
        ResourcesError: (a ValueError) the description is malformed or cannot be honoured here.
    """
    given = resources.role_resources(role_resources) if role_resources is not None else {}
    given = given or resources.from_conf(conf.items())
    if not given:
        return {}, {}
    resources.check_roles(given, roles)
    if driver_ps_nodes and "ps" in given:
        raise resources.ResourcesError(
            "driver_ps_nodes=True runs the ps on the driver, outside any Spark task: drop ps from "
            "role_resources or run the ps on executors"
        )
    plan = resources.check_spark(given, sc.master, sc.version, conf)
    log.info(
        "roles with their own resources (%s%s): %s",
        plan.manager,
        ", dynamic allocation" if plan.dynamic else ", task resources on the executors there are",
        "; ".join(f"{role} {r.text()}" for role, r in given.items()),
    )
    return given, {role: resources.spark_profile(r, plan) for role, r in given.items()}


def _node_resources(given: Mapping[str, resources.Resources]) -> dict[str, dict[str, Any]]:
    """What the nodes learn of their role's resources (plain values: the node layer sits below)."""
    return {role: {"cpus": r.cpus, "gpus": r.gpus, "memory_mb": r.memory_mb} for role, r in given.items()}


def _plain_interrupts() -> Callable[[], None]:
    """While a cluster runs, Ctrl-C is Python's plain KeyboardInterrupt; returns what puts
    pyspark's handler back.

    pyspark's SIGINT handler (installed by ``SparkContext()`` in the main thread) cancels every
    Spark job before raising: that kills the nodes' tasks before they can hear the stop, and
    the job ends FAILED with its nodes lost. Without it the cluster stops the job first
    (``SparkCluster._interrupt``: nodes told, bounded wait) and cancels what is left after.
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None  # signal handlers belong to the main thread
    current = signal.getsignal(signal.SIGINT)
    if not (getattr(current, "__module__", None) or "").startswith("pyspark"):
        return lambda: None  # the program's own handler, or Python's: left alone

    def restore() -> None:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, current)

    signal.signal(signal.SIGINT, signal.default_int_handler)
    return restore


class SparkCluster:
    """A running TensorFlow cluster on Spark (TensorFlowOnSpark's ``TFCluster``)."""

    def __init__(
        self,
        sc: Any,
        driver: DriverClient,
        job: str,
        spec: JobSpec,
        node: NodeSpec,
        link: CoordinatorLink,
        input_mode: int,
        tensorboard: bool,
    ) -> None:
        self.sc = sc
        self.driver = driver
        self.job = job
        self.spec = spec
        self.node = node
        self.input_mode = input_mode
        #: The queue names train()/inference() may feed (run's ``queues``).
        self.queues: tuple[str, ...] = ("input", "output", "error")
        self._tensorboard = tensorboard
        #: The coordinator: an embedded one is stopped with the cluster.
        self.link = link
        self._threads: list[threading.Thread] = []
        self._group = f"tfcoord-{job}"
        self.spark_error: BaseException | None = None
        self._executor_nodes = spec.size
        #: role → ResourceProfile for the roles run as Spark jobs of their own (``role_resources``).
        self.profiles: dict[str, Any] = {}
        #: The job's status when it formed, then when it ended (``shutdown``).
        self.status: JobStatus | None = None
        #: The driver's progress lines (reservation, readiness, node ends), logged once each.
        self._progress = ProgressLines(lambda line: log.info("%s", line), final=False)
        self._aborted = False  # _abort ran: nodes stopped, coordinator closed
        #: The nodes' output followed onto stderr (unless quiet), until the cluster is done.
        self.output: NodeOutput | None = None
        #: Puts back the SIGINT handler the cluster replaced (see :func:`_plain_interrupts`).
        self._restore_sigint: Callable[[], None] = lambda: None

    @property
    def cluster_info(self) -> list[dict[str, Any]]:
        """Every node, by executor id, with TensorFlowOnSpark's keys and the coordinator's view.

        TensorFlowOnSpark's keys: ``executor_id``, ``host``, ``job_name``, ``task_index``,
        ``port`` (its TensorFlow port); ``tb_pid`` and ``tb_port``, TensorBoard's process and
        port beside the chief (or worker 0), else 0 (the port once TensorBoard answers);
        ``addr``, the ``(host, port)`` of the node's feed port where it takes fed data
        (InputMode.SPARK chief, master, worker), else None — where TensorFlowOnSpark has its
        TFManager's address: tfcoord's nodes have no manager; and ``authkey``, always None:
        feeders prove the job token, which is not shown here (TensorFlowOnSpark's per-node
        manager key). Besides them, the coordinator's fields (``role``, ``index``,
        ``state``, ``gpus``, ``meta``, ``error``, ...), read live; after ``shutdown``, as
        the job ended.
        """
        try:
            st = self.driver.status(self.job)
        except TfcoordError:
            if self.status is None:
                raise
            st = self.status
        return [_tfos_node(n) for n in sorted(st.nodes, key=lambda n: n.executor_id)]

    @property
    def cluster_meta(self) -> dict[str, Any]:
        """The cluster's description with TensorFlowOnSpark's keys.

        ``id``: the job id (TensorFlowOnSpark draws a random number); ``cluster_template``:
        ``{role: [executor ids]}``; ``num_executors``: the nodes; ``default_fs`` and
        ``working_dir``: what ``ctx.defaultFS`` and ``ctx.working_dir`` hold; ``server_addr``:
        the coordinator's ``(host, port)``, where the nodes register (TensorFlowOnSpark's
        reservation server; ``tfcoord stop`` and ``reservation.Client(server_addr)`` reach
        it); ``release_port``: run's argument.
        """
        template: dict[str, list[int]] = {}
        for executor_id, (role, _) in enumerate(self.node.slots):
            template.setdefault(role, []).append(executor_id)
        host, _, port = self.node.address.rpartition(":")
        return {
            "id": self.job,
            "cluster_template": template,
            "num_executors": self.spec.size,
            "default_fs": self.node.default_fs,
            "working_dir": self.node.working_dir,
            "server_addr": (host.strip("[]"), int(port)),
            "release_port": self.node.release_port,
        }

    def _launch(self, driver_ps_nodes: bool, num_ps: int) -> None:
        first = num_ps if driver_ps_nodes else 0
        n = self.spec.size
        self._executor_nodes = n - first
        # One Spark job per role with its own profile, one for the rest: the coordinator, not a
        # stage, joins the nodes, so the jobs may be scheduled apart (stage-level scheduling).
        runs: dict[str, list[int]] = {}
        for executor_id in range(first, n):
            role = self.node.slots[executor_id][0]
            runs.setdefault(role if role in self.profiles else "", []).append(executor_id)
        for label, ids in runs.items():
            rdd = self.sc.parallelize(ids, len(ids))
            if label:
                rdd = rdd.withResources(self.profiles[label])
            self._start(lambda rdd=rdd: self._spark_job(rdd), f"tfcoord-spark-job-{label or 'nodes'}")
        for executor_id in range(first):  # ps nodes on the driver, TensorFlowOnSpark's driver_ps_nodes
            self._start(
                lambda i=executor_id: run_node(self.node, i, task_id="driver"),
                f"tfcoord-driver-ps-{executor_id}",
            )

    def _spark_job(self, rdd: Any) -> None:
        """One Spark job running the nodes in ``rdd`` (one executor id per partition)."""
        try:
            self.sc.setJobGroup(self._group, f"TensorFlow job {self.job}", interruptOnCancel=True)
            rdd.foreachPartition(spark_partition(self.node))
        except BaseException as e:
            self.spark_error = e
            # Wake everyone waiting on the job: the nodes that are up are told to stop.
            try:
                self.driver.stop(
                    self.job,
                    f"the Spark job running the nodes failed: {_spark_summary(e)}",
                    cause=FailureReason.ENGINE_FAILED,
                )
            except TfcoordError:
                # The job already ended, or its coordinator is gone: nothing is left to wake,
                # and spark_error still carries Spark's failure to shutdown().
                pass

    def _start(self, fn: Any, name: str) -> None:
        t = threading.Thread(target=fn, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def _warn_if_short(self, nodes: int) -> None:
        """Say, within :data:`EXECUTOR_WAIT_S`, that the executors registered so far cannot
        run the ``nodes`` node tasks at once: the reservation would otherwise wait silently
        until its timeout. (Spark may still add executors: a warning, not a failure.)"""
        slots = await_task_slots(self.sc, nodes)
        if slots < nodes:
            log.warning(
                "job %s: the application has %d Spark task slot(s) after %g s, but the TensorFlow "
                "cluster needs %d nodes running at once, one task each: it forms only if Spark gives "
                "the application more executors (another application may hold the cluster's cores; "
                "spark.cores.max or spark.executor.instances x spark.executor.cores ask for %d)",
                self.job,
                slots,
                EXECUTOR_WAIT_S,
                nodes,
                nodes,
            )

    def _await_ready(self) -> None:
        def settled(st: JobStatus) -> bool:
            return st.state in FORMED_JOB or st.terminal or st.state == JobState.STOPPING

        st = watch_until(
            self.driver,
            self.job,
            settled,
            timeout_s=self.spec.reservation_timeout_s + 60,
            on_change=self._progress,
        )
        if not settled(st):
            raise JobFailed(self.job, f"job {self.job} is still {st.state} after the reservation timeout", st)
        self.status = st
        if st.state not in FORMED_JOB and st.state != JobState.SUCCEEDED:
            raise self._failure(st)

    def _await_launched(self) -> None:
        """Background nodes: wait until each node's Spark task has returned (its map_fun runs),
        so the slots are free for the feeding tasks that come next.

        A job that ended meanwhile (a map_fun that raised at once) ends the wait: the next
        call on the cluster (train, inference, shutdown) raises its error, as in
        TensorFlowOnSpark, where ``run`` returns before the nodes' functions fail.
        """
        deadline = time.monotonic() + self.spec.reservation_timeout_s + 60
        for t in self._threads:
            while t.is_alive() and time.monotonic() < deadline:
                t.join(timeout=0.5)
                if t.is_alive() and self.driver.status(self.job).terminal:
                    return

    def follow(self, emit: Callable[[str], None], timeout_s: float = FOREVER_S) -> JobStatus:
        """Emit a line each time the job's summary changes (running, nodes done) until it ends.

        The final state is not emitted: ``shutdown`` says how the job ended, with the why.
        Returns the last status seen.
        """
        try:
            return watch_until(
                self.driver,
                self.job,
                timeout_s=timeout_s,
                # From where run()'s own progress lines stopped: its last line is not said again.
                on_change=ProgressLines(emit, final=False, after=self._progress),
            )
        except KeyboardInterrupt:
            raise self._interrupt() from None

    def _interrupt(self) -> Interrupted:
        """Ctrl-C: stop the job, wait (bounded) for its end, leave nothing behind; the error
        to raise, which says how the job ended."""
        if self._aborted:
            return Interrupted(self.job, self.status.state if self.status else None)
        interrupted = stop_interrupted(self.driver, self.job)
        self._abort(INTERRUPT_REASON)
        return interrupted

    def _failure(self, st: JobStatus) -> JobFailed:
        msg = f"job {self.job} {st.state}: {st.why}"
        if st.reason == FailureReason.RESERVATION_TIMEOUT:
            msg += "\n" + RESERVATION_HINTS
        if self.spark_error is not None and st.reason == FailureReason.ENGINE_FAILED:
            msg += f"\nSpark error: {_spark_summary(self.spark_error)}"
        # The driver program prints it: a node's error text cannot drive its terminal.
        return JobFailed(self.job, printable(msg, keep=TRACEBACK), st)

    def tensorboard_url(self, timeout_s: float = 60.0) -> str | None:
        """The URL of the TensorBoard beside the chief (or worker 0); None without ``tensorboard=True``.

        TensorBoard takes a few seconds to serve after the cluster forms; this waits for
        its URL (pushed by the node once TensorBoard answers) up to ``timeout_s``.
        """
        if not self._tensorboard:
            return None

        def url(st: JobStatus) -> str | None:
            return next((n.tensorboard_url for n in st.nodes if n.tensorboard_url), None)

        st = watch_until(
            self.driver, self.job, lambda st: url(st) is not None or st.terminal, timeout_s=timeout_s
        )
        return url(st)

    def shutdown(self, ssc: Any = None, grace_secs: float = 0, timeout: float = 259200) -> JobStatus:
        """Wait for the job to end, stop ps/evaluator nodes, clean up; returns the final status.

        ``InputMode.TENSORFLOW``: waits (up to ``timeout``) for the chief/master and
        workers to finish; ps and evaluator nodes then get ``grace_secs`` to end on their
        own (an evaluator's final evaluation), and are stopped after it.

        ``InputMode.SPARK`` (TensorFlowOnSpark's meaning of ``grace_secs``): ends the feed,
        then gives the nodes up to ``grace_secs`` to finish (a chief exporting its model)
        and to fail: an error they raise in that time is raised here; ps and evaluator nodes
        are not stopped before it has passed, unless they end on their own. Returns as soon
        as the job has ended; nodes still running after ``grace_secs`` are stopped (the job
        ends STOPPED if a chief, master or worker was among them, and an error after that
        point is not waited for).

        With ``ssc`` (streaming): waits for a stop request (``tfcoord stop``, or
        ``DataFeed.terminate()`` in any node), then stops the streaming context gracefully.

        Raises:
            JobFailed: the job failed (the message names the node and carries its
                traceback), or a node failed within ``grace_secs``.
        """
        try:
            st = self._shutdown(ssc, grace_secs, timeout)
        except JobFailed as e:
            _log_outcome(str(e).strip().splitlines()[0] if str(e).strip() else f"job {self.job} failed")
            raise
        if st.state == JobState.SUCCEEDED:
            _log_outcome(f"job {st.job} {st.state}")
            for n in st.nodes:
                if n.results:
                    _log_outcome(
                        f"  {n.name} on {n.host}: " + " ".join(f"{k}={v}" for k, v in n.results.items())
                    )
        else:
            _log_outcome(f"job {st.job} {st.state}: {st.stop_reason or st.error}")
        return st

    def _shutdown(self, ssc: Any, grace_secs: float, timeout: float) -> JobStatus:
        try:
            wait_s = timeout if timeout > 0 else FOREVER_S
            if grace_secs > 0:
                self._serving_grace(grace_secs)
            if ssc is not None:
                # A streaming job runs until a stop is requested (tfcoord stop, DataFeed.terminate());
                # then the streaming context stops gracefully: micro-batches in flight finish,
                # and see the job stopping, so nothing more is fed.
                self._await_stop_request(wait_s)
                ssc.stop(stopSparkContext=False, stopGraceFully=True)
            if self.input_mode == InputMode.SPARK:
                self._end_feed()
                st = self._wait_until(ended, grace_secs)
                if not st.terminal:
                    self.driver.stop(
                        self.job,
                        f"shutdown: the nodes were still running {grace_secs:g} s "
                        "(grace_secs) after the feed ended",
                    )
            st = watch_until(self.driver, self.job, ended, timeout_s=wait_s, on_change=self._progress)
            if not st.terminal:
                raise DeadlineExceeded(
                    f"job {self.job} is still {st.state} after shutdown's timeout of {wait_s:g} s"
                )
            if st.state == JobState.FAILED:
                self._cancel_spent_spark_jobs()
            for t in self._threads:  # ps/evaluator tasks end once told to stop
                t.join(timeout=60)
            # Late reports: a ps or evaluator acknowledging its stop (or failing), a node whose
            # supervisor died being declared lost; returns as soon as every node has ended.
            st = self._wait_until(lambda st: not any(n.live for n in st.nodes), grace_secs)
            self.status = st
            if st.state == JobState.FAILED:
                raise self._failure(st)
            late = [n for n in st.nodes if n.state == NodeState.FAILED]
            if late:
                n = late[0]
                raise JobFailed(
                    self.job,
                    printable(
                        f"job {self.job}: {n.name} (executor {n.executor_id}, host {n.host}) "
                        f"failed late:\n{n.error}",
                        keep=TRACEBACK,
                    ),
                    st,
                    FailureReason.NODE_FAILED,
                )
            if st.state == JobState.STOPPED and self.spark_error is not None:
                raise self._failure(st)
            return st
        except Interrupted:
            raise
        except KeyboardInterrupt:
            raise self._interrupt() from None
        finally:
            self._abort("shutdown")

    def _cancel_spent_spark_jobs(self) -> None:
        """A failed job: once its nodes have ended, end its Spark jobs rather than wait for them.

        What Spark still runs of them then is a failed task's way back to this driver and
        the stage's abort: 0.05 to 2.8 s after the coordinator knew (2 executors on two loaded
        cores, benchmarks/node_death.py), all of it before the error could be raised. The
        Spark job fails either way, and its abort kills its tasks' Python workers either way;
        a cancel ends it in the driver at once.
        """
        if not any(t.is_alive() for t in self._threads):
            return
        st = self._wait_until(lambda st: not any(n.live for n in st.nodes), STOP_WAIT_S)
        if not any(n.live for n in st.nodes):
            self.sc.cancelJobGroup(self._group)

    def _serving_grace(self, grace_secs: float) -> None:
        """Have the coordinator give the ps and evaluator nodes ``grace_secs`` once the chief,
        master and workers have succeeded, rather than stop them at once."""
        try:
            self.driver.finish(self.job, min(float(grace_secs), MAX_TIMEOUT_S))
        except TfcoordError as e:  # the job ended already; or a coordinator without finish
            log.info("job %s: no grace for its ps/evaluator nodes: %s", self.job, e)

    def _wait_until(self, done: Callable[[JobStatus], bool], timeout_s: float) -> JobStatus:
        """The job's status once ``done(status)`` holds, or when ``timeout_s`` has passed."""
        st = self.driver.status(self.job)
        try:
            st = watch_until(self.driver, self.job, done, timeout_s=timeout_s, since=st)
        except TfcoordError:
            # Only waiting ends early here: the caller's next request to the coordinator
            # (await_job, status) reports a coordinator that is really gone.
            pass
        return st

    def _abort(self, reason: str) -> None:
        """Leave nothing behind: stop the nodes, cancel the Spark tasks, close the coordinator
        (once: the later calls find nothing left)."""
        if self._aborted:
            return
        self._aborted = True
        try:
            if not self.driver.status(self.job).terminal:
                self.driver.stop(self.job, reason)
            if self.node.background:
                # No Spark task holds a background node: it ends when it hears the stop, which
                # it can only while the coordinator is up.
                self._wait_until(lambda st: not any(n.live for n in st.nodes), STOP_WAIT_S)
        except TfcoordError:
            pass
        for t in self._threads:
            t.join(timeout=STOP_WAIT_S)
        if any(t.is_alive() for t in self._threads):
            # Tasks that did not end on their own (a node stuck before it could hear the
            # stop) are interrupted by Spark, which kills their Python workers.
            self.sc.cancelJobGroup(self._group)
            for t in self._threads:
                t.join(timeout=STOP_WAIT_S)
        if self.output is not None:
            self.output.stop()  # the nodes' last lines, while the coordinator still answers
        self.driver.close()
        self.link.close()
        self._restore_sigint()

    # -- InputMode.SPARK -----------------------------------------------------------------

    def _check_queue(self, qname: str) -> None:
        if qname not in self.queues:
            raise ValueError(
                f"unknown queue {qname!r}: this cluster's queues are {list(self.queues)} "
                "(declare it in run(..., queues=[...]))"
            )

    def _feed_plan(
        self, qname: str, train: bool, feed_timeout: float, *, feeding: bool = True, qname_out: str = "output"
    ) -> FeedPlan:
        if self.input_mode != InputMode.SPARK:
            raise ValueError(
                "cluster.train() and cluster.inference() need run(..., input_mode=InputMode.SPARK)"
            )
        st = self.driver.status(self.job)
        if feeding and st.state == JobState.FAILED:
            raise self._failure(st)
        targets = tuple(
            FeedTarget(
                f"{n.name} (executor {n.executor_id}, host {n.host})",
                str(n.meta[feedwire.FEED_META]),
                # The certificate the node registered over the job's TLS connection (feedtls).
                str(n.meta.get(feedtls.FEED_TLS_META) or ""),
            )
            for n in sorted(st.nodes, key=lambda n: n.executor_id)
            if n.role in feedwire.FEED_ROLES and n.meta.get(feedwire.FEED_META)
        )
        if not targets:
            raise ValueError(f"job {self.job} has no node that takes fed data (chief, master or worker)")
        if feeding and train:
            # Synchronous training needs every fed node's feeding task running at once; the
            # nodes themselves run in the background and hold no slot (inference nodes are
            # independent: one slot feeds them all in turn).
            held = 0 if self.node.background else self._executor_nodes
            feedwire.check_slots(_task_slots(self.sc), held, len(targets))
        # TLS exactly when the job's coordinator traffic is: a TLS job never feeds in plaintext.
        return FeedPlan(
            self.job,
            self.node.token,
            targets,
            qname,
            train,
            float(feed_timeout),
            qname_out,
            tls=self.node.tls is not None,
        )

    def _feeding(self) -> bool:
        """Whether a streaming job still takes data: not stopping, stopped, failed or done, and
        no stop requested by a node (``DataFeed.terminate()``)."""
        try:
            return not _stop_requested(self.driver.status(self.job))
        except TfcoordError:
            return False

    def train(
        self, dataRDD: Any, num_epochs: int = 0, feed_timeout: float = 600, qname: str = "input"
    ) -> None:
        """Feed every partition of ``dataRDD`` (an RDD, or a DStream) to the chief/master and workers.

        Partitions go to the nodes round-robin by partition index; each node reads them
        with ``ctx.get_data_feed()``. ``num_epochs=0`` means 10 epochs, as in
        TensorFlowOnSpark (its map functions usually stop on a step count and call
        ``terminate()``: that node's feeding tasks then skip the rest of their partitions,
        while the other nodes are fed on). Returns once every partition was consumed or
        skipped (an RDD), or at once for a DStream, whose micro-batches are fed as they come
        until a stop is requested (``tfcoord stop``, ``DataFeed.terminate()``); end a
        streaming job with ``shutdown(ssc)``.

        Raises:
            JobFailed: a node failed (the message carries its traceback).
            FeedError: feeding failed otherwise; FeedTimeout: a node took nothing from its
                queue for ``feed_timeout`` seconds (the message names the node and queue).
        """
        if num_epochs < 0:
            raise ValueError(f"num_epochs must be >= 0, not {num_epochs}")
        self._check_queue(qname)
        if hasattr(dataRDD, "foreachRDD"):  # a DStream: feed each micro-batch while the job runs

            def feed_batch(rdd: Any) -> None:
                if self._feeding():
                    self._train_rdd(rdd, feed_timeout, qname)

            dataRDD.foreachRDD(feed_batch)
            return
        num_epochs = num_epochs or DEFAULT_EPOCHS
        rdd = self.sc.union([dataRDD] * num_epochs) if num_epochs > 1 else dataRDD
        with self._failing("cluster.train()"):
            self._train_rdd(rdd, feed_timeout, qname)

    @contextlib.contextmanager
    def _failing(self, what: str) -> Iterator[None]:
        """An error out of ``what`` ends the job, so no node is left waiting for data that
        will never come (and the next ``run`` in this SparkContext finds every executor free)."""
        try:
            yield
        except BaseException as e:
            try:
                if not self.driver.status(self.job).terminal:
                    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
                    self.driver.stop(self.job, f"{what} raised {type(e).__name__}: {first}"[:1000])
            except TfcoordError:
                pass
            raise

    def _train_rdd(self, rdd: Any, feed_timeout: float, qname: str) -> None:
        plan = self._feed_plan(qname, True, feed_timeout)
        try:
            rdd.mapPartitionsWithIndex(train_partition(plan)).foreach(lambda _: None)
        except Exception as e:
            self._raise_feed_failure(e)
            return
        # Feeders of healthy nodes end quietly when told to stop, also when another node
        # failed or stalled (a retried feeder of the stalled node is told "stop" too): the
        # job's state and reason say which it was.
        st = self.driver.status(self.job)
        if st.state == JobState.FAILED:
            raise self._failure(st)
        if st.reason == FailureReason.FEED_TIMEOUT:
            raise self._feed_timeout(st)

    def inference(
        self, dataRDD: Any, feed_timeout: float = 600, qname: str = "input", qname_out: str = "output"
    ) -> Any:
        """An RDD of the nodes' results: exactly one per record of ``dataRDD``, in order within each partition.

        Lazy, like any RDD: the records are fed when an action (``collect``,
        ``saveAsTextFile``) runs. Each node reads them with
        ``ctx.get_data_feed(train_mode=False, qname_in=qname, qname_out=qname_out)`` and answers
        each batch with ``batch_results``: the results go to queue ``qname_out`` (TensorFlowOnSpark's
        ``output``), which the feeding tasks read; a node putting them on another queue gets an
        error that says so. Both names must be among ``run(..., queues=...)``.
        """
        self._check_queue(qname)
        self._check_queue(qname_out)
        with self._failing("cluster.inference()"):
            plan = self._feed_plan(qname, False, feed_timeout, qname_out=qname_out)
        return dataRDD.mapPartitionsWithIndex(inference_partition(plan))

    def _raise_feed_failure(self, e: Exception) -> None:
        """A feeding Spark job failed: raise the node's failure if that was the cause."""
        summary = _spark_summary(e)
        st: JobStatus | None = None
        try:
            # A node that failed reports it a moment after its feeders hear of it; one whose
            # consumer stalled stopped the job (reason feed_timeout) before answering them.
            st = watch_until(
                self.driver,
                self.job,
                lambda st: st.state not in FEEDING_STATES,
                timeout_s=FEED_FAILURE_SETTLE_S,
            )
        except TfcoordError:
            pass
        if st is not None and st.state == JobState.FAILED:
            raise self._failure(st) from e
        if st is not None and st.reason == FailureReason.FEED_TIMEOUT:
            raise self._feed_timeout(st) from e
        if st is not None and st.state in (JobState.STOPPING, JobState.STOPPED):
            cause = [ln for ln in summary.splitlines() if "Error" in ln or "Stopped" in ln] or [summary]
            log.info(
                "job %s is %s: feeding ended (%s)", self.job, st.state, printable(cause[-1].strip()[:300])
            )
            return
        if st is not None and st.state == JobState.SUCCEEDED:
            # Every node finished (each ended its feed with DataFeed.terminate(), or returned):
            # the partitions left were not wanted, as TensorFlowOnSpark's feeders skip them.
            log.info("job %s SUCCEEDED before every partition was fed; the rest was skipped", self.job)
            return
        raise feedwire.FeedError(
            printable(f"feeding job {self.job} failed: {summary}", keep=TRACEBACK)
        ) from e

    def _feed_timeout(self, st: JobStatus) -> feedwire.FeedTimeout:
        """The job was stopped by a node whose consumer stalled: its message names the node and queue."""
        return feedwire.FeedTimeout(
            printable(f"feeding job {self.job} failed: {st.stop_reason}", keep=TRACEBACK)
        )

    def _end_feed(self) -> None:
        """Tell every fed node the feed is over, so its ``should_stop()`` turns true."""
        try:
            plan = self._feed_plan("input", True, 600, feeding=False)
        except (ValueError, TfcoordError):
            return
        for target in plan.targets:
            try:
                control(plan, target, "eof")
            except feedwire.FeedError as e:  # the node has ended already
                log.debug("no end of feed for %s: %s", target.node, e)

    def _await_stop_request(self, timeout_s: float) -> None:
        """Block until the job stops taking data (a stop was requested, a node terminated its
        feed, or the job ended)."""
        watch_until(self.driver, self.job, _stop_requested, timeout_s=timeout_s)


#: Marks the log records that say how a job ended: ``tfcoord submit`` prints its own outcome.
OUTCOME = "tfcoord_outcome"


def _log_outcome(line: str) -> None:
    log.info("%s", printable(line), extra={OUTCOME: True})


def _stop_requested(st: JobStatus) -> bool:
    """A streaming job must stop: it is stopping or ended, or a node's ``DataFeed.terminate()``
    ran (TensorFlowOnSpark's ``request_stop``, which its feeding tasks send then)."""
    return st.state not in FEEDING_STATES or any(n.meta.get(feedwire.FEED_TERMINATED_META) for n in st.nodes)


def _tfos_node(n: Any) -> dict[str, Any]:
    """One node of ``cluster_info``: TensorFlowOnSpark's keys first, then the coordinator's."""
    url = n.tensorboard_url
    feed = n.meta.get(feedwire.FEED_META)
    feed_host, _, feed_port = str(feed or "").rpartition(":")
    return {
        "executor_id": n.executor_id,
        "host": n.host,
        "job_name": n.role,
        "task_index": n.index,
        "port": n.port,
        "tb_pid": int(n.meta.get(TENSORBOARD_PID_META, 0) or 0),
        "tb_port": int(url.rpartition(":")[2].split("/")[0]) if url else 0,
        "addr": (feed_host.strip("[]"), int(feed_port)) if feed else None,
        "authkey": None,
        **n.wire,
    }


def _spark_summary(e: BaseException) -> str:
    """The useful part of a Spark failure: the Python error inside the Java one, if any."""
    text = str(e)
    if "Traceback (most recent call last)" in text:
        tb = text[text.rindex("Traceback (most recent call last)") :]
        lines = [ln for ln in tb.splitlines() if ln.strip()]
        end = next((i for i, ln in enumerate(lines) if ln.startswith("\tat ")), len(lines))
        return "\n".join(lines[:end])[-4000:]
    first = text.strip().splitlines()
    return first[0][:500] if first else type(e).__name__


#: Executors register with the driver seconds after ``SparkContext()`` returns (a standalone
#: worker starts one JVM per executor: 5-15 s here, more on a busy cluster); until then
#: Spark counts only the task slots of those already registered, 0 at first. 30 s covers a
#: slow start; a cluster that really is too small is judged after at most this long.
EXECUTOR_WAIT_S = 30.0
#: How often the slot count is read again meanwhile: Spark tells Python of no executor
#: registration (a SparkListener would need Py4J's callback server), so this polls.
EXECUTOR_POLL_S = 0.5


def _task_slots(sc: Any) -> int:
    jsc = sc._jsc.sc()
    return int(jsc.maxNumConcurrentTasks(jsc.resourceProfileManager().defaultResourceProfile()))


def _expected_slots(sc: Any) -> int | None:
    """The task slots the configuration asks for, once every executor has registered;
    None when it does not say (then only the deadline ends the wait)."""
    slots = _configured_slots(sc)
    return slots.count if slots is not None else None


def _configured_slots(sc: Any, conf: Mapping[str, str] | None = None) -> capacity.Slots | None:
    """The task slots the configuration asks for (``conf``: the settings run() read already)."""
    settings = sparkconf.read_settings(sc) if conf is None else conf
    return capacity.configured_slots(settings.get, sc.master or "", len(os.sched_getaffinity(0)))


def await_task_slots(sc: Any, needed: int, wait_s: float = EXECUTOR_WAIT_S) -> int:
    """Spark's task slots once there are ``needed``, every configured executor has
    registered, or ``wait_s`` has passed, whichever comes first."""
    deadline = time.monotonic() + wait_s
    while True:
        slots = _task_slots(sc)
        expected = _expected_slots(sc)
        if slots >= needed or (expected is not None and slots >= expected) or time.monotonic() >= deadline:
            return slots
        time.sleep(EXECUTOR_POLL_S)


def executors_python(sc: Any, environ: Mapping[str, str] = os.environ) -> str | None:
    """On a local master, have the executors run this driver's Python unless told otherwise.

    PySpark starts its Python workers with ``PYSPARK_PYTHON``, else ``python3`` from PATH,
    whatever runs the driver. ``python my_job.py`` from a virtual environment with a
    ``local[N]`` master therefore starts its executors' Python outside that environment, and
    the first task fails deep in Spark with ``No module named 'tfcoord'`` (TensorFlowOnSpark
    fails the same way). Where the executors are this machine's processes (``local``,
    ``local[N]``, ``local-cluster[...]``) and ``PYSPARK_PYTHON`` is unset, they run the
    driver's own interpreter, as ``tfcoord submit`` and ``spark-submit --conf
    spark.pyspark.python`` would have them do. Other masters' executors are on other
    machines, where this interpreter's path means nothing; they are left alone. The switch
    is said in one warning line.

    Returns:
        The interpreter the executors were switched to, or None.
    """
    if not capacity.executors_on_this_machine(str(getattr(sc, "master", ""))) or environ.get(
        "PYSPARK_PYTHON"
    ):
        return None
    current = getattr(sc, "pythonExec", None)
    found = shutil.which(current) if current else None
    if found and os.path.dirname(os.path.abspath(found)) == os.path.dirname(os.path.abspath(sys.executable)):
        return None  # the driver's own environment (its bin/python3 beside its bin/python)
    sc.pythonExec = sys.executable  # read for every Python function Spark runs from now on
    log.warning(
        "the executors of this local Spark run this driver's Python (%s): PYSPARK_PYTHON is unset, "
        "and the python3 Spark would start is another environment, which may lack tfcoord and "
        "TensorFlow; set PYSPARK_PYTHON to choose the executors' Python",
        sys.executable,
    )
    return sys.executable


def parallel(
    sc: Any,
    map_fun: Any,
    tf_args: Any,
    num_executors: int,
    use_barrier: bool = True,
    *,
    executor_setup: Callable[[], None] | None = None,
) -> None:
    """Run ``map_fun(tf_args, ctx)`` as ``num_executors`` independent single-node jobs.

    With ``use_barrier`` every task starts together (Spark barrier mode), which needs
    as many free task slots as ``num_executors``; that is checked up front, once the
    application's executors have registered (up to :data:`EXECUTOR_WAIT_S`).

    Raises:
        ValueError: barrier mode with fewer task slots than ``num_executors``.
        ParallelTaskFailed: a ``map_fun`` raised (the message names the task and host and
            carries its traceback).
    """
    executors_python(sc)
    if use_barrier:
        slots = await_task_slots(sc, num_executors)
        if slots < num_executors:
            raise ValueError(
                f"barrier mode needs {num_executors} task slots at once but the cluster has {slots}; "
                "add executors or cores, lower num_executors, or pass use_barrier=False"
            )
    default_fs = _default_fs(sc)
    working_dir = os.getcwd()

    one = ParallelTask(map_fun, tf_args, num_executors, default_fs, working_dir, setup=executor_setup)
    rdd = sc.parallelize(range(num_executors), num_executors)
    try:
        (rdd.barrier() if use_barrier else rdd).mapPartitions(one).collect()
    except Exception as e:
        # Spark's error is a Java stack trace around the task's Python one; say which task
        # failed and show its traceback.
        text = str(e)
        tasks = _PARALLEL_FAILURE.findall(text)
        head = tasks[-1] if tasks else "a parallel() task failed"
        raise ParallelTaskFailed(f"{head}\n{_spark_summary(e)}") from e


_PARALLEL_FAILURE = re.compile(r"parallel task \d+ of \d+ \([^\n]*\) failed:")


class _Started:
    """What ``run`` started in this process: how many clusters, and the newest.

    ``tfcoord submit`` runs a script as ``__main__``; this tells it whether the script's
    own main block ran a job (as one written for ``spark-submit`` does), and which.
    """

    count = 0
    last: SparkCluster | None = None


def submit_script(
    master: str,
    script: str,
    argv: list[str],
    *,
    num_executors: int,
    num_ps: int = 0,
    tensorboard: bool = False,
    log_dir: str | None = None,
    conf: dict[str, str] | None = None,
    executor_cores: int = 1,
    executor_memory: str = "1g",
    reservation_timeout: float = 600,
    max_restarts: int = 0,
    restart_on: RestartOn = RestartOn.EXIT_CODE,
    restart_backoff_s: float = 1.0,
    deadline_s: float = 0.0,
    master_node: str | None = None,
    eval_node: bool = False,
    name: str = "",
    emit: Any = print,
    coordinator: str | None = None,
    secret: bytes | None = None,
    tls: TlsFiles | None = None,
    role_resources: Mapping[str, resources.Resources] | None = None,
    options: SubmitOptions | None = None,
) -> JobStatus | None:
    """What ``tfcoord submit --engine spark`` does: a Spark application running ``script``.

    The script runs as ``__main__`` with ``argv``, the way ``spark-submit`` runs it: a
    SparkContext it creates gets the master and settings given here. When its main block
    ran no job itself, its ``main_fun(args, ctx)`` runs on ``num_executors`` nodes.
    ``master="local-standalone"`` starts a Spark standalone master and worker on this
    machine for the job's lifetime. ``role_resources`` reaches ``run`` -- the script's own
    ``TFCluster.run`` too -- as ``spark.tfcoord.resources.*`` settings, checked against the master
    and settings before Spark starts. ``options``: spark-submit's flags passed through
    (``--py-files`` also go on this process's ``sys.path``, where spark-submit puts them for
    the driver). Returns the job's final status (None when the script ended with
    ``sys.exit(0)`` before any job); emits progress lines.

    Raises:
        FileNotFoundError: no such script.
        ScriptFailed: the script does not compile, or raised (its own traceback).
        AttributeError: it defines no ``main_fun`` and ran no job.
        ResourcesError: ``role_resources`` that this master and these settings cannot honour.
        Interrupted: Ctrl-C while the job ran; the job was stopped first.
    """
    import sys
    from pathlib import Path

    from .script import compile_script, run_as_main
    from .standalone import LocalSparkCluster, machine_cores, machine_mib

    file, code = compile_script(script)  # a syntax error, before Spark takes seconds to start
    settings = {
        "spark.executor.cores": str(executor_cores),
        "spark.cores.max": str(num_executors * executor_cores),
        "spark.executor.memory": executor_memory,
        # One TensorFlow node per executor: Spark must not grow or shrink the cluster.
        "spark.dynamicAllocation.enabled": "false",
        # tfcoord prints the job's progress; Spark's console bar would garble it.
        "spark.ui.showConsoleProgress": "false",
        # The restart policy reaches run() -- the script's own TFCluster.run too -- as settings.
        MAX_RESTARTS_CONF: str(max_restarts),
        RESTART_ON_CONF: RestartOn(restart_on).value,
        RESTART_BACKOFF_CONF: str(restart_backoff_s),
        DEADLINE_CONF: str(deadline_s),
        **resources.to_conf(role_resources or {}),
        **(conf or {}),
    }
    if role_resources:  # refused here, before a Spark master or application starts
        import pyspark

        where = "spark://local-standalone" if master == "local-standalone" else master
        resources.check_spark(role_resources, where, pyspark.__version__, settings)
    local = None
    if master == "local-standalone":
        # Sized by what the application will ask for: the flags, or --conf over them.
        each_cores, each_memory = settings["spark.executor.cores"], settings["spark.executor.memory"]
        executors = capacity.executors_asked(settings["spark.cores.max"], each_cores)
        cores, mib = capacity.local_standalone_size(
            executors, int(each_cores), each_memory, machine_cores(), machine_mib()
        )
        emit(
            f"starting a local Spark standalone cluster ({executors} executors x {each_cores} "
            f"core(s), {each_memory} each)"
        )
        local = LocalSparkCluster(cores=cores, memory_mb=mib).start()
        os.environ.update(LocalSparkCluster.env())
        master = local.master_url
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark import SparkConf, SparkContext

    app_name = name or f"tfcoord {Path(script).name}"
    options = options or SubmitOptions()
    os.environ["PYSPARK_SUBMIT_ARGS"] = submit_args(master, app_name, options, settings)
    for py_file in reversed(options.py_files):  # importable by the script, as under spark-submit
        if "://" not in py_file:
            entry = Path(py_file).resolve()
            sys.path.insert(0, str(entry.parent if entry.suffix == ".py" else entry))
    logging.getLogger("py4j").setLevel(logging.WARNING)  # one INFO line per gateway call otherwise
    handler = _ProgressHandler(emit)
    log.addHandler(handler)
    propagate, log.propagate = log.propagate, False  # shown once, through emit
    sc = None
    try:
        started = _Started.count
        module, exited = run_as_main(file, code, argv, passthrough=(JobFailed,))
        if _Started.count > started and _Started.last is not None:
            cluster = _Started.last  # the script's own main block ran its job
            status = cluster.status or cluster.shutdown()
            emit(f"job {status.job} {status.state}")
            _emit_results(status, emit)
            return status
        if exited:
            return None
        main_fun = getattr(module, "main_fun", None)
        if not callable(main_fun):
            raise AttributeError(
                f"{script} defines no main_fun(args, ctx) and its __main__ block started no job: define "
                "main_fun, or call tfcoord.driver.spark.run(sc, ...) (TFCluster.run) in the script"
            )
        sc_conf = SparkConf().setMaster(master).setAppName(app_name)
        for key, value in settings.items():
            sc_conf.set(key, value)
        sc = SparkContext.getOrCreate(sc_conf)
        sc.setLogLevel("ERROR")
        emit(f"Spark application {sc.applicationId} on {master}")
        cluster = run(
            sc,
            main_fun,
            argv,
            num_executors,
            num_ps,
            tensorboard=tensorboard,
            log_dir=log_dir,
            reservation_timeout=reservation_timeout,
            master_node=master_node,
            eval_node=eval_node,
            coordinator=coordinator,
            secret=secret,
            name=name,
            tls=tls,
        )
        if tensorboard:
            emit(f"TensorBoard: {cluster.tensorboard_url() or 'did not start (is tensorboard installed?)'}")
        cluster.follow(emit)  # "running", then each node's end; the outcome comes from shutdown
        try:
            status = cluster.shutdown()
        except JobFailed as e:
            emit(str(e))
            return e.status
        if status.state != JobState.SUCCEEDED:  # STOPPED (tfcoord stop): say so, and why
            emit(f"job {status.job} {status.state}: {status.stop_reason or status.error}")
            return status
        emit(f"job {status.job} {status.state}")
        _emit_results(status, emit)
        return status
    except JobFailed as e:
        emit(str(e))
        return e.status
    finally:
        log.removeHandler(handler)
        log.propagate = propagate
        active = SparkContext._active_spark_context or sc  # the script's own, if it left one running
        if active is not None:
            active.stop()
        if local is not None:
            local.stop()


def _emit_results(status: JobStatus, emit: Any) -> None:
    for n in status.nodes:
        if n.results:
            emit(printable(f"  {n.name} on {n.host}: " + " ".join(f"{k}={v}" for k, v in n.results.items())))


class _ProgressHandler(logging.Handler):
    """Forward the driver's progress lines (registered x/N, ...) to the caller's emitter."""

    def __init__(self, emit: Any) -> None:
        super().__init__(logging.INFO)
        self._emit = emit

    def emit(self, record: logging.LogRecord) -> None:
        if not getattr(record, OUTCOME, False):  # submit says how the job ended, with its results
            self._emit(record.getMessage())
