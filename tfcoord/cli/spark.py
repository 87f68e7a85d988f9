"""``tfcoord submit --engine spark``: a script's ``main_fun`` on Spark executors, one node per executor."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from tfcoord.cli.connection import client_config, connect
from tfcoord.cli.errors import UserScriptError
from tfcoord.cli.jobflags import is_python, parse_role_resources, restart_policy
from tfcoord.cli.outcome import emit, job_exit, print_final
from tfcoord.client import JobSpec, TfcoordError, Unreachable
from tfcoord.client.entry import (
    ADDRESS_ENV,
    SECRET_FILE_ENV,
    TLS_CA_ENV,
    TLS_CERT_ENV,
    TLS_KEY_ENV,
    UsageError,
)
from tfcoord.driver.sparksubmit import SubmitOptions


def _spark_script(command: list[str]) -> tuple[str, list[str]]:
    """The script and its arguments from ``-- [python] script.py ARGS``: the shape both engines take."""
    if is_python(command[0]):
        command = command[1:]
    if not command or not command[0].endswith(".py"):
        raise UsageError(
            "with --engine spark give the Python script after --: -- train.py [ARGS] "
            "(or -- python train.py [ARGS])"
        )
    return command[0], command[1:]


def submit_spark(args: argparse.Namespace, command: list[str]) -> int:
    """Run ``main_fun(argv, ctx)`` from a script on Spark executors, one node per executor."""
    script, argv = _spark_script(command)
    options = _spark_options(args)
    role_resources = parse_role_resources(args)
    if not Path(script).is_file():
        raise UsageError(f"no script at {script}: give the path of your training script after --")
    if args.address or os.environ.get(ADDRESS_ENV):
        cfg = client_config(args)
        # Dialled now, before Spark takes seconds to start: a wrong address, port or secret
        # is one line at once (it was reported only once Spark was up, after 30 s).
        connect(cfg, args).close()
        os.environ.setdefault(SECRET_FILE_ENV, args.secret_file or os.environ.get(SECRET_FILE_ENV, ""))
        coordinator, secret = cfg.address, cfg.secret
    else:
        coordinator, secret = None, None
        logging.getLogger("tfcoord.coordinator").setLevel(max(logging.WARNING, logging.getLogger().level))
    from tfcoord import aliases
    from tfcoord.driver.script import ScriptFailed
    from tfcoord.driver.spark import submit_script
    from tfcoord.node.tlsfiles import TlsFiles

    # TensorFlowOnSpark's scripts import `tensorflowonspark`: tfcoord's, unless a real one is installed.
    aliases.install()
    emit(aliases.describe("tensorflowonspark"))

    # The nodes reach a TLS coordinator as we do: the same files (checked above by
    # client_config), by path, read by each node when it starts.
    ca, cert, key = (os.environ.get(k) or None for k in (TLS_CA_ENV, TLS_CERT_ENV, TLS_KEY_ENV))
    tls = TlsFiles.of(ca, cert, key) if coordinator and (ca or cert or key) else None

    try:
        status = submit_script(
            args.master,
            script,
            argv,
            num_executors=args.num_executors,
            num_ps=args.ps,
            tensorboard=args.tensorboard,
            log_dir=args.log_dir,
            conf=dict(options.conf),
            options=options,
            executor_cores=args.executor_cores,
            executor_memory=args.executor_memory,
            reservation_timeout=args.reservation_timeout,
            **restart_policy(args),
            master_node="chief" if args.chief else None,
            eval_node=args.evaluator,
            name=args.name,
            emit=emit,
            coordinator=coordinator,
            secret=secret,
            tls=tls,
            role_resources=role_resources,
        )
    except ScriptFailed as e:
        raise UserScriptError(e.traceback_text, str(e)) from None
    except (FileNotFoundError, AttributeError) as e:
        raise UsageError(str(e)) from None
    except ValueError as e:  # run()'s arguments, as the script gave them: the cluster's shape
        raise UsageError(str(e)) from None
    print_final(args, status)
    return 0 if status is None else job_exit(status)


def _spark_options(args: argparse.Namespace) -> SubmitOptions:
    """Every flag of ``submit --engine spark``, checked before Spark starts (a mistake is one
    line in milliseconds, not a Java stack trace after seconds): the cluster's shape, the
    restart policy, spark-submit's flags (:meth:`SubmitOptions.of`), the master URL, and that
    a standalone master answers."""
    from tfcoord.driver.spark import cluster_roles
    from tfcoord.driver.sparksubmit import (
        LOCAL_STANDALONE,
        MasterUnreachable,
        SubmitError,
        check_master,
        check_master_reachable,
    )

    if args.num_executors is None:
        raise UsageError("--engine spark needs --num-executors N (the TensorFlow cluster's size)")
    if args.executor_cores < 1:
        raise UsageError(f"--executor-cores must be at least 1, not {args.executor_cores}")
    try:
        roles = cluster_roles(args.num_executors, args.ps, "chief" if args.chief else None, args.evaluator)
        # The restart policy and timeouts as the job will carry them.
        JobSpec(
            roles=roles,
            reservation_timeout_s=args.reservation_timeout,
            engine="spark",
            **restart_policy(args),
        )
    except (ValueError, TfcoordError) as e:
        raise UsageError(
            str(e).replace("num_executors", "--num-executors").replace("num_ps", "--num-ps")
        ) from None
    try:
        options = SubmitOptions.of(
            deploy_mode=args.deploy_mode,
            executor_memory=args.executor_memory,
            driver_memory=args.driver_memory,
            conf=args.conf,
            py_files=args.py_files,
            files=args.files,
            archives=args.archives,
        )
        check_master(args.master)
        if args.master != LOCAL_STANDALONE:
            check_master_reachable(args.master)
    except MasterUnreachable as e:
        raise Unreachable(str(e)) from None
    except SubmitError as e:
        raise UsageError(str(e)) from None
    return options
