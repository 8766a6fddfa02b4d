"""A GCS JSON API on loopback for tests, as gcsfs's own tests get one: fake-gcs-server, built from its
Go module (github.com/fsouza/fake-gcs-server) once and cached outside the work tree, run as a process
on a free port, behind a small proxy of ours that does what the emulator does not:

- **authentication as GCS does it**: every request must carry ``Authorization: Bearer <token>`` for a
  token this proxy issued, or it is answered 401; the service account's role decides the rest (403
  for a write by a reader, for anything by an account without a role). Tokens come from the proxy's
  ``/token`` endpoint, the ``token_uri`` of the service-account key files :meth:`FakeGCS.key` writes:
  google-auth signs a JWT with the key's private key and exchanges it there, and the proxy checks the
  signature against the account's public key (``invalid_grant`` as Google answers a key that was
  deleted or forged). So the data plane's real credential path runs: key file -> google-auth -> token.
- **a request log, gates and faults**, the same shape tests/datasync gives moto's server: each request
  as a :class:`Hit` with the object it addresses and what it does (``get``, ``head``, ``list``,
  ``write``, ``part``, ``delete``), gates that hold chosen requests, 503s instead of the answer.

fake-gcs-server itself never sees a token (it accepts anything) and keeps its objects in memory.
The tests' own setup (:meth:`FakeGCS.put` and friends) goes to it directly, unlogged.

``python -m tests.gcs`` builds the binary if it is missing and prints where it is: a CI warm-up step.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import fcntl
import hashlib
import http.client
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.support.ports import free_port
from tests.support.timeouts import timeout_paused
from tests.support.wait import wait_until

MODULE = "github.com/fsouza/fake-gcs-server"
VERSION = "v1.56.1"
#: The build never fetches another Go toolchain and leaves no VCS stamp to vary the binary.
GO_ENV = {"GOTOOLCHAIN": "local", "GOFLAGS": "-buildvcs=false", "CGO_ENABLED": "0", "GOWORK": "off"}
PROJECT = "kubedgx-test"
#: Roles a test service account can have: what the proxy lets it do.
#: admin: roles/storage.objectAdmin; reader: roles/storage.objectViewer; creator:
#: roles/storage.objectCreator (uploads only: no listing, no reading, no deleting); none: no role.
ROLES = ("admin", "reader", "creator", "none")
_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailers",
    "transfer-encoding",
    "upgrade",
}


# -- building ----------------------------------------------------------------------------------------


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "kubedgx" / "fake-gcs-server"
    return Path(os.environ.get("KUBEDGX_FAKE_GCS_CACHE") or default)


def go() -> str | None:
    return shutil.which("go")


def _go_version() -> str:
    env = {**os.environ, **GO_ENV}
    out = subprocess.run(["go", "env", "GOVERSION"], env=env, capture_output=True, text=True, check=True, timeout=60)
    return out.stdout.strip()


@dataclass(frozen=True)
class Built:
    binary: Path
    seconds: float  # 0 when it was already built


def build(timeout_s: float = 1800) -> Built:
    """The fake-gcs-server binary of :data:`VERSION`, built with ``go install`` unless cached
    (``KUBEDGX_FAKE_GCS_SERVER`` names a binary to use instead)."""
    given = os.environ.get("KUBEDGX_FAKE_GCS_SERVER")
    if given:
        return Built(Path(given), 0.0)
    key = hashlib.sha256(f"{_go_version()} {MODULE}@{VERSION} {sorted(GO_ENV.items())}".encode()).hexdigest()[:16]
    cache = cache_dir()
    binary = cache / f"{VERSION}-{key}" / "fake-gcs-server"
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if binary.is_file():
            return Built(binary, 0.0)
        partial = Path(tempfile.mkdtemp(prefix="partial-", dir=cache))
        started = time.monotonic()
        out = subprocess.run(
            ["go", "install", f"{MODULE}@{VERSION}"],
            cwd=partial,
            env={**os.environ, **GO_ENV, "GOBIN": str(partial)},
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        if out.returncode != 0:
            shutil.rmtree(partial, ignore_errors=True)
            raise RuntimeError(f"go install {MODULE}@{VERSION} failed:\n{out.stdout}{out.stderr}")
        binary.parent.mkdir(parents=True, exist_ok=True)
        (partial / "fake-gcs-server").rename(binary)  # only a complete binary is ever found in the cache
        shutil.rmtree(partial, ignore_errors=True)
        return Built(binary, time.monotonic() - started)


# -- service accounts ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Account:
    email: str
    role: str
    key_id: str
    private_pem: str
    public_key: Any  # cryptography's RSAPublicKey

    def key_file(self, token_uri: str) -> dict[str, Any]:
        """The JSON of a service-account key as the Cloud console downloads it."""
        return {
            "type": "service_account",
            "project_id": PROJECT,
            "private_key_id": self.key_id,
            "private_key": self.private_pem,
            "client_email": self.email,
            "client_id": str(int(hashlib.sha256(self.email.encode()).hexdigest()[:15], 16)),
            "auth_uri": "https://accounts.google.com/o/oauth2/auth",
            "token_uri": token_uri,
            "auth_provider_x509_cert_url": "https://www.googleapis.com/oauth2/v1/certs",
            "universe_domain": "googleapis.com",
        }


def _rsa_key() -> tuple[str, Any]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode("ascii")
    return pem, key.public_key()


def _b64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


# -- the request log ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Hit:
    """One request to the store. ``op``: get (object bytes), head (object metadata), list, write (an
    object becomes visible: a one-shot upload, or the last chunk of a resumable one), part (an
    earlier chunk, or the start of a resumable upload), delete, other."""

    method: str
    path: str
    query: str
    op: str
    bucket: str | None
    key: str | None
    status: int = 0

    def key_in(self, bucket: str) -> str | None:
        return self.key if self.bucket == bucket else None


def _metadata_name(body: bytes) -> str | None:
    """The object name in an upload's metadata: a JSON body (a resumable upload's start) or the
    first part of a multipart/related body (a one-shot upload with metadata, as gcsfs sends)."""
    start = body.find(b"{", 0, 4096) if body.startswith(b"--") else (0 if body[:1] == b"{" else -1)
    if start < 0:
        return None
    try:
        metadata, _ = json.JSONDecoder().raw_decode(body[start : start + 65536].decode("utf-8", "replace"))
    except ValueError:
        return None
    name = metadata.get("name") if isinstance(metadata, dict) else None
    return name if isinstance(name, str) else None


def parse_request(method: str, raw_path: str, query: str, body: bytes) -> tuple[str, str | None, str | None]:
    """(op, bucket, key) of a GCS JSON API request (the paths gcsfs and the Google clients use)."""
    params = urllib.parse.parse_qs(query)
    path = raw_path
    for head in ("/download/storage/v1/b/", "/storage/v1/b/", "/upload/storage/v1/b/"):
        if path.startswith(head):
            rest = path[len(head) :]
            bucket, _, tail = rest.partition("/")
            bucket = urllib.parse.unquote(bucket)
            if tail in ("", "o", "o/"):
                if head == "/upload/storage/v1/b/":
                    name = (params.get("name") or [None])[0] or _metadata_name(body)
                    kind = (params.get("uploadType") or [""])[0]
                    if params.get("upload_id"):  # a chunk into a resumable session (gcsfs POSTs them)
                        return "chunk", bucket, name
                    if method == "POST":
                        return ("part" if kind == "resumable" else "write"), bucket, name
                    if method == "PUT":
                        return "chunk", bucket, name
                    return "other", bucket, name
                if tail == "" and method == "GET":
                    return "bucket", bucket, None
                return ("list" if method == "GET" else "other"), bucket, None
            if tail.startswith("o/"):
                key = urllib.parse.unquote(tail[2:])
                if method == "DELETE":
                    return "delete", bucket, key
                if method in ("GET", "HEAD"):
                    media = head == "/download/storage/v1/b/" or (params.get("alt") or [""])[0] == "media"
                    return ("get" if media and method == "GET" else "head"), bucket, key
                return "other", bucket, key
            return "other", bucket, None
    if path.startswith("/batch/"):
        return "batch", None, None
    return "other", None, None


class Gate:
    """Lets ``allow`` matching requests through, then holds the rest until :meth:`open`; ``action``
    runs once, in the proxy thread, when the gate first holds (then the gate opens)."""

    def __init__(self, match: Callable[[Hit], bool], allow: int = 0, action: Callable[[], None] | None = None):
        self.match = match
        self.allow = allow
        self.action = action
        self.passed = 0
        self.held = threading.Event()
        self._open = threading.Event()
        self._lock = threading.Lock()

    def check(self, hit: Hit) -> None:
        if not self.match(hit) or self._open.is_set():
            return
        with self._lock:
            if self.passed < self.allow:
                self.passed += 1
                return
            first = not self.held.is_set()
            self.held.set()
        if first and self.action is not None:
            self.action()
            self._open.set()
            return
        self._open.wait(timeout=120)

    def open(self) -> None:
        self._open.set()


@dataclass
class Fault:
    match: Callable[[Hit], bool]
    times: int
    status: int = 503
    served: int = 0


class RequestLog:
    """Every request a test store was sent, the status it was answered, and the gates and faults in
    force: the part both stores share (moto's WSGI middleware in tests/datasync and the proxy here
    each :meth:`record` a request as it arrives and :meth:`answer` it)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._hits: list[Hit] = []
        self._statuses: dict[int, int] = {}  # index in hits -> the status answered
        self._gates: list[Gate] = []
        self._faults: list[Fault] = []

    def record(self, hit: Hit) -> tuple[int, list[Gate], Fault | None]:
        """Log ``hit``: its index (for :meth:`answer`), the gates to pass, the fault to answer with."""
        with self.lock:
            self._hits.append(hit)
            fault = next((f for f in self._faults if f.served < f.times and f.match(hit)), None)
            if fault is not None:
                fault.served += 1
            return len(self._hits) - 1, list(self._gates), fault

    def answer(self, index: int, status: int) -> None:
        with self.lock:
            self._statuses[index] = status

    # -- what tests read and set -------------------------------------------------------------------

    @property
    def hits(self) -> list[Hit]:
        """Every request so far, with the status it was answered (0 while it is in flight)."""
        with self.lock:
            return [dataclasses.replace(h, status=self._statuses.get(i, 0)) for i, h in enumerate(self._hits)]

    def mark(self) -> int:
        with self.lock:
            return len(self._hits)

    def since(self, mark: int) -> list[Hit]:
        return self.hits[mark:]

    def object_gets(self, bucket: str, mark: int = 0) -> Counter[str]:
        """GET requests for object bodies in ``bucket`` since ``mark``, per key (listings excluded)."""
        found: Counter[str] = Counter()
        for hit in self.since(mark):
            if hit.op == "get" and hit.bucket == bucket and hit.key is not None:
                found[hit.key] += 1
        return found

    def object_writes(self, bucket: str, mark: int = 0) -> list[str]:
        """Keys written since ``mark``, in the order the objects became visible (a one-shot upload,
        or the request that completes a multipart or resumable one; their parts are not listed)."""
        return [h.key for h in self.since(mark) if h.op == "write" and h.bucket == bucket and h.key is not None]

    @contextlib.contextmanager
    def gate(
        self, match: Callable[[Hit], bool], allow: int = 0, action: Callable[[], None] | None = None
    ) -> Iterator[Gate]:
        g = Gate(match, allow, action)
        with self.lock:
            self._gates.append(g)
        try:
            yield g
        finally:
            g.open()
            with self.lock:
                self._gates.remove(g)

    @contextlib.contextmanager
    def fail(self, match: Callable[[Hit], bool], times: int, status: int = 503) -> Iterator[Fault]:
        """Answer ``times`` matching requests with ``status`` (an injected error) instead of the store."""
        fault = Fault(match, times, status)
        with self.lock:
            self._faults.append(fault)
        try:
            yield fault
        finally:
            with self.lock:
                self._faults.remove(fault)


class LoggedStore:
    """The request-log API of a test store, read from its :class:`RequestLog` (``self.requests``)."""

    requests: RequestLog

    @property
    def hits(self) -> list[Hit]:
        return self.requests.hits

    def mark(self) -> int:
        return self.requests.mark()

    def since(self, mark: int) -> list[Hit]:
        return self.requests.since(mark)

    def object_gets(self, bucket: str, mark: int = 0) -> Counter[str]:
        return self.requests.object_gets(bucket, mark)

    def object_writes(self, bucket: str, mark: int = 0) -> list[str]:
        return self.requests.object_writes(bucket, mark)

    def gate(
        self, match: Callable[[Hit], bool], allow: int = 0, action: Callable[[], None] | None = None
    ) -> contextlib.AbstractContextManager[Gate]:
        return self.requests.gate(match, allow, action)

    def fail(
        self, match: Callable[[Hit], bool], times: int, status: int = 503
    ) -> contextlib.AbstractContextManager[Fault]:
        return self.requests.fail(match, times, status)


@dataclass
class _State:
    requests: RequestLog = field(default_factory=RequestLog)
    accounts: dict[str, Account] = field(default_factory=dict)
    tokens: dict[str, str] = field(default_factory=dict)  # access token -> account email
    token_requests: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _error(code: int, message: str, reason: str) -> bytes:
    """The JSON error body GCS sends (gcsfs raises HttpError from its ``error.message``)."""
    return json.dumps(
        {
            "error": {
                "code": code,
                "message": message,
                "errors": [{"message": message, "domain": "global", "reason": reason}],
            }
        }
    ).encode()


def _permission(hit: Hit) -> str:
    if hit.op in ("get", "head"):
        return "storage.objects.get"
    if hit.op == "list":
        return "storage.objects.list"
    if hit.op == "delete":
        return "storage.objects.delete"
    if hit.op == "bucket":
        return "storage.buckets.get"
    return "storage.objects.create"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes: with Nagle's algorithm on, the body waits ~40 ms
    # for the client's delayed ACK, on every response.
    disable_nagle_algorithm = True
    server: _ProxyServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline().strip():
                        pass
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _reply(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_response(self, code: int, message: str | None = None) -> None:
        """Every answer goes through here: its status is recorded on the request's Hit."""
        index = getattr(self, "hit_index", None)
        if index is not None:
            self.server.state.requests.answer(index, code)
        super().send_response(code, message)

    def _handle(self) -> None:
        self.hit_index: int | None = None
        body = self._body()
        raw_path, _, query = self.path.partition("?")
        state = self.server.state
        if raw_path == "/token" and self.command == "POST":
            self._token(body)
            return
        op, bucket, key = parse_request(self.command, raw_path, query, body)
        if op == "chunk":  # a resumable upload's PUT: the one whose range ends at the total completes it
            content_range = self.headers.get("Content-Range", "")
            total = content_range.rpartition("/")[2]
            end = content_range.partition("-")[2].partition("/")[0]
            last = total != "*" and (end == "" or not end.isdigit() or int(end) + 1 == int(total))
            op = "write" if last else "part"
        hit = Hit(self.command, raw_path, query, op, bucket, key)
        self.hit_index, gates, fault = state.requests.record(hit)
        denied = self._authorize(hit)
        if denied is not None:
            self._reply(*denied)
            return
        if fault is not None:
            self._reply(fault.status, _error(fault.status, "injected by the test", "backendError"))
            return
        for gate in gates:
            gate.check(hit)
        self._forward(body)

    def _authorize(self, hit: Hit) -> tuple[int, bytes] | None:
        state = self.server.state
        auth = self.headers.get("Authorization", "")
        token = auth[len("Bearer ") :] if auth.startswith("Bearer ") else ""
        with state.lock:
            email = state.tokens.get(token)
            account = state.accounts.get(email or "")
        if account is None:
            return 401, _error(401, "Invalid Credentials", "authError")
        allowed = (
            account.role == "admin"
            or (account.role == "reader" and hit.op in ("get", "head", "list", "bucket"))
            or (account.role == "creator" and hit.op in ("write", "part"))
        )
        if not allowed:
            permission = _permission(hit)
            message = (
                f"{account.email} does not have {permission} access to the Google Cloud Storage "
                f"{'object' if hit.key else 'bucket'}. "
                f"Permission '{permission}' denied on resource (or it may not exist)."
            )
            return 403, _error(403, message, "forbidden")
        return None

    def _token(self, body: bytes) -> None:
        """OAuth 2.0's JWT bearer grant (RFC 7523), as oauth2.googleapis.com/token answers it."""
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import padding

        form = urllib.parse.parse_qs(body.decode("utf-8", "replace"))
        state = self.server.state

        def refuse(description: str) -> None:
            self._reply(400, json.dumps({"error": "invalid_grant", "error_description": description}).encode())

        assertion = (form.get("assertion") or [""])[0]
        try:
            header_b64, payload_b64, signature_b64 = assertion.split(".")
            header, payload = json.loads(_b64url(header_b64)), json.loads(_b64url(payload_b64))
            signature = _b64url(signature_b64)
        except ValueError:
            refuse("Invalid JWT: malformed assertion")
            return
        email = str(payload.get("iss", ""))
        with state.lock:
            state.token_requests[email] += 1
            account = state.accounts.get(email)
        if account is None:
            refuse("Invalid grant: account not found")
            return
        if header.get("kid") not in (None, account.key_id):
            refuse("Invalid JWT Signature.")
            return
        try:
            account.public_key.verify(
                signature, f"{header_b64}.{payload_b64}".encode(), padding.PKCS1v15(), hashes.SHA256()
            )
        except InvalidSignature:
            refuse("Invalid JWT Signature.")
            return
        if float(payload.get("exp", 0)) < time.time():
            refuse("Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable timeframe.")
            return
        token = "ya29.kubedgx-" + secrets.token_urlsafe(24)
        with state.lock:
            state.tokens[token] = email
        self._reply(200, json.dumps({"access_token": token, "expires_in": 3599, "token_type": "Bearer"}).encode())

    def _forward(self, body: bytes) -> None:
        upstream = self.server.upstream_connection()
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP and k.lower() != "content-length"}
        headers["Content-Length"] = str(len(body))
        try:
            upstream.request(self.command, self.path, body=body, headers=headers)
            response = upstream.getresponse()
        except (OSError, http.client.HTTPException):
            self.server.drop_upstream_connection()
            raise
        self.send_response(response.status, response.reason)
        length = response.getheader("Content-Length")
        for name, value in response.getheaders():
            if name.lower() not in _HOP and name.lower() != "content-length":
                self.send_header(name, value)
        if self.command == "HEAD" or response.status in (204, 304):
            response.read()
            self.send_header("Content-Length", length or "0")
            self.end_headers()
            return
        if length is not None:
            self.send_header("Content-Length", length)
            self.end_headers()
            while chunk := response.read(2**20):
                self.wfile.write(chunk)
        else:
            data = response.read()
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _handle  # noqa: N815 - http.server's names


class _ProxyServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, upstream_port: int, state: _State) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.upstream_port = upstream_port
        self.state = state
        self._local = threading.local()

    def upstream_connection(self) -> http.client.HTTPConnection:
        connection = getattr(self._local, "connection", None)
        if connection is None:
            connection = http.client.HTTPConnection("127.0.0.1", self.upstream_port, timeout=120)
            self._local.connection = connection
        return connection

    def drop_upstream_connection(self) -> None:
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            connection.close()
        self._local.connection = None


# -- the server --------------------------------------------------------------------------------------


class FakeGCS(LoggedStore):
    """fake-gcs-server on a free loopback port behind the authenticating, logging proxy.

    ``endpoint`` is the proxy's URL (what the data plane is given as ``--endpoint-url``);
    ``upstream`` the emulator's own, for the tests' setup. Buckets: :meth:`bucket` makes a new one
    with a unique name (tests never share a bucket, the server is never reset)."""

    scheme = "gs"

    def __init__(self, binary: Path, *, ready_timeout: float = 60) -> None:
        self.state = _State()
        self.requests = self.state.requests
        port = free_port()
        self.proxy = _ProxyServer(port, self.state)
        self.endpoint = f"http://127.0.0.1:{self.proxy.server_port}"
        self.upstream = f"http://127.0.0.1:{port}"
        self.token_uri = f"{self.endpoint}/token"
        self.directory = Path(tempfile.mkdtemp(prefix="kubedgx-fake-gcs-"))
        self.log_path = self.directory / "fake-gcs-server.log"
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [
                    str(binary),
                    "-scheme",
                    "http",
                    "-host",
                    "127.0.0.1",
                    "-port",
                    str(port),
                    "-backend",
                    "memory",
                    # Resumable uploads continue at the Location it returns: through the proxy.
                    "-external-url",
                    self.endpoint,
                    "-log-level",
                    "warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        self.thread = threading.Thread(target=self.proxy.serve_forever, name="fake-gcs-proxy", daemon=True)
        self.thread.start()
        try:
            self._wait_ready(ready_timeout)
        except BaseException:
            self.stop()
            raise
        self.accounts: dict[str, Account] = {}
        for role in ROLES:
            self.account(role)
        self.keys_directory = self.directory / "keys"
        self.keys_directory.mkdir(mode=0o700)
        self.key_files = {role: self.key(self.keys_directory, role) for role in ROLES}

    def env(self, role: str = "admin") -> dict[str, str]:
        """The credential environment of a data-sync container whose Secret holds ``role``'s key."""
        return {"GOOGLE_APPLICATION_CREDENTIALS": str(self.key_files[role])}

    def cli_args(self) -> list[str]:
        return ["--endpoint-url", self.endpoint]

    def options(self, role: str = "admin") -> Any:
        from dgx_datasync import StoreOptions

        return StoreOptions(endpoint_url=self.endpoint, env=self.env(role))

    def uri(self, bucket: str, prefix: str = "") -> str:
        return f"gs://{bucket}/{prefix}" if prefix else f"gs://{bucket}"

    def _wait_ready(self, timeout: float) -> None:
        def healthy() -> bool:
            if self.process.poll() is not None:
                raise RuntimeError(f"fake-gcs-server exited with {self.process.returncode}: {self.log()}")
            with urllib.request.urlopen(f"{self.upstream}/_internal/healthcheck", timeout=2) as response:
                return bool(response.status == 200)

        wait_until(
            healthy,
            timeout=timeout,
            what="fake-gcs-server to answer its healthcheck",
            retry_on=(OSError, urllib.error.URLError),
            diagnose=self.log,
            error=RuntimeError,
        )

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")[-4000:]

    def stop(self) -> None:
        self.proxy.shutdown()
        self.proxy.server_close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        shutil.rmtree(self.directory, ignore_errors=True)

    # -- identities --------------------------------------------------------------------------------

    def account(self, role: str) -> Account:
        """The service account with ``role`` (one per role, made once)."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}")
        if role not in self.accounts:
            pem, public = _rsa_key()
            found = Account(f"datasync-{role}@{PROJECT}.iam.gserviceaccount.com", role, uuid.uuid4().hex, pem, public)
            with self.state.lock:
                self.state.accounts[found.email] = found
            self.accounts[role] = found
        return self.accounts[role]

    def key(self, directory: Path, role: str = "admin", *, forged: bool = False) -> Path:
        """A service-account key file for ``role`` in ``directory``, as a pod mounts it. ``forged``:
        the same account and key id with another private key (a deleted or tampered key)."""
        account = self.account(role)
        data = account.key_file(self.token_uri)
        if forged:
            data["private_key"] = _rsa_key()[0]
        path = Path(directory) / f"{role}{'-forged' if forged else ''}-key.json"
        path.write_text(json.dumps(data, indent=2), encoding="utf-8")
        path.chmod(0o600)
        return path

    def key_json(self, role: str = "admin") -> str:
        return json.dumps(self.account(role).key_file(self.token_uri))

    def token_requests(self, role: str) -> int:
        with self.state.lock:
            return self.state.token_requests[self.account(role).email]

    # -- setup, straight to the emulator ----------------------------------------------------------

    def _call(self, method: str, path: str, body: bytes | None = None, headers: Mapping[str, str] | None = None,
              *, raw: bool = False) -> Any:  # fmt: skip
        """The decoded JSON answer, or with ``raw`` the bytes as they came (an object's content: random
        test data starts with ``{`` one time in 256, and was once taken for JSON)."""
        request = urllib.request.Request(
            f"{self.upstream}{path}", data=body, method=method, headers=dict(headers or {})
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            data = response.read()
        if raw:
            return data
        return json.loads(data) if data[:1] == b"{" else data

    def create_bucket(self, name: str) -> None:
        self._call(
            "POST",
            f"/storage/v1/b?project={PROJECT}",
            json.dumps({"name": name}).encode(),
            {"Content-Type": "application/json"},
        )

    def bucket(self, prefix: str = "kubedgx", objects: Mapping[str, bytes] | None = None) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        self.create_bucket(name)
        self.put_many(name, objects or {})
        return name

    def put(self, bucket: str, key: str, data: bytes) -> dict[str, Any]:
        quoted = urllib.parse.quote(key, safe="")
        result: dict[str, Any] = self._call(
            "POST",
            f"/upload/storage/v1/b/{bucket}/o?uploadType=media&name={quoted}",
            data,
            {"Content-Type": "application/octet-stream"},
        )
        return result

    def put_many(self, bucket: str, objects: Mapping[str, bytes], workers: int = 8) -> None:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(lambda kv: self.put(bucket, kv[0], kv[1]), objects.items()))

    def info(self, bucket: str, key: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/storage/v1/b/{bucket}/o/{urllib.parse.quote(key, safe='')}")
        return result

    def get(self, bucket: str, key: str) -> bytes:
        data: bytes = self._call(
            "GET", f"/download/storage/v1/b/{bucket}/o/{urllib.parse.quote(key, safe='')}?alt=media", raw=True
        )
        return data

    def version(self, bucket: str, key: str) -> str:
        """What a listing records for the object (its generation)."""
        return str(self.info(bucket, key)["generation"])

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        out: list[str] = []
        token = ""
        while True:
            query = urllib.parse.urlencode({"prefix": prefix, **({"pageToken": token} if token else {})})
            page = self._call("GET", f"/storage/v1/b/{bucket}/o?{query}")
            out += [item["name"] for item in page.get("items", [])]
            token = page.get("nextPageToken") or ""
            if not token:
                return sorted(out)


@pytest.fixture(scope="session")
def gcs() -> Iterator[FakeGCS]:
    """The session's fake-gcs-server (built on first use; skips, saying why, without Go)."""
    if go() is None and not os.environ.get("KUBEDGX_FAKE_GCS_SERVER"):
        pytest.skip("no Go toolchain: fake-gcs-server cannot be built (python -m tests.gcs); the gs:// tests skip")
    with timeout_paused():  # a cold build (or waiting for .ci/run's) belongs to no test
        binary = build().binary
    server = FakeGCS(binary)
    try:
        yield server
    finally:
        server.stop()


def main() -> int:
    if go() is None:
        print("gcs: no go on PATH: the gs:// tests will skip, saying so", file=sys.stderr)
        return 0
    built = build()
    how = f"built in {built.seconds:.0f}s" if built.seconds else "cached"
    print(f"fake-gcs-server {VERSION}: {built.binary} ({how})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
