"""The Mesos framework's configuration: one frozen object, built at the entry point.

``MesosConfig.from_env(os.environ, **overrides)`` reads tfmesos2's variables with their
meaning kept (``MESOS_MASTER``: a comma list of masters, or a ``zk://`` URL naming the
ZooKeeper ensemble the masters elect their leader in, ``MESOS_SSL``, ``MESOS_VERIFY_SSL``, ``MESOS_USERNAME``,
``MESOS_PASSWORD``, ``MESOS_FRAMEWORK_ROLE``, ``DOCKER_IMAGE``, ``MESOS_ATTRIBUTES``) plus
``MESOS_CA_FILE`` and ``TFCOORD_TASK_PYTHON``, and what tfmesos2 takes only as ``cluster()``
arguments, under tfcoord's names (tfmesos2 has none for them):

=================================  ===========================================================
``TFCOORD_MESOS_CONTAINERIZER``    ``docker`` (default) or ``mesos``
``TFCOORD_MESOS_GPU_VENDOR``       ``nvidia`` (default) or ``amd``
``TFCOORD_MESOS_FORCE_PULL_IMAGE`` ``true``: pull the image at every launch
``TFCOORD_MESOS_VOLUMES``          ``HOST:CONTAINER[:ro|rw][,...]``, as ``docker -v`` writes them
``TFCOORD_MESOS_ENV``              ``KEY=VALUE[,KEY=VALUE]``, or a JSON object for values with commas
``TFCOORD_MESOS_URIS``             ``URI[,URI]`` fetched and extracted into the sandbox, or a JSON
                                   list of ``{"value": URI, "extract": ..., "executable": ...,
                                   "cache": ...}``
``TFCOORD_MESOS_NODE_ARCHIVE``     ``true`` (default): tasks fetch the node runtime from the
                                   coordinator's HTTP port; ``false``: they run the image's
                                   own ``python3 -m tfcoord.node``
=================================  ===========================================================

tfmesos2's task-side ``TFMESOS2_CLIENT_USERNAME`` and ``TFMESOS2_CLIENT_PASSWORD`` (the
credentials its tasks present to its driver's HTTP API) become the node archive's download
credential (both or neither).

Only entry points (the CLI, the tfmesos2 compatibility module) call it, so nothing below
them reads the environment.
"""

from __future__ import annotations

import getpass
import importlib.util
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit

from tfcoord.client import __version__

from .errors import MesosConfigError
from .offers import Constraint, parse_constraints

#: The port a Mesos master listens on unless told otherwise.
DEFAULT_MASTER_PORT = 5050
#: The port a ZooKeeper server listens on unless told otherwise.
DEFAULT_ZOOKEEPER_PORT = 2181
#: The task image tfcoord's tasks run: built from deploy/Containerfile.task (TensorFlow and
#: tfcoord), tagged with the tfcoord version so a coordinator and its nodes always speak the
#: same protocol. tfmesos2's default (avhost/tensorflow-mesos) lacks tfcoord, so it cannot be
#: ours; push the image to a registry the agents can pull from and set DOCKER_IMAGE to it.
DEFAULT_IMAGE = f"tfcoord-task:{__version__}"
#: How long the master keeps our tasks after the scheduler's connection drops. Long enough to
#: ride out a master failover or a coordinator restart under systemd (the heartbeat watchdog
#: resubscribes within seconds); short enough that tasks of a driver that died do not linger
#: long (they also stop on their own once their coordinator is gone).
DEFAULT_FAILOVER_TIMEOUT_S = 300.0
#: The interpreter inside the task image that runs ``-m tfcoord.node``; TFCOORD_TASK_PYTHON
#: names another (tasks without an image run on the agent's own Python).
DEFAULT_PYTHON = "python3"
PYTHON_ENV = "TFCOORD_TASK_PYTHON"
#: A SUBSCRIBE is a single HTTP request on a LAN: a master that does not answer its headers
#: within this is down or unreachable, and the next master is tried.
CONNECT_TIMEOUT_S = 10.0
#: The first subscription of a framework that has never been subscribed: past this without any
#: master answering, starting fails with an error naming the masters tried.
FIRST_SUBSCRIBE_DEADLINE_S = 60.0
#: Mesos counts a scheduler gone after missed heartbeats; we resubscribe when no event (a
#: HEARTBEAT at least) arrived for this many heartbeat intervals.
HEARTBEAT_MISSES = 3.0
#: After a job ends its nodes stop by themselves (they are told to by push); tasks still
#: alive after this grace are killed.
KILL_AFTER_END_S = 5.0

CONTAINERIZER_ENV = "TFCOORD_MESOS_CONTAINERIZER"
GPU_VENDOR_ENV = "TFCOORD_MESOS_GPU_VENDOR"
FORCE_PULL_ENV = "TFCOORD_MESOS_FORCE_PULL_IMAGE"
VOLUMES_ENV = "TFCOORD_MESOS_VOLUMES"
ENV_ENV = "TFCOORD_MESOS_ENV"
URIS_ENV = "TFCOORD_MESOS_URIS"
NODE_ARCHIVE_ENV = "TFCOORD_MESOS_NODE_ARCHIVE"
ARCHIVE_USER_ENV = "TFMESOS2_CLIENT_USERNAME"
ARCHIVE_PASSWORD_ENV = "TFMESOS2_CLIENT_PASSWORD"

CONTAINERIZERS = ("docker", "mesos")
GPU_VENDORS = ("nvidia", "amd")
#: What a shell accepts as a variable name; Mesos passes others on, but no program reads them.
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TRUE, _FALSE = frozenset({"1", "true", "yes", "on"}), frozenset({"0", "false", "no", "off", ""})


@dataclass(frozen=True)
class Volume:
    """A host path mounted into the task's container."""

    host_path: str
    container_path: str
    mode: str = "RW"

    def __post_init__(self) -> None:
        if self.mode not in ("RW", "RO"):
            raise MesosConfigError(f"volume mode must be RW or RO, not {self.mode!r}")
        if not self.host_path or not self.container_path.startswith("/"):
            raise MesosConfigError(
                f"volume {self.host_path}:{self.container_path} needs a host path and an absolute container path"
            )


@dataclass(frozen=True)
class FetchUri:
    """A URI the Mesos fetcher downloads into the task's sandbox before the command starts."""

    value: str
    extract: bool = True
    executable: bool = False
    cache: bool = False


@dataclass(frozen=True)
class ZooKeeperUrl:
    """Where the masters elect their leader: ``zk://[user:password@]host1:2181,host2:2181/path``.

    ``servers`` is kazoo's hosts string (``host:port,host:port``); ``path`` the znode the
    masters register under (``/mesos``); ``credentials`` ``user:password`` for ZooKeeper's
    digest authentication, or None.
    """

    servers: str
    path: str
    credentials: str | None = None

    def __str__(self) -> str:  # never the password
        return f"zk://{self.servers}{self.path}"


@dataclass(frozen=True)
class MesosConfig:
    """Everything the framework needs; see the module docstring for where it comes from.

    ``masters`` are base URLs (``http://host:5050``) tried in turn; a non-leading master's
    redirect is followed. With ``zookeeper`` (``MESOS_MASTER=zk://...``) the leading master
    is read from ZooKeeper instead, and ``masters`` is empty; ``scheme`` (``https`` with
    ``MESOS_SSL=true``) is how the leader found there is spoken to. ``image`` empty runs tasks without a container image (tfcoord and
    TensorFlow installed on the agents).
    """

    masters: tuple[str, ...] = ()
    zookeeper: ZooKeeperUrl | None = None
    scheme: str = "http"
    user: str = "root"
    name: str = "tfcoord"
    role: str | None = None
    username: str | None = None
    password: str | None = None
    verify_ssl: bool = True
    ca_file: str | None = None
    failover_timeout_s: float = DEFAULT_FAILOVER_TIMEOUT_S
    image: str = DEFAULT_IMAGE
    containerizer: str = "docker"
    force_pull_image: bool = False
    gpu_vendor: str = "nvidia"
    python: str = DEFAULT_PYTHON
    volumes: tuple[Volume, ...] = ()
    uris: tuple[FetchUri, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    constraints: tuple[Constraint, ...] = ()
    connect_timeout_s: float = CONNECT_TIMEOUT_S
    first_subscribe_deadline_s: float = FIRST_SUBSCRIBE_DEADLINE_S
    heartbeat_misses: float = HEARTBEAT_MISSES
    kill_after_end_s: float = KILL_AFTER_END_S
    #: Labels put on every task (operators find tfcoord's tasks by them).
    task_labels: tuple[tuple[str, str], ...] = ()
    #: Tasks fetch the node archive from the coordinator's HTTP port, when it has one.
    node_archive: bool = True
    #: The archive's download credential (tfmesos2's TFMESOS2_CLIENT_USERNAME/PASSWORD);
    #: None: one derived from the coordinator secret.
    archive_username: str | None = None
    archive_password: str | None = None

    def __post_init__(self) -> None:
        if not self.masters and self.zookeeper is None:
            raise MesosConfigError(
                "no Mesos master: set MESOS_MASTER=host:5050[,host2:5050] or zk://host:2181[,host2:2181]/mesos"
            )
        if self.scheme not in ("http", "https"):
            raise MesosConfigError(f"the masters' scheme must be http or https, not {self.scheme!r}")
        if self.containerizer not in CONTAINERIZERS:
            raise MesosConfigError(
                f"containerizer must be one of {', '.join(CONTAINERIZERS)}, not {self.containerizer!r}"
            )
        if self.gpu_vendor not in GPU_VENDORS:
            raise MesosConfigError(
                f"GPU vendor must be one of {', '.join(GPU_VENDORS)}, not {self.gpu_vendor!r}"
            )
        if (self.username is None) != (self.password is None):
            raise MesosConfigError("set both MESOS_USERNAME and MESOS_PASSWORD, or neither")
        if (self.archive_username is None) != (self.archive_password is None):
            raise MesosConfigError(f"set both {ARCHIVE_USER_ENV} and {ARCHIVE_PASSWORD_ENV}, or neither")
        if self.archive_username is not None and (":" in self.archive_username or not self.archive_password):
            raise MesosConfigError(
                f"{ARCHIVE_USER_ENV} must not contain ':' and {ARCHIVE_PASSWORD_ENV} must not be empty "
                "(HTTP Basic splits user and password at the first ':')"
            )
        for name in (
            "failover_timeout_s",
            "connect_timeout_s",
            "first_subscribe_deadline_s",
            "kill_after_end_s",
        ):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise MesosConfigError(f"{name} must be a number of seconds >= 0, not {value!r}")
        if self.heartbeat_misses < 1:
            raise MesosConfigError(f"heartbeat_misses must be at least 1, not {self.heartbeat_misses!r}")
        if not self.user:
            raise MesosConfigError("the framework user must not be empty")

    @property
    def ssl(self) -> bool:
        if self.zookeeper is not None:
            return self.scheme == "https"
        return any(m.startswith("https://") for m in self.masters)

    @property
    def master_description(self) -> str:
        """What MESOS_MASTER named, for messages: the ZooKeeper URL or the masters' list."""
        return str(self.zookeeper) if self.zookeeper is not None else ",".join(self.masters)

    @classmethod
    def from_env(cls, environ: Mapping[str, str], **overrides: Any) -> MesosConfig:
        """Build from tfmesos2's variables; keyword arguments win over the environment.

        Raises:
            MesosConfigError: a variable is malformed or a required one is missing.
        """
        use_ssl = parse_bool("MESOS_SSL", environ.get("MESOS_SSL", "false"))
        master = overrides.pop("master", None) or environ.get("MESOS_MASTER", "")
        zookeeper = parse_zookeeper(master) if master.strip().startswith("zk://") else None
        if zookeeper is not None and importlib.util.find_spec("kazoo") is None:
            raise MesosConfigError(
                f"MESOS_MASTER={zookeeper} needs the ZooKeeper client kazoo: "
                "pip install 'tfcoord-coordinator[zookeeper]'"
            )
        kw: dict[str, Any] = {
            "masters": () if zookeeper is not None else parse_masters(master, use_ssl),
            "zookeeper": zookeeper,
            "scheme": "https" if use_ssl else "http",
            "verify_ssl": parse_bool("MESOS_VERIFY_SSL", environ.get("MESOS_VERIFY_SSL", "true")),
            "ca_file": environ.get("MESOS_CA_FILE") or None,
            "username": environ.get("MESOS_USERNAME") or None,
            "password": environ.get("MESOS_PASSWORD") or None,
            "role": environ.get("MESOS_FRAMEWORK_ROLE") or None,
            "constraints": parse_constraints(environ.get("MESOS_ATTRIBUTES", "")),
            "user": _current_user(),
            "python": environ.get(PYTHON_ENV) or DEFAULT_PYTHON,
        }
        if "DOCKER_IMAGE" in environ:
            kw["image"] = environ["DOCKER_IMAGE"]
        if environ.get(CONTAINERIZER_ENV, "").strip():
            kw["containerizer"] = parse_choice(CONTAINERIZER_ENV, environ[CONTAINERIZER_ENV], CONTAINERIZERS)
        if environ.get(GPU_VENDOR_ENV, "").strip():
            kw["gpu_vendor"] = parse_choice(GPU_VENDOR_ENV, environ[GPU_VENDOR_ENV], GPU_VENDORS)
        if environ.get(FORCE_PULL_ENV, "").strip():
            kw["force_pull_image"] = parse_bool(FORCE_PULL_ENV, environ[FORCE_PULL_ENV])
        kw["volumes"] = parse_volumes(environ.get(VOLUMES_ENV, ""))
        kw["env"] = parse_env(environ.get(ENV_ENV, ""))
        kw["uris"] = parse_uris(environ.get(URIS_ENV, ""))
        if environ.get(NODE_ARCHIVE_ENV, "").strip():
            kw["node_archive"] = parse_bool(NODE_ARCHIVE_ENV, environ[NODE_ARCHIVE_ENV])
        kw["archive_username"] = environ.get(ARCHIVE_USER_ENV) or None
        kw["archive_password"] = environ.get(ARCHIVE_PASSWORD_ENV) or None
        kw.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**kw)

    def with_options(self, **changes: Any) -> MesosConfig:
        return replace(self, **changes)


def parse_bool(name: str, value: str) -> bool:
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise MesosConfigError(f"{name} must be true or false, not {value!r}")


def parse_choice(name: str, value: str, choices: tuple[str, ...]) -> str:
    """One of ``choices``, any case (tfmesos2 writes ``DOCKER``, ``MESOS``)."""
    v = value.strip().lower()
    if v not in choices:
        raise MesosConfigError(f"{name} must be one of {', '.join(choices)}, not {value!r}")
    return v


def parse_volumes(value: str) -> tuple[Volume, ...]:
    """``HOST:CONTAINER[:ro|rw][,...]`` → volumes (read-write unless ``ro``, as with ``docker -v``).

    Raises:
        MesosConfigError: an entry without both paths, a relative container path, another mode.
    """
    out = []
    for item in (p.strip() for p in value.split(",")):
        if not item:
            continue
        parts = item.split(":")
        if len(parts) not in (2, 3) or not all(parts):
            raise MesosConfigError(
                f"{VOLUMES_ENV} entry {item!r} is not HOST:CONTAINER[:ro|rw], e.g. /data:/mnt/data:ro"
            )
        mode = parts[2].upper() if len(parts) == 3 else "RW"
        if mode not in ("RW", "RO"):
            raise MesosConfigError(
                f"{VOLUMES_ENV} entry {item!r}: the mode must be ro or rw, not {parts[2]!r}"
            )
        if not parts[1].startswith("/"):
            raise MesosConfigError(f"{VOLUMES_ENV} entry {item!r}: the container path must be absolute")
        out.append(Volume(parts[0], parts[1], mode))
    return tuple(out)


def parse_env(value: str) -> tuple[tuple[str, str], ...]:
    """``KEY=VALUE[,KEY=VALUE]``, or a JSON object of strings → the tasks' extra environment.

    Raises:
        MesosConfigError: an entry without ``=``, a name that is not a variable name, a key
            given twice, JSON that is not an object of strings.
    """
    text = value.strip()
    if not text:
        return ()
    pairs: list[tuple[str, str]] = []
    if text.startswith("{"):
        try:
            obj = json.loads(text)
        except ValueError as e:
            raise MesosConfigError(f"{ENV_ENV} is not a JSON object: {e}") from None
        if not isinstance(obj, dict) or not all(isinstance(v, str) for v in obj.values()):
            raise MesosConfigError(f'{ENV_ENV} as JSON must map names to strings, e.g. {{"A": "1"}}')
        pairs = list(obj.items())
    else:
        for item in (p.strip() for p in text.split(",")):
            if not item:
                continue
            key, sep, val = item.partition("=")
            if not sep:
                raise MesosConfigError(
                    f"{ENV_ENV} entry {item!r} is not KEY=VALUE (a value with commas needs the JSON form)"
                )
            pairs.append((key.strip(), val))
    seen = set()
    for key, _ in pairs:
        if not _ENV_NAME.fullmatch(key):
            raise MesosConfigError(f"{ENV_ENV}: {key!r} is not an environment variable name")
        if key in seen:
            raise MesosConfigError(f"{ENV_ENV}: {key} is given twice")
        seen.add(key)
    return tuple(pairs)


def parse_uris(value: str) -> tuple[FetchUri, ...]:
    """``URI[,URI]`` (each extracted), or a JSON list of URIs or of FetchUri fields.

    Raises:
        MesosConfigError: an empty or blank-containing URI, a relative path, bad JSON, an
            unknown field or a flag that is not true or false.
    """
    text = value.strip()
    if not text:
        return ()
    items: list[Any]
    if text.startswith("["):
        try:
            items = json.loads(text)
        except ValueError as e:
            raise MesosConfigError(f"{URIS_ENV} is not a JSON list: {e}") from None
        if not isinstance(items, list):
            raise MesosConfigError(f"{URIS_ENV} as JSON must be a list")
    else:
        items = [p.strip() for p in text.split(",") if p.strip()]
    out = []
    for item in items:
        fields = {"value": item} if isinstance(item, str) else item
        if not isinstance(fields, dict) or set(fields) - {"value", "extract", "executable", "cache"}:
            raise MesosConfigError(
                f"{URIS_ENV} entry {item!r} must be a URI or an object with value, extract, executable, cache"
            )
        uri = fields.get("value")
        if not isinstance(uri, str) or not uri or any(c.isspace() for c in uri):
            raise MesosConfigError(f"{URIS_ENV} entry {item!r}: the URI must be a string without blanks")
        if "://" not in uri and not uri.startswith("/"):
            raise MesosConfigError(
                f"{URIS_ENV} entry {uri!r}: give a URI with a scheme (https://, hdfs://, file://) or an absolute path"
            )
        flags = {k: fields[k] for k in ("extract", "executable", "cache") if k in fields}
        for k, v in flags.items():
            if not isinstance(v, bool):
                raise MesosConfigError(f"{URIS_ENV} entry {uri!r}: {k} must be true or false, not {v!r}")
        out.append(FetchUri(uri, **flags))
    return tuple(out)


def parse_zookeeper(value: str) -> ZooKeeperUrl:
    """``zk://[user:password@]host[:port][,host[:port]]/path`` → where the masters elect their
    leader (ports default to 2181), as Mesos' own ``--master=zk://...`` takes it.

    Raises:
        MesosConfigError: no host, a bad port, no path or the root path (Mesos refuses ``/``
            too: the masters need a znode of their own), blanks.
    """
    text = value.strip()
    example = "e.g. MESOS_MASTER=zk://zk1:2181,zk2:2181/mesos"
    rest = text[len("zk://") :]
    if not text.startswith("zk://") or any(c.isspace() for c in rest):
        raise MesosConfigError(
            f"MESOS_MASTER={text!r} is not a ZooKeeper URL zk://host:port[,host:port]/path ({example})"
        )
    hosts, slash, path = rest.partition("/")
    credentials = None
    if "@" in hosts:
        credentials, _, hosts = hosts.rpartition("@")
        if ":" not in credentials:
            raise MesosConfigError(f"MESOS_MASTER: ZooKeeper credentials must be user:password@ ({example})")
    servers = []
    for host in hosts.split(","):
        parts = urlsplit(f"//{host}")
        try:
            port = parts.port or DEFAULT_ZOOKEEPER_PORT
        except ValueError:
            raise MesosConfigError(
                f"MESOS_MASTER: ZooKeeper server {host!r} has an invalid port ({example})"
            ) from None
        if not parts.hostname or parts.path:
            raise MesosConfigError(
                f"MESOS_MASTER: ZooKeeper server {host!r} must look like host:port ({example})"
            )
        name = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        servers.append(f"{name}:{port}")
    url = ZooKeeperUrl(",".join(servers), "/" + path.rstrip("/"), credentials)
    if not slash or url.path == "/":
        raise MesosConfigError(
            f"MESOS_MASTER={str(url)!r} names no znode: give the path the masters "
            f"register under, as their --zk flag does ({example})"
        )
    return url


def parse_masters(value: str, use_ssl: bool = False) -> tuple[str, ...]:
    """``host:port[,host:port]`` or URLs → base URLs (a ``zk://`` URL goes to :func:`parse_zookeeper`).

    Raises:
        MesosConfigError: empty, ``zk://`` inside a list, or an entry that is not a host with a port.
    """
    out: list[str] = []
    for item in (p.strip() for p in value.split(",")):
        if not item:
            continue
        if item.startswith("zk://"):
            raise MesosConfigError(
                f"MESOS_MASTER entry {item!r}: a zk:// URL must be the whole value "
                "(MESOS_MASTER=zk://zk1:2181,zk2:2181/mesos), not one entry of a list of masters"
            )
        scheme = "https" if use_ssl else "http"
        if "://" in item:
            scheme, _, item = item.partition("://")
            if scheme not in ("http", "https"):
                raise MesosConfigError(f"MESOS_MASTER entry {item!r}: scheme must be http or https")
        parts = urlsplit(f"//{item}")
        try:
            port = parts.port or DEFAULT_MASTER_PORT
        except ValueError:
            raise MesosConfigError(f"MESOS_MASTER entry {item!r} has an invalid port") from None
        if not parts.hostname or parts.path not in ("", "/"):
            raise MesosConfigError(f"MESOS_MASTER entry {item!r} must look like host:port")
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        out.append(f"{scheme}://{host}:{port}")
    if not out:
        raise MesosConfigError(
            "no Mesos master: set MESOS_MASTER=host:5050[,host2:5050] or zk://host:2181/mesos (or pass master=)"
        )
    return tuple(out)


def _current_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (some containers)
        return "root"
