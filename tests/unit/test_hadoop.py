"""tfcoord.node.hadoop: Hadoop's jars listed in CLASSPATH, from a real `hadoop classpath --glob`."""

from __future__ import annotations

from pathlib import Path

import pytest

from tfcoord.node.hadoop import expand_classpath


def _hadoop(tmp_path: Path, script: str) -> Path:
    home = tmp_path / "hadoop"
    (home / "bin").mkdir(parents=True)
    exe = home / "bin" / "hadoop"
    exe.write_text("#!/bin/sh\n" + script)
    exe.chmod(0o755)
    return home


def test_the_jars_are_appended_once(tmp_path: Path) -> None:
    home = _hadoop(tmp_path, '[ "$*" = "classpath --glob" ] && echo /h/a.jar:/h/b.jar\n')
    env = {"HADOOP_PREFIX": str(home), "CLASSPATH": "/mine.jar"}
    assert expand_classpath(env)
    assert env["CLASSPATH"] == "/mine.jar:/h/a.jar:/h/b.jar"
    assert not expand_classpath(env) and env["CLASSPATH"] == "/mine.jar:/h/a.jar:/h/b.jar"


def test_without_hadoop_nothing_changes() -> None:
    env = {"CLASSPATH": "/mine.jar"}
    assert not expand_classpath(env) and env == {"CLASSPATH": "/mine.jar"}


def test_a_failing_hadoop_says_which_command(tmp_path: Path) -> None:
    home = _hadoop(tmp_path, "exit 3\n")
    with pytest.raises(RuntimeError, match=r"bin/hadoop classpath --glob failed"):
        expand_classpath({"HADOOP_HOME": str(home)})
