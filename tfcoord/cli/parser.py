"""The argparse tree of every command, with its global flags; and ``tfcoord completion``."""

from __future__ import annotations

import argparse
import os
from typing import Any

from tfcoord.cli.connection import DEFAULT_TIMEOUT_S
from tfcoord.cli.credentials import ADMIN_SECRET_FILE_ENV, ADMIN_SUFFIX
from tfcoord.cli.env_check import cmd_env_check
from tfcoord.cli.envflags import env_flags
from tfcoord.cli.logs import cmd_logs
from tfcoord.cli.serve import cmd_serve
from tfcoord.cli.status import cmd_status
from tfcoord.cli.stop import cmd_stop
from tfcoord.cli.submit import cmd_submit
from tfcoord.client import __version__
from tfcoord.client.entry import ADDRESS_ENV, LOG_LEVELS, SECRET_FILE_ENV, UsageError
from tfcoord.client.vocab import RestartOn
from tfcoord.coordinator.state import KEEP_FINISHED_JOBS, KEEP_FINISHED_S
from tfcoord.driver.sparksubmit import DEPLOY_MODES
from tfcoord.node import main as node_main


class _Parser(argparse.ArgumentParser):
    """argparse, with a mistake reported as one line (argparse prints the usage too)."""

    def error(self, message: str) -> Any:
        raise UsageError(f"{message}; see `{self.prog} --help`")


def build_parser(env: Any = None) -> argparse.ArgumentParser:
    """The parser. Global flags (``--log-level``, ``--log-format``, ``--debug``) go before or
    after the command's name; each ``serve`` flag also reads ``TFCOORD_<FLAG>`` (see :func:`env_flags`)."""
    env = os.environ if env is None else env
    p = _Parser(prog="tfcoord", description="Coordinator for distributed TensorFlow.")
    p.add_argument("--version", action="version", version=f"tfcoord {__version__}")
    p.add_argument("--json", action="store_true", help="machine-readable output (see each command's --help)")
    _global_flags(p, env)
    common = _Parser(add_help=False)
    _global_flags(common, env, suppress=True)
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND", parser_class=_Parser)

    def command(name: str, help: str, *, json_help: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help, parents=[common], description=help)
        sp.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=json_help)
        return sp

    def client_flags(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--address", help=f"coordinator HOST:PORT (default: ${ADDRESS_ENV})")
        sp.add_argument(
            "--secret-file", help=f"file holding the coordinator secret (default: ${SECRET_FILE_ENV})"
        )
        sp.add_argument(
            "--timeout",
            type=_positive,
            default=DEFAULT_TIMEOUT_S,
            metavar="S",
            help="give up on the coordinator after S seconds (connecting, and each request); "
            f"a refused connection or an unknown host fails at once (default {DEFAULT_TIMEOUT_S:g})",
        )

    sp = command("serve", "run the coordinator", json_help="log JSON lines (as --log-format json)")
    sp.add_argument("--host", default="127.0.0.1")
    sp.add_argument("--port", type=_port, default=7070, help="TCP port; 0 picks a free one (see --port-file)")
    sp.add_argument("--port-file", help="write the bound port here once listening")
    sp.add_argument("--secret-file", help="coordinator secret (created, mode 600, if missing)")
    sp.add_argument(
        "--admin-secret-file",
        help="admin credential, for tfcoord status/stop and operators "
        f"(created, mode 600, if missing; default: the secret file's name + {ADMIN_SUFFIX})",
    )
    sp.add_argument("--state-dir", help="journal directory; without it state lives in memory only")
    sp.add_argument("--http-host", default="127.0.0.1", help="interface of the HTTP API and dashboard")
    sp.add_argument(
        "--http-port",
        type=_port,
        help="HTTP API and dashboard port; 0 picks a free one; without it no HTTP server runs",
    )
    sp.add_argument("--http-port-file", help="write the bound HTTP port here once listening")
    sp.add_argument(
        "--http-token-file",
        help="bearer token for the HTTP API and dashboard "
        "(created, mode 600, if missing; separate from the coordinator secret)",
    )
    sp.add_argument(
        "--http-admin-token-file",
        help="a second HTTP bearer token that may also stop jobs (the dashboard's stop button); "
        "created, mode 600, if missing; without it no one stops jobs over HTTP",
    )
    sp.add_argument(
        "--max-connections",
        type=int,
        metavar="N",
        help="authenticated connections (nodes, drivers) at once (default: 20000, or what "
        "RLIMIT_NOFILE leaves; a number that does not fit is refused)",
    )
    sp.add_argument(
        "--max-unauthenticated",
        type=int,
        default=4096,
        metavar="N",
        help="connections still in their handshake at once, a budget apart from nodes'",
    )
    sp.add_argument(
        "--max-unauthenticated-per-source",
        type=int,
        metavar="N",
        help="of those, from one source address (default: a quarter of --max-unauthenticated, so one "
        "host cannot take the whole budget; raise it where one host starts thousands of nodes at once)",
    )
    sp.add_argument(
        "--http-max-connections",
        type=int,
        default=256,
        metavar="N",
        help="HTTP API connections at once (beyond: 503)",
    )
    sp.add_argument("--tls-cert", help="serve TLS (TCP protocol and HTTP API) with this PEM certificate")
    sp.add_argument("--tls-key", help="the certificate's PEM private key (mode 600)")
    sp.add_argument("--tls-ca", help="mutual TLS: clients must present a certificate signed by this CA")
    sp.add_argument(
        "--plaintext",
        action="store_true",
        help="serve without TLS (logged as a warning); without it, --tls-cert and --tls-key are required",
    )
    sp.add_argument(
        "--mesos-master",
        help="run the Mesos framework against these masters, host:port[,host:port], or the leader "
        "ZooKeeper names, zk://host:2181[,host:2181]/mesos (default: $MESOS_MASTER; neither: no Mesos)",
    )
    sp.add_argument(
        "--advertise-host", help="address Mesos tasks dial back to (default: --host, or this host's name)"
    )
    sp.add_argument(
        "--keep-finished-jobs",
        type=int,
        default=KEEP_FINISHED_JOBS,
        metavar="N",
        help="finished jobs to keep (status, HTTP API, journal); older ones are forgotten, "
        f"each after at least 5 minutes (default {KEEP_FINISHED_JOBS})",
    )
    sp.add_argument(
        "--keep-finished-days",
        type=float,
        default=KEEP_FINISHED_S / 86400,
        metavar="D",
        help=f"forget finished jobs this many days after they ended (default {KEEP_FINISHED_S / 86400:g})",
    )
    env_flags(sp, env, skip={"--mesos-master"})  # MESOS_MASTER keeps tfmesos2's name
    sp.set_defaults(fn=cmd_serve)

    sp = command(
        "env-check",
        "check this machine for Spark/Mesos/TensorFlow work: OK, WARN, FAIL",
        json_help="the report as a JSON list",
    )
    client_flags(sp)
    sp.set_defaults(fn=cmd_env_check)

    def admin_flag(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--admin-secret-file",
            help=f"the coordinator's admin credential (default: "
            f"${ADMIN_SECRET_FILE_ENV}, else the secret file's name + {ADMIN_SUFFIX})",
        )

    sp = command(
        "status",
        "show jobs, or one job's nodes, results and timeline",
        json_help="the coordinator's full answer as JSON",
    )
    client_flags(sp)
    admin_flag(sp)
    sp.add_argument("job", nargs="?")
    sp.add_argument(
        "--follow",
        "-f",
        action="store_true",
        help="print each change of JOB (summary, timeline) until it ends; --json: a status a line",
    )
    sp.set_defaults(fn=cmd_status)

    sp = command(
        "logs",
        "show the output (stdout and stderr) of a job's nodes",
        json_help="one JSON object a line: time, node, stream, text",
    )
    client_flags(sp)
    admin_flag(sp)
    sp.add_argument("job")
    sp.add_argument("--node", metavar="ROLE:I", help="one node's output only (e.g. worker:1)")
    sp.add_argument("--follow", "-f", action="store_true", help="keep printing new lines until the job ends")
    sp.set_defaults(fn=cmd_logs)

    sp = command("stop", "stop a job gracefully (streaming jobs)", json_help="the answer as JSON")
    client_flags(sp)
    admin_flag(sp)
    sp.add_argument("job")
    sp.add_argument("--dry-run", action="store_true", help="show what would be stopped, change nothing")
    sp.add_argument("--reason", default="stop requested with tfcoord stop")
    sp.set_defaults(fn=cmd_stop)

    sp = command(
        "submit",
        "submit a job and follow it to its end",
        json_help="print the job's final status as JSON on stdout (progress and output on stderr)",
    )
    client_flags(sp)
    sp.add_argument("--engine", choices=("local", "spark", "mesos"), default="local")
    sp.add_argument("--workers", type=int, default=1, help="local: worker processes")
    sp.add_argument("--ps", "--num-ps", type=int, default=0)
    spark = sp.add_argument_group("spark engine")
    spark.add_argument(
        "--master",
        default="local-standalone",
        help="Spark master URL; local-standalone starts a master and worker here for the job",
    )
    spark.add_argument("--num-executors", type=int, help="TensorFlow nodes, one per Spark executor")
    spark.add_argument("--tensorboard", action="store_true", help="run TensorBoard beside the chief")
    spark.add_argument("--log-dir", help="TensorBoard log directory")
    spark.add_argument("--executor-cores", type=int, default=1)
    spark.add_argument(
        "--executor-memory", default="1g", help="each executor's memory, e.g. 4g (spark-submit's)"
    )
    spark.add_argument(
        "--driver-memory", metavar="SIZE", help="this driver's memory, e.g. 2g (spark-submit's)"
    )
    spark.add_argument(
        "--conf", action="append", default=[], metavar="KEY=VALUE", help="a Spark setting; repeat for more"
    )
    for flag, what in (
        ("--py-files", "Python files (.py, .zip, .egg) for the executors, and this driver's sys.path"),
        ("--files", "files placed in each executor's working directory (SparkFiles.get(NAME))"),
        (
            "--archives",
            "archives unpacked in each executor's working directory (ARCHIVE#NAME names the directory)",
        ),
    ):
        spark.add_argument(
            flag, action="append", default=[], metavar="PATH[,PATH]", help=f"{what}; as spark-submit's"
        )
    spark.add_argument(
        "--deploy-mode",
        choices=DEPLOY_MODES,
        default="client",
        help="client (tfcoord submit is the driver); cluster is refused, with why",
    )
    mesos = sp.add_argument_group("mesos engine")
    mesos.add_argument(
        "--job",
        action="append",
        default=[],
        metavar="ROLE:N[:cpus=C,mem=MB,gpus=G]",
        help="one role of the cluster and what each of its tasks needs; repeat per role",
    )
    mesos.add_argument("--image", help="task image (default: $DOCKER_IMAGE, else tfcoord-task:VERSION)")
    mesos.add_argument(
        "--mesos-master",
        help="Mesos masters host:port[,host:port], or zk://host:2181[,host:2181]/mesos (default: $MESOS_MASTER)",
    )
    mesos.add_argument(
        "--advertise-host", help="address Mesos tasks dial back to (default: this host's name, resolved)"
    )
    # What one engine alone reads: another engine would ignore it, so it is refused there.
    sp.set_defaults(engine_only={"spark": tuple(spark._group_actions), "mesos": tuple(mesos._group_actions)})
    sp.add_argument(
        "--plaintext",
        action="store_true",
        help="local and mesos engines, embedded coordinator: serve without TLS (logged as a warning); "
        "by default it serves TLS with a certificate of its own that its nodes pin",
    )
    sp.add_argument(
        "--role-resources",
        action="append",
        default=[],
        metavar="ROLE:cpus=N,gpus=N,memory=SIZE",
        help="what each task of a role needs; repeat per role (docs/src/resources.md). spark: the role "
        "runs as its own Spark job with a ResourceProfile; mesos: offers sized per role (with --ps, "
        "--workers); local: node processes pinned to that many CPUs",
    )
    sp.add_argument("--chief", action="store_true", help="add a chief task")
    sp.add_argument("--evaluator", action="store_true", help="add an evaluator task")
    sp.add_argument("--name", default="")
    sp.add_argument("--reservation-timeout", type=float, default=600.0)
    restarts = sp.add_argument_group(
        "restarts", "a job that outlives its nodes (docs/src/fault-tolerance.md)"
    )
    restarts.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        metavar="N",
        help="restart the whole cluster from its last checkpoint up to N times when a node is lost "
        "or killed by a signal (default 0: the first failure ends the job)",
    )
    restarts.add_argument(
        "--restart-on",
        choices=[r.value for r in RestartOn],
        default=RestartOn.EXIT_CODE.value,
        help="exit-code: lost nodes and processes ended by a signal restart, a Python exception or "
        "exit code 1-127 is permanent (TFJob's ExitCode policy); any-failure: every failure restarts",
    )
    restarts.add_argument(
        "--restart-backoff",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="each node waits this long before it rejoins the restarted cluster (default 1)",
    )
    restarts.add_argument(
        "--deadline",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="fail the job once it has run this long, restarts included (default: no deadline)",
    )
    sp.add_argument(
        "--no-wait",
        action="store_true",
        help="print the job id once submitted and exit 0 (mesos engine with a running coordinator)",
    )
    sp.add_argument("command", nargs=argparse.REMAINDER)
    sp.set_defaults(fn=cmd_submit)

    sp = sub.add_parser(
        "node", help="run one node (used by engines; token in TFCOORD_TOKEN)", parents=[common]
    )
    node_main.add_arguments(sp)
    sp.set_defaults(fn=node_main.cmd_node)

    sp = sub.add_parser(
        "completion",
        help='print a shell completion script: eval "$(tfcoord completion bash)"',
        parents=[common],
    )
    sp.add_argument("shell", choices=("bash", "zsh"))
    sp.set_defaults(fn=lambda args: cmd_completion(args, p))
    return p


def _global_flags(p: argparse.ArgumentParser, env: Any, *, suppress: bool = False) -> None:
    """The flags every command takes. After the command's name they are SUPPRESSed, so a
    flag given before the name is not reset by the command's parser."""

    def default(value: Any) -> Any:
        return argparse.SUPPRESS if suppress else value

    p.add_argument(
        "--log-level",
        type=str.upper,
        choices=LOG_LEVELS,
        metavar="LEVEL",
        default=default(env.get("TFCOORD_LOG_LEVEL", "INFO").upper()),
        help=f"{', '.join(LOG_LEVELS)} (any case; default $TFCOORD_LOG_LEVEL or INFO)",
    )
    p.add_argument(
        "--log-format",
        choices=("text", "json"),
        default=default(env.get("TFCOORD_LOG_FORMAT", "text")),
        help="log lines as text or JSON (default $TFCOORD_LOG_FORMAT or text)",
    )
    p.add_argument(
        "--debug",
        action="store_true",
        default=default(False),
        help="show the traceback of an internal error (a tfcoord bug; please report it)",
    )


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a TCP port: use 1-65535, or 0 for a free one")
    return value


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} must be above 0 seconds")
    return value


def cmd_completion(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from tfcoord.completion import script

    print(script(parser, args.shell))
    return 0
