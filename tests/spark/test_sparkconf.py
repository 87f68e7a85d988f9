"""The application's settings read in a few Py4J calls give exactly what getConf().getAll() gives.

Against the session's live SparkContext: settings are added to its live configuration for
the test (a sensitive one Spark redacts, one whose value holds a line break, one holding
'=') and removed after it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tfcoord.driver.sparkconf import REDACTED, read_settings

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]


@pytest.fixture
def live_conf(sc: Any) -> Iterator[Any]:
    jconf = sc._jsc.sc().conf()
    added: list[str] = []

    def put(key: str, value: str) -> None:
        jconf.set(key, value)
        added.append(key)

    yield put
    for key in added:
        jconf.remove(key)


def _slow(sc: Any) -> dict[str, str]:
    return dict(sc.getConf().getAll())


def test_the_settings_are_those_getconf_gives(sc):
    assert read_settings(sc) == _slow(sc)
    assert read_settings(sc)["spark.master"] == sc.master


def test_a_redacted_setting_is_read_back_exactly(sc, live_conf):
    live_conf("spark.tfcoord.test.password", "hunter2")
    live_conf("spark.tfcoord.test.path", "/opt/token/gpus.sh")  # redacted for its value
    assert REDACTED in sc._jsc.sc().conf().toDebugString()
    settings = read_settings(sc)
    assert settings["spark.tfcoord.test.password"] == "hunter2"
    assert settings["spark.tfcoord.test.path"] == "/opt/token/gpus.sh"
    assert settings == _slow(sc)


def test_a_value_with_a_line_break_or_an_equals_sign_is_read_exactly(sc, live_conf):
    live_conf("spark.tfcoord.test.options", "-Da=1\nspark.fake=2")
    live_conf("spark.tfcoord.test.pair", "k=v")
    settings = read_settings(sc)
    assert settings["spark.tfcoord.test.options"] == "-Da=1\nspark.fake=2"
    assert "spark.fake" not in settings
    assert settings["spark.tfcoord.test.pair"] == "k=v"
    assert settings == _slow(sc)
