"""``tfcoord submit``: checks the flags, then runs the job on its engine (local here; spark and
mesos in their modules) and follows it to its end."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from pathlib import Path

from tfcoord.cli.connection import ClientConfig, client_config, connect
from tfcoord.cli.jobflags import is_python, job_command, parse_role_resources, restart_policy
from tfcoord.cli.mesos import submit_mesos
from tfcoord.cli.outcome import emit, job_exit, print_final
from tfcoord.cli.spark import submit_spark
from tfcoord.client import JobSpec, TfcoordError, connfile, make_roles
from tfcoord.client.entry import ADDRESS_ENV, TLS_CA_ENV, TLS_CERT_ENV, TLS_KEY_ENV, UsageError
from tfcoord.driver.session import CoordinatorLink


def _local_command(command: list[str]) -> list[str]:
    """The command each local node runs; a script alone runs with this Python. A program
    that is not there is named now, not as each node's failure."""
    import shutil

    prog = command[0]
    if prog.endswith(".py"):
        command = [sys.executable, *command]
        prog = sys.executable
    found = shutil.which(prog)
    if found is None:
        where = "is not an executable file" if os.sep in prog else "is not on PATH"
        raise UsageError(
            f"{prog!r} {where}: give the command every node runs after --, e.g. -- python train.py"
        )
    if is_python(prog) and len(command) > 1 and command[1].endswith(".py") and not Path(command[1]).is_file():
        raise UsageError(f"no script at {command[1]}: give the path of your training script after --")
    return command


def _check_engine_flags(args: argparse.Namespace) -> None:
    """Refuse a flag of another engine than ``--engine``'s: it would be accepted and ignored."""
    given = {
        engine: [a.option_strings[0] for a in actions if getattr(args, a.dest) != a.default]
        for engine, actions in args.engine_only.items()
        if engine != args.engine
    }
    if args.engine == "spark" and args.workers != 1:
        given.setdefault("local and mesos", []).append("--workers")
    for engine, flags in given.items():
        if flags:
            raise UsageError(
                f"{', '.join(flags)}: for --engine {engine} only, and this job runs on --engine "
                f"{args.engine}, which would ignore {'it' if len(flags) == 1 else 'them'}: drop "
                f"{'it' if len(flags) == 1 else 'them'}, or pass the engine"
                + (" (under Spark the cluster's size is --num-executors)" if "--workers" in flags else "")
                + (
                    " (--master is the Spark master: the Mesos master is --mesos-master HOST:5050)"
                    if args.engine == "mesos" and "--master" in flags
                    else ""
                )
            )


def cmd_submit(args: argparse.Namespace) -> int:
    from tfcoord.driver.local import run_local

    _check_engine_flags(args)
    if args.no_wait and (args.engine != "mesos" or not (args.address or os.environ.get(ADDRESS_ENV))):
        where = (
            "its nodes are processes of this command"
            if args.engine == "local"
            else "this command is the Spark driver"
            if args.engine == "spark"
            else "an embedded coordinator ends with this command"
        )
        raise UsageError(
            f"--no-wait needs --engine mesos and a running coordinator (--address or {ADDRESS_ENV}): "
            f"{where}; run it in the background instead (nohup tfcoord submit ... &) and follow "
            "it with tfcoord status JOB"
        )
    if args.engine == "mesos":
        return submit_mesos(args)
    command = job_command(args)
    if args.engine == "spark":
        return submit_spark(args, command)
    command = _local_command(command)
    if args.workers < 0 or args.ps < 0 or (args.workers == 0 and not args.chief):
        raise UsageError(
            f"--workers {args.workers} --ps {args.ps}: a local job needs at least one worker "
            "(or --chief) and no negative count; e.g. --workers 2"
        )
    role_resources = parse_role_resources(args)
    try:
        roles = make_roles(
            args.workers, args.ps, chief="chief" if args.chief else None, evaluator=args.evaluator
        )
        if role_resources:
            from tfcoord.driver.resources import check_roles

            check_roles(role_resources, roles)
        from tfcoord.driver.capacity import local_nodes_fit
        from tfcoord.driver.standalone import machine_mib

        local_nodes_fit(sum(count for _, count in roles), machine_mib())
        spec = JobSpec(
            roles=roles,
            reservation_timeout_s=args.reservation_timeout,
            name=args.name,
            engine="local",
            **restart_policy(args),
        )
    except (ValueError, TfcoordError) as e:
        raise UsageError(str(e)) from None
    if args.address or os.environ.get(ADDRESS_ENV):
        cfg = client_config(args)
        link = CoordinatorLink(cfg.address, cfg.secret, cfg.ssl_context)
    else:
        # The connection file and run records: tfcoord status/logs/stop from another shell, and
        # status/logs after this driver has ended.
        link = CoordinatorLink.start_embedded(
            quiet=True, plaintext=args.plaintext, connection_dir=connfile.runtime_dir(os.environ)
        )  # which warns for plaintext
    node_env = None
    with link, contextlib.ExitStack() as cleanup:
        if link.ca_pem:
            # The nodes (tfcoord node, TFCOORD_TLS_CA) pin the embedded coordinator's own CA:
            # a public certificate, written where only they look, removed with the job.
            ca_dir = cleanup.enter_context(tempfile.TemporaryDirectory(prefix="tfcoord-ca-"))
            ca_file = Path(ca_dir, "ca.pem")
            ca_file.write_text(link.ca_pem)
            node_env = dict(os.environ, **{TLS_CA_ENV: str(ca_file)})
            node_env.pop(TLS_CERT_ENV, None)
            node_env.pop(TLS_KEY_ENV, None)
        with connect(ClientConfig(link.address, link.secret, link.ssl_context), args, follow=True) as driver:
            # With --json stdout carries the final status alone; the nodes' output goes to stderr.
            out = sys.stderr.buffer if args.json else None
            status = run_local(
                driver, spec, command, emit=emit, out=out, env=node_env, role_resources=role_resources
            )
    print_final(args, status)
    return job_exit(status)
