"""A throwaway certificate authority for TLS tests, made with the ``openssl`` command.

The standard library can use certificates but not make them, and the project depends on
nothing that can (``cryptography`` is not a dependency), so tests call the ``openssl``
binary every Debian image carries. Keys are EC P-256 (fast to make) and written mode
600, as tfcoord refuses key files that others can read. Certificates carry the
extensions strict verifiers ask for (key usage, subject and authority key ids), so
they stay valid if Python turns on stricter X.509 checks.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

#: Long enough for any test run, short enough that a leaked file is worthless soon.
VALID_DAYS = 2

_LEAF_EXT = """basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage={usage}
subjectKeyIdentifier=hash
authorityKeyIdentifier=keyid
subjectAltName={san}
"""


def have_openssl() -> bool:
    return shutil.which("openssl") is not None


def _run(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def _key(path: Path) -> None:
    _run("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(path))
    os.chmod(path, 0o600)


@dataclass(frozen=True)
class Leaf:
    cert: Path
    key: Path


@dataclass(frozen=True)
class Authority:
    """A CA that can sign server and client certificates."""

    cert: Path
    key: Path
    dir: Path

    @classmethod
    def create(cls, directory: Path, name: str = "tfcoord test CA") -> Authority:
        directory.mkdir(parents=True, exist_ok=True)
        key, cert = directory / "ca.key", directory / "ca.pem"
        _key(key)
        _run(
            "req",
            "-x509",
            "-new",
            "-key",
            str(key),
            "-out",
            str(cert),
            "-days",
            str(VALID_DAYS),
            "-subj",
            f"/CN={name}",
            "-config",
            os.devnull,
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
            "-addext",
            "subjectKeyIdentifier=hash",
        )
        return cls(cert, key, directory)

    def issue(self, name: str, *, server: bool) -> Leaf:
        """A certificate for ``name``: a server one valid for 127.0.0.1 and localhost, or a client one."""
        key, csr, cert = self.dir / f"{name}.key", self.dir / f"{name}.csr", self.dir / f"{name}.pem"
        ext = self.dir / f"{name}.ext"
        _key(key)
        _run("req", "-new", "-key", str(key), "-out", str(csr), "-subj", f"/CN={name}", "-config", os.devnull)
        san = "IP:127.0.0.1,DNS:localhost" if server else f"DNS:{name}"
        ext.write_text(_LEAF_EXT.format(usage="serverAuth" if server else "clientAuth", san=san))
        _run(
            "x509",
            "-req",
            "-in",
            str(csr),
            "-CA",
            str(self.cert),
            "-CAkey",
            str(self.key),
            "-CAcreateserial",
            "-out",
            str(cert),
            "-days",
            str(VALID_DAYS),
            "-extfile",
            str(ext),
        )
        return Leaf(cert, key)


@dataclass(frozen=True)
class Pki:
    """Everything the TLS tests need: our CA with a server and a client certificate, and a
    second, unrelated CA with a client certificate of its own."""

    ca: Authority
    server: Leaf
    client: Leaf
    other_ca: Authority
    stranger: Leaf

    @classmethod
    def create(cls, directory: Path) -> Pki:
        ca = Authority.create(directory / "ca")
        other = Authority.create(directory / "other", "someone else's CA")
        return cls(
            ca,
            ca.issue("coordinator", server=True),
            ca.issue("node-1", server=False),
            other,
            other.issue("intruder", server=False),
        )
