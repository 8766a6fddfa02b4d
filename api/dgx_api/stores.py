"""What an object-store address must look like, and the error the data plane reports a store
problem with: shared by the data plane (dgx_datasync, which re-exports all of it) and the operator's
validation, which checks ``spec.endpoint`` and ``spec.region`` of a DGXDataMount at admission and in
``kubedgx validate``. Here, in the contract, it needs no store client: ``pip install kubedgx`` for
``kubedgx validate`` pulls no fsspec, s3fs or gcsfs.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Final, Literal, get_args
from urllib.parse import urlsplit

from dgx_api.text import printable

Reason = Literal[
    "InvalidURI",
    "CredentialsMissing",
    "CredentialsInvalid",
    "AccessDenied",
    "BucketNotFound",
    "Unreachable",
    "CertificateUntrusted",
    "SourceChanged",
    "LocalError",
]

REASONS: Final[tuple[str, ...]] = get_args(Reason)


class SyncError(Exception):
    """A problem the user (or a retry) can fix, with a one-line message that says how.

    ``transient`` is true only for ``Unreachable`` (network trouble, 5xx): callers retry those and
    exit 1 when retries run out; every other reason exits 2 because retrying would not help.
    """

    def __init__(self, reason: str, message: str, transient: bool = False) -> None:
        if reason not in REASONS:
            raise ValueError(f"unknown SyncError reason {reason!r}")
        self.reason = reason
        # One line: it goes into a termination message and a Kubernetes condition.
        self.message = printable(" ".join(message.split()))
        self.transient = transient
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"SyncError({self.reason!r}, {self.message!r}, transient={self.transient})"


def shown(value: object) -> str:
    """An untrusted name as a message quotes it: in quotes (so it cannot pose as the message's own
    words), escaped as ``repr`` escapes (then as :func:`printable` does, for what repr leaves)."""
    return printable(repr(str(value)))


#: botocore's rules (utils.is_valid_endpoint_url, validate_region_name): what they refuse fails
#: later, inside a request, as an exception nobody can read.
_HOST = re.compile(r"^((?!-)[A-Za-z\d-]{1,63}(?<!-)\.)*((?!-)[A-Za-z\d-]{1,63}(?<!-))\.?$")
_REGION = re.compile(r"^(?![0-9]+$)(?!-)[a-zA-Z0-9-]{1,63}(?<!-)$")


def check_endpoint(url: str) -> None:
    """Refuse an endpoint no request can go to, as a SyncError no retry fixes (exit 2), before
    botocore refuses it as a ValueError or an endpoint-resolution error in the middle of a call."""
    hint = "give an http(s) URL such as https://minio.storage.svc:9000 (--endpoint-url / spec.endpoint)"

    # A password in the URL must not reach a termination message or a condition.
    display = re.sub(r"^([^:/?#]*://)[^/?#]*@", r"\1***@", url)

    def bad(why: str) -> SyncError:
        return SyncError("InvalidURI", f"invalid endpoint URL {shown(display)}: {why}: {hint}")

    if not url.isprintable() or any(c.isspace() for c in url):
        raise bad("it contains whitespace or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port
        host = parts.hostname
    except ValueError as exc:
        raise bad(str(exc)) from None
    if parts.scheme not in ("http", "https"):
        raise bad("the scheme must be http:// or https://")
    if not host:
        raise bad("it names no host")
    if parts.username is not None or parts.password is not None:
        raise bad("credentials do not belong in it (they go into the credentials Secret)")
    if parts.query or parts.fragment:
        raise bad("it has a query or a fragment")
    if port == 0:
        raise bad("port 0 is not a port")
    if parts.netloc.rpartition("@")[2].startswith("["):
        try:
            ipaddress.IPv6Address(host.partition("%")[0])
        except ValueError:
            raise bad(f"{shown(host)} is not an IPv6 address") from None
    elif len(host) > 255 or not _HOST.match(host):
        raise bad(f"{shown(host)} is not a host name (letters, digits, '-' and '.') or an IPv4 address")


def check_region(region: str) -> None:
    if not _REGION.match(region):
        raise SyncError(
            "InvalidURI",
            f"invalid region {shown(region)} (--region / spec.region): letters, digits and '-', such as us-east-1",
        )
