"""Mesos jobs, configuration and TaskInfo building (coordinator/mesos/{jobs,config,tasks}.py). Pure."""

from __future__ import annotations

import base64
import re
import shlex
import socket
import subprocess
import sys

import pytest

from tfcoord.client.errors import LocalProtocolError
from tfcoord.client.messages import MAX_COMMAND_CHARS, MAX_TEXT_LEN, JobSpec, LaunchSpec
from tfcoord.coordinator.mesos.config import DEFAULT_IMAGE, MesosConfig, Volume, parse_masters
from tfcoord.coordinator.mesos.errors import MesosConfigError
from tfcoord.coordinator.mesos.jobs import MesosJob, RoleResources, parse_role
from tfcoord.coordinator.mesos.offers import Offer, TaskNeeds, match
from tfcoord.coordinator.mesos.tasks import (
    ArchiveFetch,
    TaskLaunch,
    build_task_info,
    node_argv,
    parse_task_id,
    scalar_gpus_isolated,
    secrets_supported,
    task_id,
)
from tfcoord.node.ports import PortReservation

# -- jobs -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("ps:1", RoleResources("ps", 1)),
        ("worker:2:cpus=2,mem=4096,gpus=1", RoleResources("worker", 2, 2.0, 4096.0, 1)),
        ("worker:3:gpus=2", RoleResources("worker", 3, gpus=2)),
        ("chief:1:mem=512, cpus=0.5", RoleResources("chief", 1, 0.5, 512.0)),
    ],
)
def test_role_specs_parse(text: str, expected: RoleResources) -> None:
    assert parse_role(text) == expected


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("worker", "is not ROLE:COUNT"),
        ("worker:two", "is not ROLE:COUNT"),
        ("bad-name:1", "'bad-name' is not a TensorFlow job name"),
        ("worker:0", "must be a whole number >= 1"),
        ("chief:2", "at most one chief"),
        ("worker:1:cpus=x", "cpus='x' is not a number"),
        ("worker:1:disk=5", "'disk=5' is not cpus=N, mem=MB or gpus=N"),
        ("worker:1:gpus=0.5", "gpus=0.5 must be a whole number"),
        ("worker:1:cpus=0", "cpus must be a number >= 0.01"),
        ("worker:1:mem=16", "mem must be a number >= 32"),
        ("worker:1:cpus=1,cpus=2", "cpus is given twice"),
    ],
)
def test_bad_role_specs_are_refused_clearly(text: str, why: str) -> None:
    with pytest.raises(MesosConfigError, match=why):
        parse_role(text)


def test_a_mesos_job_travels_in_its_job_spec_launch_spec() -> None:
    job = MesosJob.of(
        [parse_role("worker:2:cpus=2,mem=4096,gpus=1"), parse_role("ps:1")],
        ["python", "train.py", "--steps", "10"],
        "img:1",
        "rack:r1",
    )
    spec = job.to_spec(name="demo", reservation_timeout_s=60.0, labels={"user": "ann"})
    assert spec.roles == (("ps", 1), ("worker", 2)) and spec.engine == "mesos"
    assert spec.launch is not None and spec.launch.needs("worker") == {
        "cpus": 2.0,
        "mem": 4096.0,
        "gpus": 1.0,
    }
    assert spec.launch.command == ("python", "train.py", "--steps", "10") and spec.launch.image == "img:1"
    assert spec.labels == {"user": "ann"}  # labels stay the user's
    back = MesosJob.from_spec(JobSpec.from_wire(spec.to_wire()))
    assert back == job
    assert [back.slot(i).role for i in range(3)] == ["ps", "worker", "worker"]
    assert back.gpus and not back.server_mode


def test_a_job_without_command_is_server_mode() -> None:
    job = MesosJob.of([parse_role("ps:1"), parse_role("worker:1")])
    assert job.server_mode and not job.gpus
    spec = job.to_spec()
    assert spec.launch is not None and spec.launch.command == ()
    assert MesosJob.from_spec(spec).server_mode


def test_a_long_command_travels_whole_and_a_huge_one_says_what_to_do() -> None:
    long = ["python", "-c", "x" * (4 * MAX_TEXT_LEN)]  # over the old 1,024-character label
    assert MesosJob.from_spec(MesosJob.of([parse_role("worker:1")], long).to_spec()).command == tuple(long)
    huge = MesosJob.of([parse_role("worker:1")], ["python", "-c", "x" * MAX_COMMAND_CHARS])
    with pytest.raises(MesosConfigError, match="put it in a script"):
        huge.to_spec()


def test_a_launch_spec_of_another_version_is_refused_clearly() -> None:
    wire = MesosJob.of([parse_role("worker:1")], ["true"]).to_spec().to_wire()
    wire["launch"]["version"] = 2
    with pytest.raises(LocalProtocolError, match="install matching tfcoord versions"):
        JobSpec.from_wire(wire)


def test_a_launch_spec_is_only_for_an_engine_the_coordinator_runs() -> None:
    launch = LaunchSpec(resources=(("worker", (("cpus", 1.0),)),))
    with pytest.raises(LocalProtocolError, match="the submitting side starts"):
        JobSpec(roles=(("worker", 1),), engine="spark", launch=launch)


def test_bad_constraints_are_refused_at_the_driver() -> None:
    with pytest.raises(MesosConfigError, match="not key:value"):
        MesosJob.of([parse_role("worker:1")], attributes="rack")


@pytest.mark.parametrize(
    ("resources", "why"),
    [
        ((("worker", (("cpus", 0.001),)),), "cpus must be a number >= 0.01"),
        ((("worker", (("gpus", 1.5),)),), "must be a whole number"),
    ],
)
def test_resources_mesos_cannot_grant_are_a_config_error(resources, why: str) -> None:
    spec = JobSpec(roles=(("worker", 1),), engine="mesos", launch=LaunchSpec(resources=resources))
    with pytest.raises(MesosConfigError, match=why):
        MesosJob.from_spec(spec)


# -- configuration --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "ssl", "expected"),
    [
        ("m1:5050", False, ("http://m1:5050",)),
        ("m1", False, ("http://m1:5050",)),
        ("m1:5050, m2:5051", True, ("https://m1:5050", "https://m2:5051")),
        ("http://m1:8080,https://m2", False, ("http://m1:8080", "https://m2:5050")),
        ("[::1]:5050", False, ("http://[::1]:5050",)),
    ],
)
def test_masters_parse(value: str, ssl: bool, expected: tuple[str, ...]) -> None:
    assert parse_masters(value, ssl) == expected


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("", "no Mesos master"),
        ("m1:5050,zk://z1:2181/mesos", "a zk:// URL must be the whole value"),
        ("m1:notaport", "invalid port"),
        ("ftp://m1", "scheme must be http or https"),
        ("m1:5050/x", "host:port"),
    ],
)
def test_bad_masters_are_refused(value: str, why: str) -> None:
    with pytest.raises(MesosConfigError, match=why):
        parse_masters(value)


def test_config_from_the_tfmesos2_environment() -> None:
    env = {
        "MESOS_MASTER": "m1:5050,m2:5050",
        "MESOS_SSL": "true",
        "MESOS_VERIFY_SSL": "false",
        "MESOS_USERNAME": "u",
        "MESOS_PASSWORD": "p",
        "MESOS_FRAMEWORK_ROLE": "tf",
        "DOCKER_IMAGE": "img:2",
        "MESOS_ATTRIBUTES": "rack:r1",
        "MESOS_CA_FILE": "/ca.pem",
    }
    cfg = MesosConfig.from_env(env, python="/opt/py")
    assert cfg.masters == ("https://m1:5050", "https://m2:5050") and cfg.ssl
    assert (cfg.verify_ssl, cfg.username, cfg.password, cfg.role, cfg.image, cfg.ca_file, cfg.python) == (
        False,
        "u",
        "p",
        "tf",
        "img:2",
        "/ca.pem",
        "/opt/py",
    )
    assert [str(c) for c in cfg.constraints] == ["rack:r1"]
    plain = MesosConfig.from_env({"MESOS_MASTER": "m"})
    assert (plain.verify_ssl, plain.image, plain.username) == (True, DEFAULT_IMAGE, None)


@pytest.mark.parametrize(
    ("env", "why"),
    [
        ({"MESOS_MASTER": "m", "MESOS_SSL": "maybe"}, "MESOS_SSL must be true or false"),
        ({"MESOS_MASTER": "m", "MESOS_USERNAME": "u"}, "both MESOS_USERNAME and MESOS_PASSWORD"),
        ({"MESOS_MASTER": "m", "MESOS_ATTRIBUTES": "rack"}, "not key:value"),
        ({}, "no Mesos master"),
    ],
)
def test_config_errors_are_clear(env: dict[str, str], why: str) -> None:
    with pytest.raises(MesosConfigError, match=why):
        MesosConfig.from_env(env)


def test_task_settings_from_tfcoord_mesos_variables_reach_the_task_info() -> None:
    env = {
        "MESOS_MASTER": "m",
        "TFCOORD_MESOS_CONTAINERIZER": "MESOS",
        "TFCOORD_MESOS_GPU_VENDOR": "AMD",
        "TFCOORD_MESOS_FORCE_PULL_IMAGE": "true",
        "TFCOORD_MESOS_VOLUMES": "/data:/mnt/data:ro, /scratch:/tmp/s",
        "TFCOORD_MESOS_ENV": "A=1,B=x=y",
        "TFCOORD_MESOS_URIS": "https://x/a.tgz,/opt/b.sh",
    }
    cfg = MesosConfig.from_env(env)
    assert (cfg.containerizer, cfg.gpu_vendor, cfg.force_pull_image) == ("mesos", "amd", True)
    assert cfg.volumes == (Volume("/data", "/mnt/data", "RO"), Volume("/scratch", "/tmp/s", "RW"))
    assert cfg.env == (("A", "1"), ("B", "x=y"))
    assert [u.value for u in cfg.uris] == ["https://x/a.tgz", "/opt/b.sh"] and all(
        u.extract for u in cfg.uris
    )
    info = launch(cfg, SERVER)
    assert info["container"]["type"] == "MESOS" and info["container"]["mesos"]["image"]["cached"] is False
    assert {"container_path": "/mnt/data", "host_path": "/data", "mode": "RO"} in info["container"]["volumes"]
    variables = {v["name"]: v["value"] for v in info["command"]["environment"]["variables"]}
    assert variables["A"] == "1" and variables["B"] == "x=y"
    assert [u["value"] for u in info["command"]["uris"]] == ["https://x/a.tgz", "/opt/b.sh"]
    json_forms = MesosConfig.from_env(
        {
            "MESOS_MASTER": "m",
            "TFCOORD_MESOS_ENV": '{"OPTS": "a,b"}',
            "TFCOORD_MESOS_URIS": '[{"value": "hdfs://n/x.py", "extract": false, "executable": true}]',
        }
    )
    assert json_forms.env == (("OPTS", "a,b"),)
    assert [(u.value, u.extract, u.executable) for u in json_forms.uris] == [("hdfs://n/x.py", False, True)]
    plain = MesosConfig.from_env({"MESOS_MASTER": "m"})
    assert (plain.containerizer, plain.gpu_vendor, plain.force_pull_image) == ("docker", "nvidia", False)
    assert (plain.volumes, plain.env, plain.uris) == ((), (), ())


@pytest.mark.parametrize(
    ("var", "value", "why"),
    [
        ("TFCOORD_MESOS_CONTAINERIZER", "podman", "must be one of docker, mesos, not 'podman'"),
        ("TFCOORD_MESOS_GPU_VENDOR", "intel", "must be one of nvidia, amd"),
        ("TFCOORD_MESOS_FORCE_PULL_IMAGE", "sometimes", "must be true or false"),
        ("TFCOORD_MESOS_VOLUMES", "/data", "is not HOST:CONTAINER"),
        ("TFCOORD_MESOS_VOLUMES", "/data:/mnt:rx", "the mode must be ro or rw"),
        ("TFCOORD_MESOS_VOLUMES", "/data:mnt", "the container path must be absolute"),
        ("TFCOORD_MESOS_ENV", "A", "is not KEY=VALUE"),
        ("TFCOORD_MESOS_ENV", "1A=x", "is not an environment variable name"),
        ("TFCOORD_MESOS_ENV", "A=1,A=2", "A is given twice"),
        ("TFCOORD_MESOS_ENV", '{"A": 1}', "must map names to strings"),
        ("TFCOORD_MESOS_ENV", "{oops", "is not a JSON object"),
        ("TFCOORD_MESOS_URIS", "a.tgz", "give a URI with a scheme"),
        ("TFCOORD_MESOS_URIS", '[{"value": "https://x", "extract": "no"}]', "extract must be true or false"),
        ("TFCOORD_MESOS_URIS", '[{"uri": "https://x"}]', "must be a URI or an object with value"),
        ("TFCOORD_MESOS_URIS", "[oops", "is not a JSON list"),
    ],
)
def test_malformed_tfcoord_mesos_variables_are_refused_clearly(var: str, value: str, why: str) -> None:
    with pytest.raises(MesosConfigError, match=re.escape(why)) as info:
        MesosConfig.from_env({"MESOS_MASTER": "m", var: value})
    assert var in str(info.value)


# -- task ids and TaskInfo ------------------------------------------------------------------


def test_task_ids_round_trip_even_with_dots_in_the_job_id() -> None:
    tid = task_id("my.job-1", 3, 2)
    assert tid == "tfcoord.my.job-1.3.2"
    assert parse_task_id(tid) == ("my.job-1", 3, 2)
    for other in ("other.j.1.0", "tfcoord.j.x.0", "tfcoord.1.0", "tfcoord"):
        assert parse_task_id(other) is None


OFFER = {
    "id": {"value": "o1"},
    "agent_id": {"value": "ag1"},
    "hostname": "agent-1.example",
    "resources": [
        {"name": "cpus", "type": "SCALAR", "scalar": {"value": 8}},
        {"name": "mem", "type": "SCALAR", "scalar": {"value": 16384}},
        {"name": "gpus", "type": "SET", "set": {"item": ["2", "3"]}},
        {"name": "ports", "type": "RANGES", "ranges": {"range": [{"begin": 31000, "end": 31100}]}},
    ],
}


def launch(config: MesosConfig, job: MesosJob, gpus: int = 0, executor_id: int = 1) -> dict:
    [p] = match([TaskNeeds("k", "k", 1, 1024, gpus)], [Offer.from_json(OFFER)]).placements
    return build_task_info(
        config, TaskLaunch("j1", executor_id, 0, "worker", 0, "coord.example:7070", "ab" * 32, job, p)
    )


def argv(info: dict) -> list[str]:
    value = info["command"]["value"]
    assert value.startswith("exec ")
    return shlex.split(value[len("exec ") :])


CONFIG = MesosConfig(
    masters=("http://m:5050",), python="python3", volumes=(Volume("/data", "/mnt/data", "RO"),)
)
SERVER = MesosJob.of([parse_role("ps:1"), parse_role("worker:1")])


def test_task_info_runs_the_node_entry_point_in_docker_on_the_host_network() -> None:
    info = launch(CONFIG, SERVER)
    assert info["task_id"] == {"value": "tfcoord.j1.1.0"} and info["agent_id"] == {"value": "ag1"}
    assert info["name"] == "tfcoord j1 /job:worker/task:0"
    assert argv(info) == [
        "python3",
        "-m",
        "tfcoord.node",
        "--address",
        "coord.example:7070",
        "--job",
        "j1",
        "--executor-id",
        "1",
        "--attempt",
        "0",
        "--task-id",
        "tfcoord.j1.1.0",
        "--host",
        "agent-1.example",
        "--server-mode",
    ]
    assert info["command"]["shell"] is True
    env = {v["name"]: v["value"] for v in info["command"]["environment"]["variables"]}
    assert env["TFCOORD_TOKEN"] == "ab" * 32 and env["TENSORFLOW_PORT"] == "31000"
    assert "ab" * 32 not in info["command"]["value"]  # the token never on the command line
    assert info["container"] == {
        "type": "DOCKER",
        "docker": {"image": DEFAULT_IMAGE, "network": "HOST", "force_pull_image": False},
        "volumes": [{"container_path": "/mnt/data", "host_path": "/data", "mode": "RO"}],
    }
    assert {"name": "ports", "type": "RANGES", "ranges": {"range": [{"begin": 31000, "end": 31000}]}} in info[
        "resources"
    ]


def test_a_user_command_follows_the_double_dash_quoted_for_the_shell() -> None:
    job = MesosJob.of([parse_role("worker:1")], ["python", "-c", "print('a b'); import sys"], image="mine:1")
    info = launch(CONFIG, job)
    assert argv(info)[-4:] == ["--", "python", "-c", "print('a b'); import sys"]
    assert info["container"]["docker"]["image"] == "mine:1"


SCALAR_OFFER = {
    **OFFER,
    "resources": [
        r if r["name"] != "gpus" else {"name": "gpus", "type": "SCALAR", "scalar": {"value": 4}}
        for r in OFFER["resources"]
    ],
}
AMD_DEVICES = [
    {"key": "device", "value": "/dev/kfd"},
    {"key": "device", "value": "/dev/dri"},
    {"key": "group-add", "value": "video"},
    {"key": "security-opt", "value": "seccomp=unconfined"},
]


@pytest.mark.parametrize(
    ("containerizer", "vendor", "image", "kind", "docker_params", "node_gpus", "isolated"),
    [
        # Docker shows exactly the --gpus devices, renumbered from 0; a count takes the first ones.
        ("docker", "nvidia", "img", "SET", [{"key": "gpus", "value": '"device=2,3"'}], "0,1", False),
        ("docker", "nvidia", "img", "SCALAR", [{"key": "gpus", "value": "2"}], "0,1", False),
        # /dev/dri shows every GPU: the node picks the offered ids, or the first ones of a count.
        ("docker", "amd", "img", "SET", AMD_DEVICES, "2,3", False),
        ("docker", "amd", "img", "SCALAR", AMD_DEVICES, "0,1", False),
        # Mesos' NVIDIA isolator exposes the allocated (SCALAR) GPUs from 0; a SET is not its
        # resource, so its ids stay the agent's; nothing isolates AMD GPUs.
        ("mesos", "nvidia", "img", "SET", None, "2,3", True),
        ("mesos", "nvidia", "img", "SCALAR", None, "0,1", True),
        ("mesos", "amd", "img", "SET", None, "2,3", False),
        ("mesos", "amd", "img", "SCALAR", None, "0,1", False),
        # On the agent itself the ids are physical (DOCKER_IMAGE=""); the containerizer is Mesos'.
        ("docker", "nvidia", "", "SET", None, "2,3", True),
        ("docker", "nvidia", "", "SCALAR", None, "0,1", True),
        ("docker", "amd", "", "SET", None, "2,3", False),
        ("docker", "amd", "", "SCALAR", None, "0,1", False),
    ],
)
def test_which_gpus_a_task_is_given(
    containerizer: str,
    vendor: str,
    image: str,
    kind: str,
    docker_params: list | None,
    node_gpus: str,
    isolated: bool,
) -> None:
    config = CONFIG.with_options(containerizer=containerizer, gpu_vendor=vendor, image=image, volumes=())
    [p] = match(
        [TaskNeeds("k", "k", 1, 1024, 2)], [Offer.from_json(OFFER if kind == "SET" else SCALAR_OFFER)]
    ).placements
    info = build_task_info(config, TaskLaunch("j1", 1, 0, "worker", 0, "c:1", "ab" * 32, SERVER, p))
    args = argv(info)
    assert args[args.index("--gpus") + 1] == node_gpus
    container = info.get("container") or {}
    assert (container.get("docker") or {}).get("parameters") == docker_params
    assert ("container" in info) == bool(image)
    assert scalar_gpus_isolated(config, image) is isolated
    wanted = (
        {"name": "gpus", "type": "SET", "set": {"item": ["2", "3"]}}
        if kind == "SET"
        else {"name": "gpus", "type": "SCALAR", "scalar": {"value": 2.0}}
    )
    assert wanted in info["resources"]


def test_two_scalar_gpu_tasks_are_not_packed_onto_one_agent_where_nothing_isolates_them() -> None:
    two = [
        TaskNeeds("w0", "worker:0", 1, 1024, 1, exclusive_gpus=True),
        TaskNeeds("w1", "worker:1", 1, 1024, 1, exclusive_gpus=True),
    ]
    result = match(two, [Offer.from_json(SCALAR_OFFER)])
    assert [p.key for p in result.placements] == ["w0"] and result.unplaced == ("w1",)
    [(key, why)] = result.held_back
    assert key == "w1" and "agent-1.example offers GPUs only as a count, which names no device" in why
    # An agent already running one of ours holds back the first one too.
    again = match(two[:1], [Offer.from_json(SCALAR_OFFER)], gpu_agents={"ag1"})
    assert not again.placements and again.held_back[0][0] == "w0"
    # A SET names the devices, and Mesos' isolator keeps counts apart: both share the agent then.
    assert len(match(two, [Offer.from_json(OFFER)]).placements) == 2
    isolated = [TaskNeeds(t.key, t.name, 1, 1024, 1) for t in two]
    assert len(match(isolated, [Offer.from_json(SCALAR_OFFER)], gpu_agents={"ag1"}).placements) == 2


def test_the_mesos_containerizer_and_no_image() -> None:
    info = launch(CONFIG.with_options(containerizer="mesos", force_pull_image=True), SERVER)
    assert info["container"]["type"] == "MESOS"
    assert info["container"]["mesos"]["image"] == {
        "type": "DOCKER",
        "docker": {"name": DEFAULT_IMAGE},
        "cached": False,
    }
    bare = launch(CONFIG.with_options(image="", volumes=()), SERVER)
    assert "container" not in bare


def test_fetcher_uris_and_extra_environment() -> None:
    from tfcoord.coordinator.mesos.config import FetchUri

    info = launch(
        CONFIG.with_options(uris=(FetchUri("https://x/a.tgz"),), env=(("A", "1"), ("TFCOORD_TOKEN", "no"))),
        SERVER,
    )
    assert info["command"]["uris"] == [
        {"value": "https://x/a.tgz", "extract": True, "executable": False, "cache": False}
    ]
    env = [(v["name"], v["value"]) for v in info["command"]["environment"]["variables"]]
    assert ("A", "1") in env and ("TFCOORD_TOKEN", "no") not in env  # the job token cannot be overridden


def test_the_node_entry_point_imports_no_tensorflow_and_no_aiohttp_on_the_client_side() -> None:
    code = (
        "import sys, tfcoord.node.runner, tfcoord.node.tfserver, tfcoord.client; "
        "import tfcoord.coordinator.mesos.jobs; "
        "assert 'tensorflow' not in sys.modules, 'tensorflow'; assert 'aiohttp' not in sys.modules, 'aiohttp'"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_a_granted_port_binds_past_time_wait_but_not_past_a_listener() -> None:
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC's servers do
        listener.bind(("", 0))
        port = listener.getsockname()[1]
        listener.listen()
        with pytest.raises(OSError, match=f"cannot reserve port {port}"):
            PortReservation(port, granted=True)  # someone serves there: refused all the same
        client = socket.create_connection(("127.0.0.1", port))
        conn, _ = listener.accept()
        conn.close()  # the server side closes first: the port enters TIME_WAIT
        client.recv(1)
        client.close()
    with pytest.raises(OSError):
        PortReservation(port)  # a plain bind is refused for a minute
    held = PortReservation(port, granted=True)
    assert held.port == port and held.held
    held.release()


# -- the node archive and the token as a secret -------------------------------------------------


def test_a_task_with_the_archive_fetches_it_and_runs_its_bootstrap_with_the_same_node_arguments() -> None:
    config = MesosConfig(masters=("http://m:5050",), image="")
    job = MesosJob.of([parse_role("worker:1")], ("python3", "train.py"))
    [p] = match([TaskNeeds("k", "k", 1, 1024)], [Offer.from_json(OFFER)]).placements
    fetch = ArchiveFetch.at("http://10.0.0.5:8080", "tfcoord", "p/w:d", "tfcoord-node-x.pyz", "ab" * 32)
    assert fetch.url == "http://tfcoord:p%2Fw%3Ad@10.0.0.5:8080/v1/node-archive/tfcoord-node-x.pyz"
    plain = TaskLaunch("j1", 1, 0, "worker", 0, "c:1", "cd" * 32, job, p)
    with_archive = TaskLaunch("j1", 1, 0, "worker", 0, "c:1", "cd" * 32, job, p, archive=fetch)
    before, after = build_task_info(config, plain), build_task_info(config, with_archive)
    assert "uris" not in before["command"]
    assert after["command"]["uris"] == [
        {"value": fetch.url, "executable": True, "extract": False, "cache": False, "output_file": fetch.name}
    ]
    words = shlex.split(after["command"]["value"])  # as /bin/sh splits it, before expansion
    assert words[:3] == ["exec", "python3", "-c"]
    assert words[4:6] == ["$MESOS_SANDBOX/tfcoord-node-x.pyz", "ab" * 32]
    assert '"$MESOS_SANDBOX"/tfcoord-node-x.pyz' in after["command"]["value"]  # expanded by the shell
    assert words[6:] == shlex.split(before["command"]["value"])[4:]  # after python3 -m tfcoord.node
    assert node_argv(config, with_archive)[:2] == ["python3", "-c"]


def test_the_token_is_a_value_secret_only_where_mesos_resolves_secrets() -> None:
    assert secrets_supported("1.11.0", MesosConfig(masters=("http://m:5050",), image=""), "")
    assert secrets_supported(
        "1.4.0-rc1", MesosConfig(masters=("http://m:5050",), containerizer="mesos"), "img"
    )
    assert not secrets_supported("1.3.2", MesosConfig(masters=("http://m:5050",)), "")
    assert not secrets_supported("", MesosConfig(masters=("http://m:5050",)), "")  # unknown: as before
    assert not secrets_supported("1.11.0", MesosConfig(masters=("http://m:5050",)), "img")  # Docker's
    job = MesosJob.of([parse_role("worker:1")], ("true",))
    [p] = match([TaskNeeds("k", "k", 1, 1024)], [Offer.from_json(OFFER)]).placements
    launch = TaskLaunch("j1", 1, 0, "worker", 0, "c:1", "cd" * 32, job, p, secret_token=True)
    var = build_task_info(MesosConfig(masters=("http://m:5050",), image=""), launch)["command"][
        "environment"
    ]["variables"][0]
    assert var == {
        "name": "TFCOORD_TOKEN",
        "type": "SECRET",
        "secret": {"type": "VALUE", "value": {"data": base64.b64encode(b"cd" * 32).decode()}},
    }
