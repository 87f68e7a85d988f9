"""What every tfcoord entry point shares: exit codes, the environment's names, logging set-up,
client TLS from the environment, and the rule that turns an error into one line.

Two programs start here: the command line (``tfcoord``, top layer) and the node
(``python -m tfcoord.node`` / ``tfcoord-node``, which a Spark executor or a Mesos task runs
with only tfcoord-client and tfcoord-node installed). They read flags and environment at
their entry point and nowhere below it (STYLE.md, 9); this module is what both need to do
that the same way, so a node started alone answers a mistake exactly as ``tfcoord node``.
"""

from __future__ import annotations

import enum
import json
import logging
import ssl
import sys
from collections.abc import Callable, Mapping
from typing import Any

from . import tls
from .errors import (
    AuthenticationFailed,
    ConnectionClosed,
    DeadlineExceeded,
    ProtocolError,
    RequestRejected,
    TfcoordError,
    TlsError,
    Unreachable,
)
from .terminal import TRACEBACK, printable

ADDRESS_ENV = "TFCOORD_ADDRESS"
SECRET_FILE_ENV = "TFCOORD_SECRET_FILE"
#: Client-side TLS: the CA that signed the coordinator's certificate, and this client's
#: own certificate and key when the coordinator demands them (mutual TLS).
TLS_CA_ENV = "TFCOORD_TLS_CA"
TLS_CA_PEM_ENV = tls.CA_PEM_ENV
TLS_CERT_ENV = "TFCOORD_TLS_CERT"
TLS_KEY_ENV = "TFCOORD_TLS_KEY"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class ExitCode(enum.IntEnum):
    """Exit codes of every tfcoord program (docs/src/reference/cli.md)."""

    OK = 0
    FAILED = 1  # the job failed, or the coordinator refused the request
    USAGE = 2  # bad flags, environment or files: the message says what to change
    UNREACHABLE = 3  # no answer from the coordinator: refused, no such host, timed out
    STOPPED = 4  # the job was stopped (tfcoord stop, a stop from the dashboard) before it ended
    INTERRUPTED = 130  # Ctrl-C (SIGINT): a job this command ran is stopped first
    #: The reader of stdout went away (``tfcoord logs JOB | head``): nothing more to say, and
    #: no one to say it to. 141 is what a shell reports for a tool killed by SIGPIPE, which
    #: is how ``cat`` or ``grep`` end in the same pipeline (Python ignores SIGPIPE itself).
    PIPE_CLOSED = 141


class UsageError(Exception):
    """Bad flags or environment: printed as one line, exit code 2."""


def client_tls(env: Mapping[str, str]) -> ssl.SSLContext | None:
    """The client's TLS context from ``TFCOORD_TLS_*`` in ``env``; None (plaintext) when none is set.

    Raises:
        UsageError: a file is missing, unreadable, readable by others, or not what it should be.
    """
    ca, cert, key = (env.get(k) or None for k in (TLS_CA_ENV, TLS_CERT_ENV, TLS_KEY_ENV))
    ca_pem = env.get(TLS_CA_PEM_ENV) or None
    if ca is None and cert is None and key is None and ca_pem is None:
        return None
    try:
        return tls.client_context(ca, cert, key, ca_pem=ca_pem)
    except TlsError as e:
        raise UsageError(str(e)) from None


class JsonFormatter(logging.Formatter):
    """One JSON object a line, with the job and node lifted into fields of their own."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": record.created,
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        # The coordinator logs job changes as "job %s: ..."; lift the id into its own field.
        if isinstance(record.args, tuple) and record.args and str(record.msg).startswith("job %s"):
            out["job"] = record.args[0]
        for key in ("job", "node", "state"):  # structured fields the coordinator attaches (extra=)
            value = getattr(record, key, None)
            if value:
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


class TextFormatter(logging.Formatter):
    """Log lines for a terminal: what a record carries from a node (an error text, a task id)
    cannot drive the terminal; a traceback keeps its lines (JSON lines escape on their own)."""

    def format(self, record: logging.LogRecord) -> str:
        return printable(super().format(record), keep=TRACEBACK)


def setup_logging(fmt: str, level: str) -> None:
    """Log to stderr, as text or JSON lines, at ``level``."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def fail(code: int, message: str) -> int:
    """Print ``tfcoord: MESSAGE`` on stderr; returns ``code``.

    The message may carry a node's own text (a failed job's traceback, a coordinator's
    refusal naming a node's task id): its control characters are escaped, its lines kept.
    """
    print(f"tfcoord: {printable(message.strip(), keep=TRACEBACK)}", file=sys.stderr, flush=True)
    return code


def _pipe_closed() -> int:
    """Stdout's reader is gone: leave quietly, like other Unix tools in a closed pipeline.

    Python would flush stdout once more at exit and print an error on stderr about that
    flush; stdout now points at /dev/null so that last flush has nowhere to fail.
    """
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return ExitCode.PIPE_CLOSED


def run_entry(fn: Callable[[], int], *, debug: bool) -> int:
    """Run an entry point's command; every error becomes one line and a documented exit code.

    Only an error no rule names is "a tfcoord bug", with its traceback under ``debug``.
    """
    try:
        code = fn()
        sys.stdout.flush()  # here, where a reader that went away is caught, not at exit
        return code
    except UsageError as e:
        return fail(ExitCode.USAGE, str(e))
    except Unreachable as e:
        return fail(ExitCode.UNREACHABLE, str(e))
    except (AuthenticationFailed, TlsError, ProtocolError) as e:  # the wrong port, service or TLS setting
        return fail(ExitCode.USAGE, str(e))
    except (ConnectionClosed, DeadlineExceeded) as e:
        return fail(ExitCode.UNREACHABLE, f"{e}; is the coordinator running? (--timeout to wait longer)")
    except RequestRejected as e:
        return fail(ExitCode.FAILED, e.message)
    except TfcoordError as e:
        return fail(ExitCode.FAILED, str(e))
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED
    except BrokenPipeError:
        return _pipe_closed()
    except Exception as e:
        if debug:
            import traceback

            traceback.print_exc()
        return fail(
            ExitCode.FAILED,
            f"internal error: {type(e).__name__}: {e} "
            "(a tfcoord bug: run again with --debug for the traceback, and report it)",
        )
