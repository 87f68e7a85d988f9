"""The fake agent's fetcher (tests/mesos/fetcher.py) against real files and real HTTP(S) servers."""

from __future__ import annotations

import base64
import gzip
import io
import ssl
import stat
import tarfile
import threading
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.integration.pki import Authority
from tests.mesos.fetcher import FetchError, basename, fetch_one, fetch_uris


class _Files(BaseHTTPRequestHandler):
    """Serves ``files`` (path -> bytes) to requests with HTTP Basic ``alice:s3cret``."""

    files: dict[str, bytes] = {}
    seen: list[str | None] = []

    def do_GET(self) -> None:
        auth = self.headers.get("Authorization")
        self.seen.append(auth)
        if auth != "Basic " + base64.b64encode(b"alice:s3cret").decode():
            self.send_response(401)
            self.end_headers()
            return
        if self.path == "/moved":
            self.send_response(302)
            self.send_header("Location", "/files/a.txt")
            self.end_headers()
            return
        body = self.files.get(self.path)
        self.send_response(200 if body is not None else 404)
        self.end_headers()
        if body is not None:
            self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def _serve(context: ssl.SSLContext | None = None) -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Files)
    if context is not None:
        httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"{'https' if context else 'http'}://alice:s3cret@127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


@pytest.fixture
def http_base() -> Iterator[str]:
    _Files.seen = []
    yield from _serve()


def _tar_gz(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_basename_is_mesos_last_path_component_after_the_scheme() -> None:
    assert basename("https://u:p@host:1/v1/node-archive/x.pyz") == "x.pyz"
    assert basename("hdfs://nn/a/b.tar.gz") == "b.tar.gz"
    assert basename("/opt/data/file") == "file"
    with pytest.raises(FetchError, match="Illegal characters"):
        basename("http://host/a'b")


def test_local_files_are_copied_extracted_or_made_executable(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "pkg.tar.gz").write_bytes(_tar_gz({"inner/hello.txt": b"hi"}))
    (src / "notes.txt.gz").write_bytes(gzip.compress(b"gunzipped"))
    (src / "tool").write_bytes(b"#!/bin/sh\necho tool\n")
    zbuf = io.BytesIO()
    with zipfile.ZipFile(zbuf, "w") as z:
        z.writestr("z/inside.txt", "zipped")
    (src / "bundle.zip").write_bytes(zbuf.getvalue())
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    got = fetch_uris(
        [
            {"value": f"file://{src / 'pkg.tar.gz'}"},  # extract defaults to true
            {"value": str(src / "notes.txt.gz"), "extract": True},
            {"value": str(src / "tool"), "executable": True, "extract": True},  # executable wins
            {"value": str(src / "bundle.zip"), "extract": False, "output_file": "kept/as-is.zip"},
        ],
        sandbox,
    )
    assert [p.name for p in got] == ["pkg.tar.gz", "notes.txt.gz", "tool", "as-is.zip"]
    assert (sandbox / "inner" / "hello.txt").read_text() == "hi"
    assert (sandbox / "notes.txt").read_text() == "gunzipped"
    assert stat.S_IMODE((sandbox / "tool").stat().st_mode) == 0o755
    assert not (sandbox / "z").exists() and (sandbox / "kept" / "as-is.zip").is_file()
    with pytest.raises(FetchError, match="relative path"):
        fetch_one({"value": "relative/file"}, sandbox)
    with pytest.raises(FetchError, match="Failed to copy"):
        fetch_one({"value": str(src / "missing")}, sandbox)
    with pytest.raises(FetchError, match="leaves the sandbox"):
        fetch_one({"value": str(src / "tool"), "output_file": "../escape"}, sandbox)


def test_http_sends_the_uris_credentials_follows_redirects_and_needs_a_200(
    tmp_path: Path, http_base: str
) -> None:
    _Files.files = {"/files/a.txt": b"alpha", "/files/b.tar.gz": _tar_gz({"b/x": b"x"})}
    fetch_one({"value": f"{http_base}/files/a.txt", "extract": False}, tmp_path)
    assert (tmp_path / "a.txt").read_bytes() == b"alpha"
    fetch_one({"value": f"{http_base}/files/b.tar.gz"}, tmp_path)
    assert (tmp_path / "b" / "x").read_bytes() == b"x"
    fetch_one({"value": f"{http_base}/moved", "output_file": "moved.txt"}, tmp_path)
    assert (tmp_path / "moved.txt").read_bytes() == b"alpha"
    with pytest.raises(FetchError, match="received HTTP return code 404"):
        fetch_one({"value": f"{http_base}/files/none"}, tmp_path)
    with pytest.raises(FetchError, match="received HTTP return code 401"):
        fetch_one({"value": http_base.replace("s3cret", "wrong") + "/files/a.txt"}, tmp_path)
    without = http_base.replace("alice:s3cret@", "")
    with pytest.raises(FetchError, match="received HTTP return code 401"):
        fetch_one({"value": f"{without}/files/a.txt"}, tmp_path)
    assert None in _Files.seen  # no userinfo, no Authorization header
    with pytest.raises(FetchError, match="fetches file, http and https URIs, not hdfs"):
        fetch_one({"value": "hdfs://namenode/x"}, tmp_path)


def test_https_is_verified_against_the_agents_trust_store(tmp_path: Path) -> None:
    ca = Authority.create(tmp_path / "pki")
    leaf = ca.issue("files", server=True)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(leaf.cert, leaf.key)
    _Files.files = {"/files/a.txt": b"alpha"}
    served = _serve(context)
    base = next(served)
    try:
        with pytest.raises(FetchError, match="CERTIFICATE_VERIFY_FAILED"):
            fetch_one({"value": f"{base}/files/a.txt"}, tmp_path)
        fetch_one({"value": f"{base}/files/a.txt"}, tmp_path, ca_file=str(ca.cert))
        assert (tmp_path / "a.txt").read_bytes() == b"alpha"
    finally:
        served.close()
