"""Port reservation without the bind-then-close race.

Every peer (TensorFlowOnSpark, tfmesos2) binds port 0, reads the number, closes
the socket and later lets TensorFlow bind it again: in between, any process on the
host can take it. We bind and *keep the socket open* until the moment TensorFlow
is about to start (``release()``), so the port stays ours for the whole reservation.
"""

from __future__ import annotations

import socket


class PortReservation:
    """A bound (not listening) TCP socket holding a port for TensorFlow.

    Args:
        port: the port to hold; 0 picks a free one (``TENSORFLOW_PORT`` is honoured by callers).
        host: the interface to bind; TensorFlow's gRPC server binds all interfaces.
        granted: the port was granted to this node alone by a scheduler (a Mesos offer). The
            task that had it before may have left connections in TIME_WAIT, which refuse a
            plain bind for a minute; SO_REUSEADDR lets us bind past them (a socket still
            listening there refuses us all the same). Nobody else is offered the port, so the
            race above does not arise.
    """

    def __init__(self, port: int = 0, host: str = "", *, granted: bool = False) -> None:
        self._sock: socket.socket | None = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if granted:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            # No SO_REUSEADDR: it would let another socket bind the same port on Linux
            # while ours lingers, which is the very race we are avoiding.
            self._sock.bind((host, port))
        except OSError as e:
            self._sock.close()
            self._sock = None
            raise OSError(
                e.errno,
                f"cannot reserve port {port} on {host or 'all interfaces'}: "
                f"{e.strerror} (is TENSORFLOW_PORT already in use?)",
            ) from e
        self.port: int = self._sock.getsockname()[1]

    @property
    def held(self) -> bool:
        return self._sock is not None

    @property
    def socket(self) -> socket.socket | None:
        """The bound socket holding the port, None once released (TensorFlowOnSpark's ``ctx.tmp_socket``)."""
        return self._sock

    def release(self) -> None:
        """Free the port so TensorFlow can bind it. Safe to call twice."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> PortReservation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
