"""The application's Spark configuration, read in a handful of Py4J calls.

``dict(sc.getConf().getAll())`` costs about seven Py4J round trips per setting: ``getConf()``
copies every setting into a new ``SparkConf`` (a ``set`` each), and ``getAll()`` reads the
array back element by element (the element, its key, its value). With the two dozen
settings of an ordinary application that was 25-40 ms of every ``run()`` on these cores,
a sixth of the time from ``run()`` to every node in ``map_fun``.

The JVM's ``SparkConf.toDebugString`` gives every setting in one string, one ``key=value``
line each, sorted, with values Spark considers sensitive (a key or value matching
``spark.redaction.regex``) replaced. Those few are read back one by one with ``get``; a
value holding a line break makes the lines outnumber the settings, and then the settings
are read the slow way, element by element, which is exact.
"""

from __future__ import annotations

from typing import Any

#: What ``Utils.redact`` puts in place of a sensitive value (Spark 3 and 4).
REDACTED = "*********(redacted)"


def read_settings(sc: Any) -> dict[str, str]:
    """Every setting of ``sc``'s application, as ``sc.getConf().getAll()`` gives them."""
    jsc = getattr(sc, "_jsc", None)
    if jsc is None:  # not a live SparkContext: anything that offers SparkContext's getConf()
        return dict(sc.getConf().getAll())
    jconf = jsc.sc().conf()  # the live SparkConf (``getConf()`` would clone it)
    text: str = jconf.toDebugString()
    lines = text.split("\n") if text else []
    if len(lines) != len(jconf.getAll()) or any("=" not in line for line in lines):
        # A value with a line break in it: its lines cannot be told from settings.
        return {str(e._1()): str(e._2()) for e in jconf.getAll()}
    settings = dict(line.split("=", 1) for line in lines)
    for key, value in settings.items():
        if value == REDACTED:
            settings[key] = jconf.get(key)
    return settings
