"""``TFCOORD_<FLAG>``: each ``serve`` flag read from the environment too (the command line wins)."""

from __future__ import annotations

import argparse
from typing import Any

from tfcoord.client.entry import UsageError


def env_name(flag: str) -> str:
    """The environment variable of a ``serve`` flag: ``--http-port`` is ``TFCOORD_HTTP_PORT``."""
    return "TFCOORD_" + flag.lstrip("-").upper().replace("-", "_")


#: What ``TFCOORD_<SWITCH>`` may say: a switch set to "0" must not read as on.
_SWITCH_VALUES = {
    "1": True,
    "true": True,
    "yes": True,
    "on": True,
    "0": False,
    "false": False,
    "no": False,
    "off": False,
}


def env_flags(sp: argparse.ArgumentParser, env: Any, *, skip: set[str]) -> None:
    """Let ``TFCOORD_<FLAG>`` set each flag of ``sp`` (a flag on the command line wins).

    argparse converts a string default with the flag's type, so a bad value is refused as
    the flag's would be; the message names the variable.
    """
    for action in sp._actions:  # argparse keeps no public list of a parser's actions
        flag = next((o for o in action.option_strings if o.startswith("--")), None)
        if (
            flag is None
            or flag in skip
            or flag in ("--help", "--json")
            or action.dest in ("log_level", "log_format", "debug")
        ):
            continue
        name = env_name(flag)
        action.help = (action.help or "") + f" [${name}]"
        value = env.get(name)
        if value is None or value == "":
            continue
        if isinstance(action, argparse._StoreTrueAction):  # a switch: argparse keeps no public type for it
            if value.lower() not in _SWITCH_VALUES:
                raise UsageError(f"{name}={value!r} is not a switch: set it to 1 or 0 (true/false, yes/no)")
            action.default = _SWITCH_VALUES[value.lower()]
            continue
        if action.type is not None and action.type is not str:
            try:
                action.type(value)  # type: ignore[operator]
            except (ValueError, argparse.ArgumentTypeError):
                raise UsageError(
                    f"{name}={value!r} is not a valid {flag}: fix it in the environment "
                    "(or the service's tfcoord.env)"
                ) from None
        action.default = value
