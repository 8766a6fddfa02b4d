"""One error type with a reason a machine can act on and a line a person can act on.

fsspec back ends report the same store problem in several shapes: s3fs turns a botocore
``ClientError`` into ``PermissionError`` / ``FileNotFoundError`` / ``OSError`` and keeps the original
as ``__cause__``; connection problems arrive as botocore's own exceptions, unwrapped; gcsfs raises
``HttpError`` with a status code, and google-auth its own errors. :func:`classify` walks an exception's
chain and maps all of these to a :class:`SyncError` whose ``reason`` the operator can put into a
condition and whose ``message`` names the bucket or URI and the fix.

Anything it does not recognise it leaves alone (``None``): an unexpected exception should surface
with its traceback, not as a guessed reason.
"""

from __future__ import annotations

import asyncio
import re
import socket
import ssl

from dgx_api.stores import REASONS, Reason, SyncError, shown

__all__ = ["REASONS", "Reason", "SyncError", "bucket_not_found", "classify", "shown"]

# S3 error codes (as in the XML body; HEAD responses carry only the status, e.g. "403").
_BUCKET_MISSING = {"NoSuchBucket"}
_CREDENTIALS_INVALID = {
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "InvalidToken",
    "ExpiredToken",
    "TokenRefreshRequired",
    "InvalidClientTokenId",
    "AuthorizationHeaderMalformed",
}
_ACCESS_DENIED = {"AccessDenied", "AllAccessDisabled", "AccountProblem", "InvalidObjectState", "403"}
# The object was replaced (If-Match failed) or deleted since it was listed.
_CHANGED = {"PreconditionFailed", "412", "NoSuchKey"}
_TRANSIENT_CODES = {"SlowDown", "InternalError", "ServiceUnavailable", "RequestTimeout", "RequestTimeTooSkewed"}

# Exception class names (matched by name so that this module imports neither botocore nor aiohttp).
_NO_CREDENTIALS = {"NoCredentialsError", "PartialCredentialsError", "DefaultCredentialsError"}
_BAD_CREDENTIALS = {"RefreshError"}
_NETWORK = {
    "EndpointConnectionError",
    "ConnectTimeoutError",
    "ReadTimeoutError",
    "ConnectionClosedError",
    "ProxyConnectionError",
    "HTTPClientError",
    "ResponseStreamingError",
    "IncompleteReadError",
    "ClientConnectorError",
    "ClientConnectionError",
    "ClientOSError",
    "ServerDisconnectedError",
    "ClientPayloadError",
    "FSTimeoutError",
    "TransportError",
}


def _chain(exc: BaseException) -> list[BaseException]:
    """The exception, its causes and contexts, outermost first, each once."""
    seen: list[BaseException] = []
    todo = [exc]
    while todo and len(seen) < 16:
        current = todo.pop(0)
        if any(current is s for s in seen):
            continue
        seen.append(current)
        for nxt in (current.__cause__, current.__context__):
            if nxt is not None:
                todo.append(nxt)
    return seen


def _client_error(exc: BaseException) -> tuple[str, int] | None:
    """(code, HTTP status) of a botocore ``ClientError``-shaped exception."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return None
    error = response.get("Error") or {}
    status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode") or 0
    code = str(error.get("Code") or status or "")
    try:
        return code, int(status)
    except (TypeError, ValueError):
        return code, 0


def _http_status(exc: BaseException) -> int | None:
    """Status of a gcsfs ``HttpError`` (``.code``) or a similar exception with ``.status``."""
    if type(exc).__name__ not in {"HttpError", "ClientResponseError"}:
        return None
    for attr in ("code", "status"):
        value = getattr(exc, attr, None)
        if isinstance(value, int):
            return value
    return None


def classify(exc: BaseException, uri: str, bucket: str, *, endpoint: str | None = None) -> SyncError | None:
    """Map a store exception to a :class:`SyncError` about ``uri``; ``None`` when unrecognised."""
    where = f"the endpoint {endpoint}" if endpoint else "the object store"
    chain = _chain(exc)
    # A certificate the client does not accept arrives wrapped as a connection error (botocore's
    # SSLError around aiohttp's): it is no network trouble a retry outlives, and its fix is a CA.
    # (aiohttp's ClientConnectorCertificateError is an ssl.CertificateError too, without OpenSSL's words.)
    untrusted = [item for item in chain if isinstance(item, ssl.SSLCertVerificationError)]
    if untrusted:
        said = [str(getattr(item, "verify_message", None) or "") for item in untrusted]
        return certificate_untrusted(uri, where, next((s for s in said if s), "certificate verify failed"))
    for item in chain:
        if isinstance(item, SyncError):
            return item
        name = type(item).__name__
        # botocore quotes the whole request URL; the endpoint is named separately.
        detail = re.sub(r':?\s*"https?://[^"]*"', "", " ".join(str(item).split()))[:200]
        found = _client_error(item)
        status = found[1] if found else _http_status(item)
        code = found[0] if found else str(status or "")
        if code in _BUCKET_MISSING:
            return bucket_not_found(uri, bucket)
        google = uri.startswith("gs://")
        if name in _BAD_CREDENTIALS and google:
            refused = item.args[0] if item.args and isinstance(item.args[0], str) else detail
            return SyncError(
                "CredentialsInvalid",
                f"Google's token endpoint refused the service-account key for {uri} ({refused[:200] or name}): the key "
                "was deleted or disabled, or is not the account's; create a new key and put it into the "
                "credentials Secret (spec.credentialsSecretRef, key service-account.json)",
            )
        if code in _CREDENTIALS_INVALID or name in _BAD_CREDENTIALS or status == 401:
            fix = (
                "the service-account key in the credentials Secret "
                "(spec.credentialsSecretRef, key service-account.json)"
                if google
                else "the access key and secret in the credentials Secret (spec.credentialsSecretRef)"
            )
            return SyncError(
                "CredentialsInvalid", f"the store rejected the credentials for {uri} ({code or name}): check {fix}"
            )
        # gcsfs raises a bare OSError("Forbidden: <url>\n<GCS's message>") for a 403.
        forbidden = type(item) is OSError and str(item).startswith("Forbidden:")
        if code in _ACCESS_DENIED or status == 403 or forbidden:
            if google:
                denied = str(item).partition("\n")[2].strip()
                return SyncError(
                    "AccessDenied",
                    f"access denied to {uri} ({denied[:300] or 403}): grant the service account "
                    f"roles/storage.objectViewer (inputs) or roles/storage.objectAdmin (outputs) on bucket '{bucket}'",
                )
            return SyncError(
                "AccessDenied",
                f"access denied to {uri} ({code}): grant the credentials' identity list/read access "
                f"(and write access for outputs) on bucket '{bucket}'",
            )
        # gcsfs: a failed precondition (412) is a FileExistsError naming the URL, not a local file.
        if isinstance(item, FileExistsError) and item.filename is None and google:
            status = 412
        if code in _CHANGED or status == 412:
            return SyncError(
                "SourceChanged", f"an object under {uri} changed while it was being copied: run the sync again"
            )
        if status == 404 and type(item).__name__ == "HttpError" and "bucket" in detail.lower():
            return bucket_not_found(uri, bucket)
        if code in _TRANSIENT_CODES or (status is not None and status >= 500):
            return unreachable(uri, where, f"{code} {detail}".strip())
        if name in _NO_CREDENTIALS:
            return SyncError(
                "CredentialsMissing",
                f"no credentials found for {uri}: set spec.credentialsSecretRef or give the pod an identity "
                "(IRSA / workload identity)",
            )
        if name in _NETWORK or isinstance(item, socket.timeout | TimeoutError | asyncio.TimeoutError):
            return unreachable(uri, where, detail or name)
        if isinstance(item, ConnectionError):
            return unreachable(uri, where, detail or name)
    return None


def bucket_not_found(uri: str, bucket: str) -> SyncError:
    return SyncError("BucketNotFound", f"bucket '{bucket}' does not exist ({uri}): create it or fix spec.source")


def certificate_untrusted(uri: str, where: str, detail: str) -> SyncError:
    return SyncError(
        "CertificateUntrusted",
        f"the TLS certificate of {where} is not accepted for {uri} ({detail}): if a private CA signs it, "
        "give kubedgx that CA (the Helm chart's caBundle value, docs/datamounts.md); otherwise fix the "
        "endpoint's certificate",
    )


def unreachable(uri: str, where: str, detail: str) -> SyncError:
    return SyncError(
        "Unreachable",
        f"cannot reach {where} for {uri} ({detail}): check spec.endpoint, DNS and network policies; retrying may help",
        transient=True,
    )
