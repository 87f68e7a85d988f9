"""systemd's readiness protocol (sd_notify), written out in a few lines.

Under ``Type=notify`` systemd considers the coordinator started only when it says
``READY=1``, so units ordered after it (and ``systemctl start``) wait until the ports
are really open, not merely until the process exists. The protocol is one datagram of
``KEY=VALUE`` lines to the unix socket named by ``$NOTIFY_SOCKET`` (a leading ``@``
means the abstract namespace). The CLI reads the variable; this module only sends.
That is all libsystemd's ``sd_notify`` does for us, so no dependency is needed.
"""

from __future__ import annotations

import socket

#: A datagram to a local socket either goes at once or the socket is gone; never wait long.
SEND_TIMEOUT_S = 2.0


def notify(socket_path: str | None, **fields: str | int) -> bool:
    """Send ``KEY=VALUE`` lines (``READY=1``, ``STATUS=...``, ``STOPPING=1``) to systemd.

    Args:
        socket_path: the value of ``$NOTIFY_SOCKET``; None or empty means not under
            systemd, and nothing is sent.
        fields: keys as systemd names them, e.g. ``notify(path, READY=1, STATUS="listening")``.

    Returns:
        Whether a datagram was sent.

    Raises:
        OSError: the socket named by ``socket_path`` cannot be reached.
    """
    if not socket_path:
        return False
    address = "\0" + socket_path[1:] if socket_path.startswith("@") else socket_path
    message = "".join(f"{key}={str(value).replace(chr(10), ' ')}\n" for key, value in fields.items())
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        sock.settimeout(SEND_TIMEOUT_S)
        sock.connect(address)
        sock.sendall(message.encode())
    return True
