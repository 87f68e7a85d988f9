"""The fake Mesos agent's fetcher: ``CommandInfo.uris`` put into a task's sandbox, for real.

A Mesos agent runs ``mesos-fetcher`` before a task's command starts; the fake master does
what it does, with the same rules, so a framework's URIs are tested as a real agent would
treat them:

* Each URI lands in the sandbox under ``output_file`` if given, else under the URI's last
  path component (Mesos' ``Fetcher::basename``: everything after the scheme read as a file
  path, query strings included). A URI with a backslash, a quote or a NUL is refused.
* ``file://`` URIs and absolute paths are copied. ``http://`` and ``https://`` are downloaded
  the way the fetcher's libcurl does: redirects followed, ``user:password@`` in the URI sent
  as HTTP Basic, TLS verified against the agent's trust store (the system's, plus
  ``ca_file`` for an agent an operator gave a CA), and anything but a 200 is a failure
  (``Error downloading resource, received HTTP return code N``). Other schemes (``hdfs://``,
  ``ftp://``, which a real agent hands to Hadoop or libcurl) fail here with a reason.
* ``executable``: the file is made executable (``rwxr-xr-x``) and never extracted.
  ``extract`` (the default): ``.tar``, ``.tgz``, ``.tar.gz``, ``.tbz2``, ``.tar.bz2``,
  ``.txz``, ``.tar.xz`` and ``.zip`` are unpacked into the sandbox, a bare ``.gz`` is
  gunzipped beside it, anything else is left as it is (Mesos logs a warning).
* ``cache`` is accepted and ignored: every fetch goes straight to the sandbox (a real
  agent's cache changes where bytes come from, not what the task sees).

A failure of any URI fails the task before its command starts; the fake master reports
TASK_FAILED with ``REASON_CONTAINER_LAUNCH_FAILED``, as an agent does.
"""

from __future__ import annotations

import base64
import gzip
import os
import shutil
import ssl
import tarfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

#: What a real agent's fetcher gives up on (its --fetcher_stall_timeout defaults to 60 s).
STALL_TIMEOUT_S = 60.0
#: Largest download the fake agent takes: a test never needs more.
MAX_DOWNLOAD_BYTES = 256 * 1024 * 1024

_TAR_SUFFIXES = (".tar", ".tgz", ".tar.gz", ".tbz2", ".tar.bz2", ".txz", ".tar.xz")


class FetchError(Exception):
    """One URI could not be fetched; the message says which and why."""


def basename(uri: str) -> str:
    """The sandbox file name of ``uri`` without ``output_file`` (Mesos' ``Fetcher::basename``)."""
    if any(c in uri for c in ("\\", "'", "\0")):
        raise FetchError(f"Illegal characters in URI {uri!r}")
    scheme_end = uri.find("://")
    rest = uri[scheme_end + 3 :] if scheme_end > 1 else uri
    name = rest.rstrip("/").rpartition("/")[2]
    if not name:
        raise FetchError(f"Malformed URI (no file name): {uri!r}")
    return name


def _download(uri: str, dest: Path, ca_file: str | None) -> None:
    parts = urlsplit(uri)
    headers = {"User-Agent": "fake-mesos-fetcher"}
    if parts.username is not None:
        raw = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        headers["Authorization"] = "Basic " + base64.b64encode(raw).decode()
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{parts.port}" if parts.port else host
    plain = urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))
    context = ssl.create_default_context(cafile=ca_file) if parts.scheme == "https" else None
    request = urllib.request.Request(plain, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=STALL_TIMEOUT_S, context=context) as resp:
            if resp.status != 200:
                raise FetchError(f"Error downloading resource, received HTTP return code {resp.status}")
            data = resp.read(MAX_DOWNLOAD_BYTES + 1)
    except urllib.error.HTTPError as e:
        raise FetchError(f"Error downloading resource, received HTTP return code {e.code}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise FetchError(f"Error downloading resource: {reason}") from None
    if len(data) > MAX_DOWNLOAD_BYTES:
        raise FetchError(f"Error downloading resource: more than {MAX_DOWNLOAD_BYTES} bytes")
    dest.write_bytes(data)


def _extract(path: Path, sandbox: Path) -> None:
    name = path.name
    try:
        if name.endswith(_TAR_SUFFIXES):
            with tarfile.open(path) as tar:
                tar.extractall(sandbox, filter="data")
        elif name.endswith(".zip"):
            with zipfile.ZipFile(path) as z:
                for member in z.namelist():
                    target = (sandbox / member).resolve()
                    if not target.is_relative_to(sandbox.resolve()):
                        raise FetchError(f"Failed to extract archive '{path}': {member} leaves the sandbox")
                z.extractall(sandbox)
        elif name.endswith(".gz"):
            with gzip.open(path) as src, open(sandbox / name[: -len(".gz")], "wb") as out:
                shutil.copyfileobj(src, out)
    except (tarfile.TarError, zipfile.BadZipFile, OSError, EOFError) as e:
        raise FetchError(f"Failed to extract archive '{path}' to '{sandbox}': {e}") from None


def fetch_one(uri: dict[str, Any], sandbox: Path, *, ca_file: str | None = None) -> Path:
    """Fetch one ``CommandInfo.URI`` into ``sandbox``; returns the file it made.

    Raises:
        FetchError: the URI is malformed, unreachable, refused (not a 200) or not extractable.
    """
    value = str(uri.get("value") or "").lstrip()
    if not value:
        raise FetchError("A URI with an empty value")
    output = uri.get("output_file")
    name = str(output) if output else basename(value)
    dest = sandbox / name
    if not dest.resolve().is_relative_to(sandbox.resolve()):
        raise FetchError(f"output_file {name!r} leaves the sandbox")
    dest.parent.mkdir(parents=True, exist_ok=True)
    scheme = value.partition("://")[0].lower() if "://" in value else ""
    if scheme in ("", "file"):
        path = value[len("file://") :] if scheme == "file" else value
        if not path.startswith("/"):
            raise FetchError(
                f"A relative path was passed for the resource but the agent has no frameworks home: {value}"
            )
        try:
            shutil.copyfile(path, dest)
        except OSError as e:
            raise FetchError(f"Failed to copy '{path}': {e}") from None
    elif scheme in ("http", "https"):
        _download(value, dest, ca_file)
    else:
        raise FetchError(f"the fake agent fetches file, http and https URIs, not {scheme}:// ({value})")
    if uri.get("executable"):
        os.chmod(dest, 0o755)
    elif uri.get("extract", True):
        _extract(dest, sandbox)
    return dest


def fetch_uris(uris: Iterable[dict[str, Any]], sandbox: Path, *, ca_file: str | None = None) -> list[Path]:
    """Fetch every URI in order, as ``mesos-fetcher`` does; the first failure ends it."""
    return [fetch_one(u, sandbox, ca_file=ca_file) for u in uris]
