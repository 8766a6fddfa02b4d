"""Fixtures for the data sync tests: moto's S3 server on loopback, in this process, behind a WSGI
middleware that records every request, so tests can count GETs per key, see the order of PUTs, and
hold chosen requests (a :class:`tests.gcs.Gate`) to catch a transfer "in flight" without sleeping; and
fake-gcs-server behind tests/gcs.py's proxy, which does the same for gs://.

Fixtures
--------
``store`` (session)
    The store a test runs against: moto's S3, or each of moto's S3 and fake-gcs-server in turn
    when the module says ``pytestmark = BOTH``. Either has ``scheme``, ``endpoint``, ``bucket()``,
    ``put``/``put_many``/``get``/``keys``/``version`` (setup), ``env()``/``options()``/``cli_args()``
    (credentials and endpoint as the data plane takes them), ``uri()``, and the request log: each
    request a :class:`tests.gcs.Hit` with its ``op`` (get, head, list, write, part, delete, ...),
    ``bucket``, ``key`` and answered ``status``; ``mark()``/``since()``, ``object_gets``,
    ``object_writes``, ``gate(...)``, ``fail(...)``.
``gcs`` (session)
    tests/gcs.py's :class:`FakeGCS` (built from its Go module on first use; skips without Go).
``s3`` (session)
    A :class:`MotoS3`: ``endpoint``, ``client`` (boto3), ``bucket()`` (a new uniquely named bucket:
    tests never reset the server, they never share a bucket), ``hits``/``mark()``/``since(mark)``
    (the request log), ``object_gets(bucket, mark)``, ``gate(...)``, ``fail(match, times)`` (503s
    instead of moto's answer), ``auth()`` (IAM authentication
    switched on for the duration, with a good user and one without permissions).
``run_cli``
    Runs ``python -m dgx_datasync ARGS`` as a subprocess against ``store`` with the test
    credentials and a termination-log file of its own; returns a :class:`CliResult`.
``spawn_cli``
    The same as a ``Popen`` (for SIGKILL / SIGTERM tests), plus the termination-log path.
``run_main``
    The same as ``run_cli`` in this process (``cli.main`` with stdout and stderr captured): a
    tenth of the time of a subprocess, for the many short runs of the hostile-input tests.

Moto quirks these tests work around (see docs/datasync.md):
- IAM authentication is process-wide (``/moto-api/reset-auth``), so ``auth()`` switches it on only
  inside the tests that need it.
- With authentication on, moto recomputes SigV4 over a URL whose query werkzeug has percent-decoded,
  so any request whose query holds an encoded ``/`` (a listing with a prefix) fails with
  SignatureDoesNotMatch even with good keys. Authenticated tests therefore use bucket-root URIs.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Any

import pytest

from tests.gcs import FakeGCS, Hit, LoggedStore, RequestLog
from tests.gcs import gcs as gcs
from tests.s3 import ACCESS_KEY as ACCESS_KEY
from tests.s3 import REGION as REGION
from tests.s3 import S3
from tests.s3 import SECRET_KEY as SECRET_KEY

ROOT = Path(__file__).resolve().parents[2]


def s3_hit(method: str, path: str, query: str) -> Hit:
    """A moto request as a :class:`tests.gcs.Hit` (path-style: ``/bucket/key``), so tests read the log
    of either store the same way."""
    bucket, _, key = path.lstrip("/").partition("/")
    params = query.split("&") if query else []
    multipart = any(p.startswith("uploadId=") for p in params)
    if not bucket:
        op = "other"
    elif key:
        if method == "GET":
            op = "get"
        elif method == "HEAD":
            op = "head"
        elif method == "DELETE":
            op = "delete"
        elif method == "PUT":
            op = "part" if multipart else "write"
        elif method == "POST":
            op = "write" if multipart else ("part" if "uploads" in params or "uploads=" in params else "other")
        else:
            op = "other"
    elif method == "GET" and not any(p.split("=")[0] in {"location", "versioning", "policy", "acl"} for p in params):
        op = "list"
    elif method == "POST" and any(p.split("=")[0] == "delete" for p in params):
        op = "delete"
    else:
        op = "other"
    return Hit(method, path, query, op, bucket or None, key or None)


UNAVAILABLE = (
    b'<?xml version="1.0" encoding="UTF-8"?>'
    b"<Error><Code>ServiceUnavailable</Code><Message>injected by the test</Message></Error>"
)


class CountingMiddleware:
    """Records every request in a :class:`tests.gcs.RequestLog` with the status moto (or an injected
    fault) answered, and applies the gates and faults in force."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.requests = RequestLog()

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        hit = s3_hit(environ["REQUEST_METHOD"], environ.get("PATH_INFO", ""), environ.get("QUERY_STRING", ""))
        index, gates, fault = self.requests.record(hit)

        def recorded(status: str, headers: Any, *exc_info: Any) -> Any:
            self.requests.answer(index, int(status.split()[0]))
            return start_response(status, headers, *exc_info)

        if fault is not None:
            environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
            recorded(f"{fault.status} {HTTPStatus(fault.status).phrase}", [("Content-Type", "application/xml")])
            return [UNAVAILABLE]
        for gate in gates:
            gate.check(hit)
        return self.app(environ, recorded)


class MotoS3(LoggedStore, S3):
    """tests/s3.py's server with the counting and gating middleware in front of moto."""

    def __init__(self) -> None:
        super().__init__(wrap=CountingMiddleware)
        self.middleware: CountingMiddleware = self.app
        self.requests = self.middleware.requests
        self._users: dict[str, dict[str, str]] | None = None

    def get(self, bucket: str, key: str) -> bytes:
        data: bytes = self.client.get_object(Bucket=bucket, Key=key)["Body"].read()
        return data

    def etag(self, bucket: str, key: str) -> str:
        return str(self.client.head_object(Bucket=bucket, Key=key)["ETag"]).strip('"')

    # -- what tests/gcs.py's FakeGCS has too, so a test can run on either store --------------------

    scheme = "s3"

    def put(self, bucket: str, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=bucket, Key=key, Body=data)

    def put_many(self, bucket: str, objects: Mapping[str, bytes], workers: int = 8) -> None:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(lambda kv: self.put(bucket, kv[0], kv[1]), objects.items()))

    def version(self, bucket: str, key: str) -> str:
        """What a listing records for the object (its ETag)."""
        return self.etag(bucket, key)

    def env(self) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}

    def cli_args(self) -> list[str]:
        return ["--endpoint-url", self.endpoint, "--region", REGION]

    def options(self) -> Any:
        from dgx_datasync import StoreOptions

        return StoreOptions(endpoint_url=self.endpoint, region=REGION, env=self.env())

    def uri(self, bucket: str, prefix: str = "") -> str:
        return f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"

    # -- authentication ----------------------------------------------------------------------------

    def _create_users(self) -> dict[str, dict[str, str]]:
        import boto3

        iam = boto3.client(
            "iam",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
        )
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
        users = {}
        for name, allowed in (("good", True), ("nobody", False)):
            user = f"datasync-{name}-{uuid.uuid4().hex[:6]}"
            iam.create_user(UserName=user)
            if allowed:
                iam.put_user_policy(UserName=user, PolicyName="s3", PolicyDocument=json.dumps(policy))
            key = iam.create_access_key(UserName=user)["AccessKey"]
            users[name] = {"AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}
        return users

    @contextlib.contextmanager
    def auth(self) -> Iterator[dict[str, dict[str, str]]]:
        """IAM authentication on (process-wide in moto); yields {"good": env, "nobody": env}."""
        import urllib.request

        if self._users is None:
            self._users = self._create_users()

        def set_count(value: str) -> None:
            # text/plain: with urllib's default form type Flask parses the body away from request.data.
            request = urllib.request.Request(
                f"{self.endpoint}/moto-api/reset-auth",
                data=value.encode(),
                method="POST",
                headers={"Content-Type": "text/plain"},
            )
            with urllib.request.urlopen(request, timeout=10) as response:
                response.read()

        set_count("0")
        try:
            yield self._users
        finally:
            set_count("inf")


@pytest.fixture(scope="session")
def s3() -> Iterator[MotoS3]:
    server = MotoS3()
    try:
        yield server
    finally:
        server.stop()


#: A store the scenario tests run against: moto's S3 or fake-gcs-server (either has put, get,
#: keys, version, bucket, env, cli_args, options, uri, and the request log: mark, since,
#: object_gets, object_writes, gate, fail).
ObjectStore = MotoS3 | FakeGCS
#: ``pytestmark = BOTH`` runs every test of a module once against each store.
BOTH = pytest.mark.parametrize("store", ["s3", "gs"], indirect=True)


@pytest.fixture(scope="session")
def store(request: pytest.FixtureRequest) -> ObjectStore:
    """moto's S3 unless the test is parametrized with ``BOTH`` (then each in turn)."""
    scheme = getattr(request, "param", "s3")
    found: ObjectStore = request.getfixturevalue("s3" if scheme == "s3" else "gcs")
    return found


def cli_env(
    extra: Mapping[str, str] | None = None,
    *,
    credentials: bool = True,
    identity: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """A clean environment for a datasync subprocess: our test keys (or none), no ambient AWS/GCP
    identity to stumble on, and the source tree importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GOOGLE_"))}
    env.update(
        {
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_CONFIG_FILE": "/nonexistent/aws-config",
            "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-credentials",
            "NO_GCE_CHECK": "true",
            "PYTHONPATH": os.pathsep.join(
                [str(ROOT / "datasync"), str(ROOT / "api"), env.get("PYTHONPATH", "")]
            ).rstrip(os.pathsep),
            "PYTHONUNBUFFERED": "1",
        }
    )
    if credentials:
        env.update(
            identity if identity is not None else {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
        )
    env.update(extra or {})
    return env


@dataclass
class CliResult:
    rc: int
    stdout: str
    stderr: str
    termination_path: Path
    seconds: float
    command: list[str] = field(default_factory=list)

    @property
    def termination(self) -> Any:
        return json.loads(self.termination_path.read_text(encoding="utf-8"))

    @property
    def result(self) -> Any:
        return json.loads(self.stdout.strip().splitlines()[-1])

    @property
    def stderr_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip()]

    def __str__(self) -> str:
        return f"{' '.join(self.command)} -> rc {self.rc}\nstdout: {self.stdout}\nstderr: {self.stderr}"


def _command(args: tuple[str, ...], endpoint: str | None, scheme: str = "s3") -> list[str]:
    command = [sys.executable, "-m", "dgx_datasync", *args]
    if endpoint:
        command += ["--endpoint-url", endpoint] + (["--region", REGION] if scheme == "s3" else [])
    return command


@pytest.fixture
def run_cli(store: ObjectStore, tmp_path: Path) -> Callable[..., CliResult]:
    counter = iter(range(1_000_000))

    def run(
        *args: str,
        env: Mapping[str, str] | None = None,
        credentials: bool = True,
        endpoint: str | None = "default",
        timeout: float = 120,
    ) -> CliResult:
        termination = tmp_path / f"termination-{next(counter)}.json"
        command = _command(args, store.endpoint if endpoint == "default" else endpoint, store.scheme)
        started = time.monotonic()
        identity = cli_env(env, credentials=credentials, identity=store.env())
        proc = subprocess.run(
            command,
            env={**identity, "KUBEDGX_TERMINATION_LOG": str(termination)},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        return CliResult(proc.returncode, proc.stdout, proc.stderr, termination, time.monotonic() - started, command)

    return run


@dataclass
class Spawned:
    proc: subprocess.Popen[str]
    termination_path: Path
    stderr_path: Path

    def wait(self, timeout: float = 120) -> int:
        return self.proc.wait(timeout=timeout)

    def signal(self, sig: signal.Signals) -> None:
        self.proc.send_signal(sig)

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(encoding="utf-8", errors="replace")

    @property
    def termination(self) -> Any:
        return json.loads(self.termination_path.read_text(encoding="utf-8"))


@pytest.fixture
def spawn_cli(store: ObjectStore, tmp_path: Path) -> Iterator[Callable[..., Spawned]]:
    started: list[Spawned] = []

    def spawn(*args: str, env: Mapping[str, str] | None = None) -> Spawned:
        n = len(started)
        termination = tmp_path / f"spawn-termination-{n}.json"
        stderr_path = tmp_path / f"spawn-stderr-{n}.log"
        with stderr_path.open("w") as err:
            proc = subprocess.Popen(
                _command(args, store.endpoint, store.scheme),
                env={**cli_env(env, identity=store.env()), "KUBEDGX_TERMINATION_LOG": str(termination)},
                stdout=subprocess.DEVNULL,
                stderr=err,
                text=True,
            )
        spawned = Spawned(proc, termination, stderr_path)
        started.append(spawned)
        return spawned

    yield spawn
    for spawned in started:
        if spawned.proc.poll() is None:
            spawned.proc.kill()
            spawned.proc.wait(timeout=30)


@contextlib.contextmanager
def kept_logging() -> Iterator[None]:
    """``cli.main`` configures the process's logging for a command line; put back what pytest had."""
    root = logging.getLogger()
    ours = logging.getLogger("dgx_datasync")
    handlers, level, our_level = list(root.handlers), root.level, ours.level
    try:
        yield
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)
        ours.setLevel(our_level)
        logging.captureWarnings(False)


def main_in_process(args: list[str], termination: Path) -> CliResult:
    """``python -m dgx_datasync ARGS`` as ``cli.main(ARGS)``; argparse's exit becomes the exit code."""
    from dgx_datasync.cli import main

    out, err = io.StringIO(), io.StringIO()
    started = time.monotonic()
    previous = os.environ.get("KUBEDGX_TERMINATION_LOG")
    os.environ["KUBEDGX_TERMINATION_LOG"] = str(termination)
    try:
        with kept_logging(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(args)
            except SystemExit as exc:
                rc = exc.code if isinstance(exc.code, int) else 2
    finally:
        if previous is None:
            os.environ.pop("KUBEDGX_TERMINATION_LOG", None)
        else:
            os.environ["KUBEDGX_TERMINATION_LOG"] = previous
    command = ["dgx_datasync", *args]
    return CliResult(rc, out.getvalue(), err.getvalue(), termination, time.monotonic() - started, command)


@pytest.fixture
def run_main(store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., CliResult]:
    for name in list(os.environ):
        if name.startswith(("AWS_", "GOOGLE_")):
            monkeypatch.delenv(name)
    for name, value in cli_env(identity=store.env()).items():
        if name.startswith(("AWS_", "GOOGLE_", "NO_GCE")):
            monkeypatch.setenv(name, value)
    counter = iter(range(1_000_000))

    def run(*args: str, endpoint: str | None = "default") -> CliResult:
        termination = tmp_path / f"main-termination-{next(counter)}.json"
        # The options right after the command: ARGS may end with "--" and positionals.
        options = _command((), store.endpoint if endpoint == "default" else endpoint, store.scheme)[3:]
        return main_in_process([*args[:1], *options, *args[1:]], termination)

    return run
