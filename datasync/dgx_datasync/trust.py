"""Which certificate authorities a TLS connection to an object store trusts.

S3-compatible stores run on premises (MinIO, Ceph RGW) usually serve certificates of a private CA,
which no default trust store holds. The cluster admin gives kubedgx that CA once (the Helm chart's
``caBundle``); the operator passes its PEM to every sync container in ``KUBEDGX_CA_BUNDLE_PEM``
(the containers run in users' namespaces, where no ConfigMap of the operator's can be mounted), and
lists the stores with the same environment itself.

The private CAs are *added* to the defaults, never put in their place: a job may read a data set
from AWS S3 and write checkpoints to an on-premises MinIO. botocore verifies against one file (its
``verify``), so the file handed to it is botocore's own default bundle (certifi's, or the one
botocore ships) followed by the private CAs, written to a private temporary directory for as long
as the store is used.

Covered: every ``s3://`` request (AWS and any ``--endpoint-url``). Not covered: ``gs://``: gcsfs
builds its own aiohttp session from aiohttp's default context, created when aiohttp is imported,
with no per-filesystem trust setting short of handing it an aiohttp connector, which this package
does not import (pyproject.toml's contracts); Google's endpoint needs no private CA.
"""

from __future__ import annotations

import contextlib
import os
import re
import ssl
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Final

#: The variable that carries the PEM (certificates only) into a sync container, and into the
#: environment the operator lists stores with.
PEM_ENV: Final = "KUBEDGX_CA_BUNDLE_PEM"
#: Larger bundles are refused: the PEM is copied into every sync container's environment, and one
#: environment string may not exceed 128 KiB on Linux (MAX_ARG_STRLEN). A few private CAs take a
#: few KiB; a whole system bundle (over 200 KiB) does not belong here, it is added to anyway.
MAX_BYTES: Final = 64 * 1024

_BLOCK = re.compile(r"-----BEGIN CERTIFICATE-----\r?\n[A-Za-z0-9+/=\r\n]+?-----END CERTIFICATE-----")
_ANY_BLOCK = re.compile(r"-----BEGIN ([A-Z0-9 ]+)-----")


def certificates(pem: str) -> str:
    """The CA certificates of ``pem``, one PEM block after another: text around them (comments,
    ``openssl x509 -text`` output) dropped. Raises ValueError, saying what to fix, when there is
    none, when one does not parse, when the text holds a key or another kind of block, or when it is
    larger than :data:`MAX_BYTES`."""
    if len(pem.encode("utf-8", errors="replace")) > MAX_BYTES:
        raise ValueError(
            f"is {len(pem.encode('utf-8', errors='replace'))} bytes, more than {MAX_BYTES}: give only the "
            "private CAs (they are added to the default trust store, which need not be copied in)"
        )
    kinds = sorted({kind for kind in _ANY_BLOCK.findall(pem) if kind != "CERTIFICATE"})
    if kinds:
        raise ValueError(f"holds a {', '.join(kinds)} block: give only CA certificates (BEGIN CERTIFICATE)")
    blocks = [block.replace("\r\n", "\n") for block in _BLOCK.findall(pem)]
    if not blocks:
        raise ValueError("holds no PEM certificate (-----BEGIN CERTIFICATE----- ... -----END CERTIFICATE-----)")
    text = "\n".join(blocks) + "\n"
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=text)
    except ssl.SSLError as exc:
        raise ValueError(f"a certificate does not parse ({exc.reason or exc}): check the PEM") from None
    return text


def default_bundle() -> Path:
    """The file botocore verifies against when nobody says otherwise (certifi's bundle when certifi
    is installed, else the one botocore ships)."""
    from botocore.httpsession import get_cert_path

    return Path(get_cert_path(True))


def write_bundle(pem: str, directory: str | os.PathLike[str]) -> Path:
    """``directory``/ca-bundle.pem: the default bundle followed by the certificates of ``pem``
    (checked by :func:`certificates`). Mode 0600: nobody else's business what this process trusts."""
    extra = certificates(pem)
    path = Path(directory) / "ca-bundle.pem"
    defaults = default_bundle().read_text(encoding="utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(defaults.rstrip("\n") + "\n")
        handle.write("# kubedgx: the private CAs of KUBEDGX_CA_BUNDLE_PEM (the chart's caBundle)\n")
        handle.write(extra)
    return path


@contextlib.contextmanager
def bundle_for(env: Mapping[str, str]) -> Iterator[str | None]:
    """The bundle file for ``env``'s KUBEDGX_CA_BUNDLE_PEM while the block runs (removed after), or
    None when the variable is unset or empty: the default trust store is used as it is. A PEM that
    :func:`certificates` refuses raises ValueError."""
    pem = (env.get(PEM_ENV) or "").strip()
    if not pem:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="kubedgx-trust-") as directory:
        yield str(write_bundle(pem, directory))
