"""``tfcoord submit --engine mesos``: the cluster as Mesos tasks placed by the coordinator's framework."""

from __future__ import annotations

import argparse
import json
import logging
import os

from tfcoord.cli.connection import ClientConfig, client_config, connect
from tfcoord.cli.jobflags import parse_role_resources, restart_policy
from tfcoord.cli.outcome import emit, job_exit, print_final
from tfcoord.client import TfcoordError, make_roles
from tfcoord.client.entry import ADDRESS_ENV, ExitCode, UsageError
from tfcoord.client.vocab import JobState
from tfcoord.client.watcher import FOREVER_S
from tfcoord.driver.nodeoutput import NodeOutput
from tfcoord.driver.session import INTERRUPT_REASON, CoordinatorLink, stop_and_wait, stop_interrupted

log = logging.getLogger("tfcoord")


def submit_mesos(args: argparse.Namespace) -> int:
    """Run the cluster as Mesos tasks placed by the coordinator's framework (coordinator/mesos)."""
    from tfcoord.coordinator.mesos.config import MesosConfig
    from tfcoord.coordinator.mesos.errors import MesosConfigError
    from tfcoord.coordinator.mesos.jobs import MesosJob, parse_role
    from tfcoord.driver import mesos
    from tfcoord.driver.resources import ResourcesError, mesos_roles

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    role_resources = parse_role_resources(args)
    if args.job and role_resources:
        raise UsageError(
            "give the roles either as --job ROLE:N:cpus=C,mem=MB or as --ps/--workers/--chief/--evaluator "
            "with --role-resources, not both"
        )
    if not args.job and not role_resources:
        raise UsageError(
            "--engine mesos needs the cluster's roles: --job ps:1:cpus=1,mem=1024 "
            "--job worker:2:cpus=2,mem=4096, or --ps 1 --workers 2 --role-resources ps:cpus=1,memory=1g "
            "--role-resources worker:cpus=2,memory=4g (and the command after --, or none to serve)"
        )
    try:
        if args.job:
            roles = [parse_role(j) for j in args.job]
        else:
            counts = make_roles(
                args.workers, args.ps, chief="chief" if args.chief else None, evaluator=args.evaluator
            )
            roles = mesos_roles(counts, role_resources)
        mjob = MesosJob.of(roles, command, args.image, os.environ.get("MESOS_ATTRIBUTES", ""))
        spec = mjob.to_spec(
            name=args.name, reservation_timeout_s=args.reservation_timeout, **restart_policy(args)
        )
    except (MesosConfigError, ResourcesError, TfcoordError) as e:
        raise UsageError(str(e)) from None
    if args.address or os.environ.get(ADDRESS_ENV):
        cfg = client_config(args)  # that coordinator must run the framework (MESOS_MASTER)
        link = CoordinatorLink(cfg.address, cfg.secret, cfg.ssl_context)
    else:
        try:
            config = MesosConfig.from_env(os.environ, master=args.mesos_master)
        except MesosConfigError as e:
            raise UsageError(str(e)) from None
        # The job's timeline is printed instead of the framework's and the coordinator's
        # per-event logs, which would say every event a second time.
        for name in ("tfcoord.mesos", "tfcoord.coordinator"):
            logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLogger().level))
        link = mesos.start_link(
            config, advertise_host=args.advertise_host, gpus=mjob.gpus, plaintext=args.plaintext
        )
    what = "serving tf.distribute.Server" if mjob.server_mode else f"running {' '.join(command)}"
    with (
        link,
        connect(ClientConfig(link.address, link.secret, link.ssl_context), args, follow=True) as driver,
    ):
        job = driver.submit(spec)
        emit(
            f"job {job} submitted to Mesos: "
            + ", ".join(f"{r.count} {r.role} ({r.resources_text()})" for r in mjob.roles)
            + f", {what}"
        )
        if args.no_wait:  # the coordinator's framework places and watches the tasks
            if args.json:
                print(json.dumps({"job": job}), flush=True)
            else:
                print(job, flush=True)
            emit(f"not waiting: follow it with `tfcoord status {job}`, end it with `tfcoord stop {job}`")
            return 0
        # The tasks' output is in their Mesos sandboxes: followed here from the coordinator,
        # [worker:0] ..., as the local and the Spark engines show it.
        output = NodeOutput(driver, job).start()
        try:
            if mjob.server_mode:
                status = mesos.wait_running(
                    driver, job, emit=emit, timeout_s=args.reservation_timeout + mesos.RUNNING_GRACE_S
                )
                emit(f"cluster serving: {json.dumps(status.cluster)}; Ctrl-C or `tfcoord stop {job}` ends it")
            status = mesos.await_state(driver, job, timeout_s=FOREVER_S, emit=emit)
        except KeyboardInterrupt:
            if not mjob.server_mode:
                raise stop_interrupted(driver, job) from None
            # A serving cluster runs until Ctrl-C: that is its normal end.
            emit("interrupted: stopping the cluster")
            status = stop_and_wait(driver, job, INTERRUPT_REASON, mesos.STOP_WAIT_S)
        finally:
            output.stop()  # the last lines, before the driver's client closes
    if status.state == JobState.FAILED:
        emit(f"job {job} failed: {status.error}")
    print_final(args, status)
    if mjob.server_mode and status.state == JobState.STOPPED:
        return ExitCode.OK
    return job_exit(status)
