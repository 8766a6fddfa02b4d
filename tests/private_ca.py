"""A private certificate authority for tests: what an on-premises S3 endpoint (MinIO, Ceph RGW)
serves, a certificate no default trust store knows.

``PrivateCA()`` makes a CA and ``issue(hosts)`` a serving certificate for DNS names or IP
addresses; ``server_context(leaf)`` is the ``ssl.SSLContext`` a loopback server (moto's, tests/s3.py)
serves it with. Keys are ECDSA P-256: quick to make, as every test session makes its own.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Leaf:
    """A serving certificate and its key, PEM."""

    cert_pem: str
    key_pem: str


CA_KEY_USAGE = x509.KeyUsage(
    digital_signature=True,
    content_commitment=False,
    key_encipherment=False,
    data_encipherment=False,
    key_agreement=False,
    key_cert_sign=True,
    crl_sign=True,
    encipher_only=False,
    decipher_only=False,
)


class PrivateCA:
    """A self-signed CA (basicConstraints CA:TRUE), valid from a day ago for a year."""

    def __init__(self, name: str = "kubedgx test private CA") -> None:
        self._key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=365))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(CA_KEY_USAGE, critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        self.pem = self._cert.public_bytes(serialization.Encoding.PEM).decode("ascii")

    def issue(self, hosts: Sequence[str]) -> Leaf:
        """A serving certificate for ``hosts`` (DNS names or IP addresses), signed by this CA."""
        key = ec.generate_private_key(ec.SECP256R1())
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        key_pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode("ascii")
        return Leaf(cert.public_bytes(serialization.Encoding.PEM).decode("ascii"), key_pem)


def server_context(leaf: Leaf) -> ssl.SSLContext:
    """A TLS server context serving ``leaf`` (the files it is loaded from are removed at once)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with tempfile.TemporaryDirectory(prefix="kubedgx-test-tls-") as directory:
        cert, key = Path(directory) / "tls.crt", Path(directory) / "tls.key"
        cert.write_text(leaf.cert_pem, encoding="ascii")
        key.write_text(leaf.key_pem, encoding="ascii")
        context.load_cert_chain(cert, key)
    return context
