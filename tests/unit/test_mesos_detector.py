"""MESOS_MASTER=zk://...: the URL's parsing and the leader rules of the ZooKeeper detector (pure)."""

from __future__ import annotations

import json

import pytest

from tfcoord.coordinator.mesos.config import MesosConfig, ZooKeeperUrl, parse_zookeeper
from tfcoord.coordinator.mesos.detector import leader_znode, master_url
from tfcoord.coordinator.mesos.errors import MesosConfigError, MesosProtocolError

#: What a Mesos 1.11 master writes into its json.info_ znode (JSON::protobuf(MasterInfo)).
MASTER_INFO = {
    "address": {"hostname": "m2.example.com", "ip": "10.0.0.2", "port": 5050},
    "hostname": "m2.example.com",
    "id": "5b2c6f5e-0b3c-4a8e-9d1e-2f0c9a7e1b11",
    "ip": 33554442,
    "pid": "master@10.0.0.2:5050",
    "port": 5050,
    "version": "1.11.0",
    "capabilities": [{"type": "AGENT_UPDATE"}, {"type": "AGENT_DRAINING"}],
}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("zk://z1:2181/mesos", ZooKeeperUrl("z1:2181", "/mesos")),
        ("zk://z1,z2:2182/mesos/", ZooKeeperUrl("z1:2181,z2:2182", "/mesos")),
        ("zk://u:p@z1:2181/a/b", ZooKeeperUrl("z1:2181", "/a/b", "u:p")),
        (" zk://[::1]:2181/mesos ", ZooKeeperUrl("[::1]:2181", "/mesos")),
    ],
)
def test_zookeeper_urls_parse(value: str, expected: ZooKeeperUrl) -> None:
    assert parse_zookeeper(value) == expected


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("zk://z1:2181", "names no znode"),
        ("zk://z1:2181/", "names no znode"),
        ("zk:///mesos", "must look like host:port"),
        ("zk://z1:x/mesos", "invalid port"),
        ("zk://z1:2181/me sos", "is not a ZooKeeper URL"),
        ("zk://user@z1:2181/mesos", "credentials must be user:password@"),
    ],
)
def test_bad_zookeeper_urls_are_refused_in_one_line(value: str, why: str) -> None:
    with pytest.raises(MesosConfigError, match=why) as info:
        MesosConfig.from_env({"MESOS_MASTER": value})
    assert "\n" not in str(info.value)


def test_a_zookeeper_url_makes_a_config_without_a_master_list() -> None:
    config = MesosConfig.from_env({"MESOS_MASTER": "zk://u:secret@z1:2181/mesos", "MESOS_SSL": "true"})
    assert config.masters == () and config.ssl and config.scheme == "https"
    assert config.zookeeper == ZooKeeperUrl("z1:2181", "/mesos", "u:secret")
    assert config.master_description == "zk://z1:2181/mesos"  # the password never shows
    with pytest.raises(MesosConfigError, match="no Mesos master"):
        MesosConfig()


def test_the_leader_is_the_lowest_json_info_sequence() -> None:
    assert (
        leader_znode(["json.info_0000000012", "json.info_0000000003", "log_replicas"])
        == "json.info_0000000003"
    )
    assert leader_znode(["json.info_0000000009", "json.info_0000000010"]) == "json.info_0000000009"
    # Legacy protobuf znodes and anything else under the path are not masters to talk HTTP to.
    assert leader_znode(["info_0000000001", "log_replicas", "json.info_x"]) is None
    assert leader_znode([]) is None


def test_master_info_json_gives_the_base_url() -> None:
    assert master_url(json.dumps(MASTER_INFO).encode(), "http") == "http://m2.example.com:5050"
    no_name = {**MASTER_INFO, "address": {"ip": "10.0.0.2", "port": 5051}}
    assert master_url(json.dumps(no_name).encode(), "https") == "https://10.0.0.2:5051"
    only_pid = {"pid": "master@10.0.0.3:5052", "id": "x"}
    assert master_url(json.dumps(only_pid).encode(), "http") == "http://10.0.0.3:5052"
    v6 = {"address": {"ip": "fd00::2", "port": 5050}}
    assert master_url(json.dumps(v6).encode(), "http") == "http://[fd00::2]:5050"


@pytest.mark.parametrize(
    "data", [b"\x08\x01binary", b"[]", b'{"id": "x"}', b'{"address": {"hostname": "m"}}']
)
def test_unusable_master_info_is_a_protocol_error(data: bytes) -> None:
    with pytest.raises(MesosProtocolError):
        master_url(data, "http")
