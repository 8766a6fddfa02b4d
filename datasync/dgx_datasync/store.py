"""Object-store locations, listings, and the handful of store operations the sync needs.

Everything goes through fsspec (s3fs for ``s3://``, gcsfs for ``gs://``) so both schemes share one
code path; where S3 offers something the generic API hides, :class:`Store` uses it directly:

- downloads send ``If-Match: <etag from the listing>``, so an object replaced between the listing
  and the read fails with ``SourceChanged`` instead of silently mixing two versions of a data set;
- uploads use a fixed part size (:data:`PART_SIZE`), so the ETag S3 will compute is known before
  the upload and an unchanged file is never sent twice (:func:`s3_etag`);
- existence checks use HEAD, not s3fs's ``info``, which falls back to a listing on a miss.

Every filesystem is built with ``skip_instance_cache=True`` (fsspec otherwise shares instances
between equal arguments, credentials included) and without a listings cache (the checkpoint
uploader re-lists the same prefixes and must see new objects).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import fnmatch
import hashlib
import json
import math
import mimetypes
import os
import random
import re
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from dgx_api.stores import check_endpoint, check_region
from dgx_datasync.beneath import fd_path
from dgx_datasync.errors import SyncError, bucket_not_found, classify

SCHEMES: Final = ("s3", "gs")
#: The same bucket rule as the DGXDataMount CRD's ``spec.source`` pattern.
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$")
_URI = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<rest>.*)$")
#: Our own state lives under this directory name, locally and remotely; it is never synced.
STATE_DIR: Final = ".kubedgx"
#: Multipart part size for uploads. s3fs sends a file in one PUT below two parts' worth.
PART_SIZE: Final = 8 * 2**20
MAX_PARTS: Final = 10_000
#: Objects above this are downloaded as parallel ranged GETs of RANGE_SIZE.
LARGE_OBJECT: Final = 64 * 2**20
RANGE_SIZE: Final = 32 * 2**20
RANGES_PER_OBJECT: Final = 4
#: Chunk of a gs:// resumable upload (gcsfs uses one above 5 MiB). gcsfs holds a chunk in memory per
#: file in flight; its default of 50 MiB would be 200 MiB for 4 uploads in a sync container. A
#: multiple of 256 KiB, as GCS requires.
GS_CHUNK: Final = 16 * 2**20
#: Tries of each gs:// GET (botocore's total_max_attempts for s3 is the same).
GS_ATTEMPTS: Final = 3
_READ_CHUNK: Final = 2**20
_HASH_CHUNK: Final = 2**22
#: The longest object name S3 and GCS take, in bytes of UTF-8.
MAX_KEY: Final = 1024


@dataclass(frozen=True)
class Location:
    """A bucket and a key prefix; ``prefix`` has no leading or trailing slash ("" = bucket root)."""

    scheme: str
    bucket: str
    prefix: str

    @property
    def uri(self) -> str:
        base = f"{self.scheme}://{self.bucket}"
        return f"{base}/{self.prefix}" if self.prefix else base

    @property
    def path(self) -> str:
        """The fsspec path (no scheme)."""
        return f"{self.bucket}/{self.prefix}" if self.prefix else self.bucket

    def child(self, *parts: str) -> Location:
        pieces = [self.prefix] if self.prefix else []
        pieces += [p.strip("/") for p in parts if p.strip("/")]
        return Location(self.scheme, self.bucket, "/".join(pieces))


def parse_uri(uri: str) -> Location:
    """``s3://bucket/some/prefix`` -> ``Location("s3", "bucket", "some/prefix")``.

    Slashes around the prefix are dropped (``s3://b/p/`` and ``s3://b/p`` name the same prefix);
    empty, ``.`` and ``..`` segments inside it are rejected because they cannot name the same
    thing on every store and on the local disk.
    """
    hint = "use s3://bucket/prefix or gs://bucket/prefix"
    if not isinstance(uri, str) or not uri:
        raise SyncError("InvalidURI", f"empty object-store URI: {hint}")
    if any(c.isspace() for c in uri):
        raise SyncError("InvalidURI", f"object-store URI {uri!r} contains whitespace: {hint}")
    match = _URI.match(uri)
    if not match:
        raise SyncError("InvalidURI", f"{uri!r} is not an object-store URI: {hint}")
    scheme = match["scheme"]
    if scheme not in SCHEMES:
        raise SyncError("InvalidURI", f"unsupported scheme '{scheme}://' in {uri!r}: {hint}")
    bucket, _, prefix = match["rest"].partition("/")
    if not bucket:
        raise SyncError("InvalidURI", f"no bucket in {uri!r}: {hint}")
    if not _BUCKET.match(bucket) or ".." in bucket:
        raise SyncError(
            "InvalidURI",
            f"invalid bucket name '{bucket}' in {uri!r}: 3-63 lower-case letters, digits, '.', '-' or '_', "
            "starting and ending with a letter or digit",
        )
    prefix = prefix.strip("/")
    if prefix and any(part in {"", ".", ".."} for part in prefix.split("/")):
        raise SyncError("InvalidURI", f"the prefix in {uri!r} has an empty, '.' or '..' segment: {hint}")
    return Location(scheme, bucket, prefix)


@dataclass(frozen=True)
class StoreOptions:
    """How to reach the store. ``env`` is where credentials are read from (``None``: os.environ).

    s3: ``AWS_ACCESS_KEY_ID`` + ``AWS_SECRET_ACCESS_KEY`` (+ ``AWS_SESSION_TOKEN``); absent, botocore's
    ambient chain (IRSA web identity, instance profile, config files) decides.
    gs: ``GOOGLE_APPLICATION_CREDENTIALS`` names a service-account JSON file; absent, "google_default".

    ``ca_bundle``: a PEM file that s3 requests verify the store's TLS certificate against instead of
    botocore's default bundle (:func:`dgx_datasync.trust.bundle_for` writes one that adds private CAs
    to the defaults). Not used for gs (see :mod:`dgx_datasync.trust`).
    """

    endpoint_url: str | None = None
    region: str | None = None
    env: Mapping[str, str] | None = None
    ca_bundle: str | None = None

    def __post_init__(self) -> None:
        if self.endpoint_url:
            check_endpoint(self.endpoint_url)
        if self.region:
            check_region(self.region)


@dataclass(frozen=True)
class ObjectInfo:
    """One object: ``key`` relative to the listed prefix; ``etag`` is S3's ETag (no quotes) or the GCS
    generation, i.e. whatever changes when the object's content is replaced."""

    key: str
    size: int
    etag: str


def listing_digest(objects: Iterable[ObjectInfo]) -> str:
    """sha256 over ``key\\tsize\\tetag\\n`` lines in key order: equal digests mean equal data."""
    h = hashlib.sha256()
    for obj in sorted(objects, key=lambda o: o.key):
        h.update(f"{obj.key}\t{obj.size}\t{obj.etag}\n".encode())
    return "sha256:" + h.hexdigest()


@dataclass(frozen=True)
class Listing:
    """What is under a prefix, after include/exclude: the unit the operator records and compares."""

    source: str
    objects: tuple[ObjectInfo, ...]

    @property
    def total_bytes(self) -> int:
        return sum(o.size for o in self.objects)

    @property
    def digest(self) -> str:
        return listing_digest(self.objects)

    def summary(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "objects": len(self.objects),
            "totalBytes": self.total_bytes,
            "digest": self.digest,
        }


def is_state_key(key: str) -> bool:
    """Keys under a ``.kubedgx/`` directory at any depth are our own bookkeeping."""
    return STATE_DIR in key.split("/")[:-1]


def selected(key: str, include: Sequence[str], exclude: Sequence[str]) -> bool:
    """fnmatch globs on the relative key (``*`` crosses ``/``): any include (or none given) and no exclude."""
    if include and not any(fnmatch.fnmatchcase(key, pattern) for pattern in include):
        return False
    return not any(fnmatch.fnmatchcase(key, pattern) for pattern in exclude)


def part_size_for(size: int) -> int:
    """The upload part size: 8 MiB, grown in whole MiB only when a file would need > 10,000 parts."""
    if size <= PART_SIZE * MAX_PARTS:
        return PART_SIZE
    return math.ceil(size / MAX_PARTS / 2**20) * 2**20


@contextlib.contextmanager
def _reading(source: Path | int) -> Iterator[int]:
    """A descriptor of ``source``: a path is opened (and closed), a descriptor is used as it is."""
    if isinstance(source, int):
        yield source
        return
    fd = os.open(source, os.O_RDONLY | os.O_CLOEXEC)
    try:
        yield fd
    finally:
        os.close(fd)


def _pieces(fd: int, size: int) -> Iterator[bytes]:
    """``fd`` from its start in pieces of ``size`` (pread: the descriptor's offset is not touched)."""
    offset = 0
    while True:
        piece = b""
        while len(piece) < size and (more := os.pread(fd, size - len(piece), offset + len(piece))):
            piece += more
        if not piece:
            return
        offset += len(piece)
        yield piece


def multipart_etag(source: Path | int, part_size: int) -> str:
    """S3's ETag of a multipart upload: md5 of the parts' md5 digests, then ``-<parts>``."""
    with _reading(source) as fd:
        digests = [hashlib.md5(part, usedforsecurity=False).digest() for part in _pieces(fd, part_size)]
    return f"{hashlib.md5(b''.join(digests), usedforsecurity=False).hexdigest()}-{len(digests)}"


def s3_etag(source: Path | int) -> str:
    """The ETag S3 will give ``source`` when :meth:`Store.upload` sends it (same part size, same rule)."""
    with _reading(source) as fd:
        size = os.fstat(fd).st_size
        part = part_size_for(size)
        if size >= 2 * part:
            return multipart_etag(fd, part)
        return _md5(fd).hexdigest()


def _md5(source: Path | int) -> hashlib._Hash:
    h = hashlib.md5(usedforsecurity=False)
    with _reading(source) as fd:
        for chunk in _pieces(fd, _HASH_CHUNK):
            h.update(chunk)
    return h


@dataclass(frozen=True)
class RemoteObject:
    """An object as listed, plus what :meth:`Store.same_content` compares a local file against
    (s3: the ETag; gs: the base64 md5, absent for composite objects)."""

    key: str
    size: int
    etag: str
    checksum: str | None

    def info(self) -> ObjectInfo:
        return ObjectInfo(self.key, self.size, self.etag)


def filesystem_kwargs(loc: Location, options: StoreOptions) -> dict[str, Any]:
    """Constructor arguments for the fsspec filesystem of ``loc``: credentials, endpoint, timeouts.

    Kept separate from construction so that credential handling is testable without a network.
    """
    env: Mapping[str, str] = os.environ if options.env is None else options.env
    common: dict[str, Any] = {"skip_instance_cache": True, "use_listings_cache": False}
    if loc.scheme == "s3":
        client: dict[str, Any] = {}
        if options.region:
            client["region_name"] = options.region
        if options.ca_bundle:
            client["verify"] = options.ca_bundle  # botocore's `verify`: a bundle file replaces its default
        kwargs: dict[str, Any] = {
            **common,
            "client_kwargs": client,
            # Fail in seconds on a wrong endpoint; the callers retry transient errors themselves.
            "config_kwargs": {
                "connect_timeout": 5,
                "read_timeout": 60,
                # total_max_attempts counts the first try; botocore's max_attempts would not.
                "retries": {"total_max_attempts": 3, "mode": "standard"},
            },
            "max_concurrency": 4,  # parts in flight per multipart upload
        }
        if options.endpoint_url:
            kwargs["endpoint_url"] = options.endpoint_url
        key = env.get("AWS_ACCESS_KEY_ID") or None
        secret = env.get("AWS_SECRET_ACCESS_KEY") or None
        if bool(key) != bool(secret):
            present, absent = (
                ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
                if key
                else ("AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID")
            )
            raise SyncError(
                "CredentialsMissing",
                f"{present} is set but {absent} is not (for {loc.uri}): put both keys into the credentials Secret",
            )
        if key and secret:
            kwargs.update(key=key, secret=secret, token=env.get("AWS_SESSION_TOKEN") or None)
        return kwargs
    if loc.scheme == "gs":
        path = env.get("GOOGLE_APPLICATION_CREDENTIALS") or None
        token: str = "google_default"
        if path:
            token = path
            _check_service_account_file(path, loc)
        kwargs = {**common, "token": token}
        if options.endpoint_url:
            kwargs["endpoint_url"] = options.endpoint_url
        return kwargs
    raise SyncError("InvalidURI", f"unsupported scheme '{loc.scheme}://' in {loc.uri}")


def _check_service_account_file(path: str, loc: Location) -> None:
    """gcsfs takes a token string that is not a file for an OAuth access token and goes to the
    network with it; a missing or malformed file is caught here with a message that says so."""
    file = Path(path)
    if not file.is_file():
        raise SyncError(
            "CredentialsMissing",
            f"GOOGLE_APPLICATION_CREDENTIALS points to {path}, which does not exist (for {loc.uri}): "
            "mount the service-account key (spec.credentialsSecretRef, key service-account.json)",
        )
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SyncError(
            "CredentialsInvalid",
            f"GOOGLE_APPLICATION_CREDENTIALS file {path} is not JSON ({type(exc).__name__}) (for {loc.uri}): "
            "put a service-account key file into the Secret",
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("type"), str):
        raise SyncError(
            "CredentialsInvalid",
            f"GOOGLE_APPLICATION_CREDENTIALS file {path} has no 'type' field (for {loc.uri}): "
            "put a service-account key file into the Secret",
        )


def make_filesystem(loc: Location, options: StoreOptions) -> Any:
    kwargs = filesystem_kwargs(loc, options)
    where = options.endpoint_url
    try:
        if loc.scheme == "s3":
            import s3fs

            fs = s3fs.S3FileSystem(**kwargs)
            fs.retries = 2  # s3fs's own retry loop, on top of botocore's attempts
            return fs
        # gcsfs.GCSFileSystem is, by default since gcsfs 2025.x, a subclass that asks the Storage
        # Control API (gRPC) for each bucket's layout before using it, waits up to 60 s when that
        # API is not reachable at the endpoint, and asks again on the next call. Plain JSON API
        # calls are all the sync makes; they work the same on flat and hierarchical-namespace
        # buckets, so the plain class it is.
        from gcsfs.core import GCSFileSystem

        fs = GCSFileSystem(**kwargs)
        _fail_fast_on_refused_keys(fs)
        return fs
    except SyncError:
        raise
    except Exception as exc:
        error = classify(exc, loc.uri, loc.bucket, endpoint=where)
        if error is None:
            if loc.scheme == "gs":
                raise SyncError(
                    "CredentialsInvalid",
                    f"cannot use the Google credentials for {loc.uri} ({type(exc).__name__}: {exc}): "
                    "check GOOGLE_APPLICATION_CREDENTIALS",
                ) from exc
            raise
        raise error from exc


async def _write_body(
    fd: int, read: Callable[[int], Awaitable[bytes]], loc: Location, span: tuple[int, int] | None
) -> None:
    """A response body into ``fd`` at the span's offset; a range that ends short is a dropped
    connection (transient: the GET is made again)."""
    offset = span[0] if span else 0
    while chunk := await read(_READ_CHUNK):
        os.pwrite(fd, chunk, offset)
        offset += len(chunk)
    if span is not None and offset != span[1] + 1:
        raise SyncError("Unreachable", f"short read of {loc.uri}: the connection dropped", transient=True)


def _fail_fast_on_refused_keys(fs: Any) -> None:
    """gcsfs turns every failed token refresh into a retriable "401 Invalid Credentials" and retries
    it six times with backoff (half a minute) even when Google's token endpoint said the key itself
    is refused (``invalid_grant``: deleted, disabled, not the account's): google-auth marks such a
    RefreshError not retryable, and so does this wrapper, so the sync fails at once with the reason."""
    from gcsfs.retry import HttpError, NonRetryableError
    from google.auth.exceptions import RefreshError

    credentials = getattr(fs, "credentials", None)
    original = getattr(credentials, "maybe_refresh", None)
    if credentials is None or original is None:
        return

    def maybe_refresh(*args: Any, **kwargs: Any) -> None:
        try:
            original(*args, **kwargs)
        except HttpError as exc:
            cause = exc.__cause__
            if isinstance(cause, RefreshError) and not getattr(cause, "retryable", False):
                raise NonRetryableError(str(cause)) from cause
            raise

    credentials.maybe_refresh = maybe_refresh


class Store:
    """One filesystem for one bucket and set of options; the operations are thread-safe."""

    def __init__(self, loc: Location, options: StoreOptions) -> None:
        self.scheme = loc.scheme
        self.bucket = loc.bucket
        self.options = options
        self.fs = make_filesystem(loc, options)

    @contextlib.contextmanager
    def errors(self, loc: Location) -> Iterator[None]:
        """Turn whatever the back end raises into a SyncError about ``loc`` (unknown errors pass)."""
        try:
            yield
        except SyncError:
            raise
        except Exception as exc:
            error = classify(exc, loc.uri, loc.bucket, endpoint=self.options.endpoint_url)
            if error is None:
                raise
            raise error from exc

    def _run(self, coro_fn: Any, *args: Any) -> Any:
        from fsspec.asyn import sync

        return sync(self.fs.loop, coro_fn, *args)

    # -- reading -----------------------------------------------------------------------------------

    def list(self, loc: Location) -> list[RemoteObject]:
        """All objects under ``loc`` (not filtered), sorted by key; ``.kubedgx/`` state excluded.

        A missing bucket is an error; a missing prefix is an empty list (an existing empty prefix
        and a prefix nobody wrote to yet look the same on an object store)."""
        with self.errors(loc):
            try:
                found: dict[str, dict[str, Any]] = self.fs.find(loc.path, detail=True)
            except FileNotFoundError:
                # s3fs says NoSuchBucket (mapped by errors()); gcsfs only "not found".
                if self.scheme == "gs":
                    raise bucket_not_found(loc.uri, loc.bucket) from None
                raise
            # gcsfs may also return nothing for a missing bucket.
            if not found and self.scheme == "gs" and not self.fs.exists(loc.bucket):
                raise bucket_not_found(loc.uri, loc.bucket)
        root = loc.path.rstrip("/") + "/"
        out = []
        for path, info in found.items():
            name = str(info.get("name") or path)
            if info.get("type") == "directory" or name.endswith("/") or not name.startswith(root):
                continue
            key = name[len(root) :]
            if not key or is_state_key(key):
                continue
            out.append(self._remote(key, info))
        out.sort(key=lambda o: o.key)
        return out

    def _remote(self, key: str, info: Mapping[str, Any]) -> RemoteObject:
        size = int(info.get("size") or 0)
        if self.scheme == "s3":
            etag = str(info.get("ETag") or info.get("etag") or "").strip('"')
            return RemoteObject(key, size, etag, etag)
        checksum = info.get("md5Hash")
        return RemoteObject(key, size, str(info.get("generation") or ""), str(checksum) if checksum else None)

    def head(self, loc: Location) -> RemoteObject | None:
        """The object at ``loc``, or ``None`` when there is none."""
        try:
            with self.errors(loc):
                if self.scheme == "s3":
                    meta = self.fs.call_s3("head_object", Bucket=loc.bucket, Key=loc.prefix)
                    etag = str(meta.get("ETag", "")).strip('"')
                    return RemoteObject(loc.prefix, int(meta.get("ContentLength", 0)), etag, etag)
                info = self.fs.info(loc.path)
                if info.get("type") == "directory":
                    return None
                return self._remote(loc.prefix, info)
        except FileNotFoundError:
            return None

    def download(self, loc: Location, obj: RemoteObject, fd: int) -> None:
        """Write the object at ``loc`` into the empty file ``fd``. The caller renames it into place."""
        try:
            with self.errors(loc):
                self._run(self._download, loc, obj, fd)
        except FileNotFoundError as exc:
            if exc.filename is not None:  # a local path: our directory went away
                raise
            raise SyncError("SourceChanged", f"{loc.uri} was deleted after it was listed: run the sync again") from exc
        got = os.fstat(fd).st_size
        if got != obj.size:
            raise SyncError(
                "SourceChanged", f"{loc.uri} has {got} bytes, the listing said {obj.size}: run the sync again"
            )

    async def _download(self, loc: Location, obj: RemoteObject, fd: int) -> None:
        """The object in one GET, or above LARGE_OBJECT in parallel ranged GETs, each pinned to the
        version the listing saw: S3's If-Match on the ETag; for GCS the read names the generation, so
        an object replaced since answers 404 (that generation is gone) instead of the new bytes."""
        read = self._s3_range if self.scheme == "s3" else self._gs_range
        if obj.size <= LARGE_OBJECT:
            await read(fd, loc, obj, None)
            return
        os.ftruncate(fd, obj.size)
        limit = asyncio.Semaphore(RANGES_PER_OBJECT)

        async def one(start: int) -> None:
            async with limit:
                await read(fd, loc, obj, (start, min(start + RANGE_SIZE, obj.size) - 1))

        await asyncio.gather(*(one(start) for start in range(0, obj.size, RANGE_SIZE)))

    async def _s3_range(self, fd: int, loc: Location, obj: RemoteObject, span: tuple[int, int] | None) -> None:
        extra = {"IfMatch": f'"{obj.etag}"'} if obj.etag else {}
        if span is not None:
            extra["Range"] = f"bytes={span[0]}-{span[1]}"
        response = await self.fs._call_s3("get_object", Bucket=loc.bucket, Key=loc.prefix, **extra)
        body = response["Body"]
        try:
            await _write_body(fd, body.read, loc, span)
        finally:
            body.close()

    async def _gs_range(self, fd: int, loc: Location, obj: RemoteObject, span: tuple[int, int] | None) -> None:
        """One GET, tried up to three times where GCS or the network says to (5xx, 429, a dropped
        connection), as gcsfs's own calls and botocore's (for s3) are; a range is simply written again."""
        from gcsfs.retry import is_retriable, validate_response

        url = self.fs.url(loc.path)
        params = {"generation": obj.etag} if obj.etag else {}
        headers = {"Range": f"bytes={span[0]}-{span[1]}"} if span is not None else {}
        for attempt in range(GS_ATTEMPTS):
            try:
                await self.fs._set_session()
                async with self.fs.session.get(
                    url, params=params, headers=self.fs._get_headers(headers), timeout=self.fs.requests_timeout
                ) as response:
                    if response.status >= 400:
                        validate_response(response.status, await response.read(), url)
                    await _write_body(fd, response.content.read, loc, span)
                return
            except Exception as exc:
                short_read = isinstance(exc, SyncError) and exc.transient
                if attempt == GS_ATTEMPTS - 1 or not (short_read or is_retriable(exc)):
                    raise
                await asyncio.sleep(min(0.2 * 2**attempt, 2.0) * (1 + random.random()))

    # -- writing -----------------------------------------------------------------------------------

    def upload(self, fd: int, loc: Location) -> None:
        """Send the regular file ``fd`` holds (never a path: see :mod:`dgx_datasync.beneath`)."""
        with self.errors(loc):
            self.fs.put_file(fd_path(fd), loc.path, **self._upload_kwargs(loc, os.fstat(fd).st_size))

    def put_bytes(self, loc: Location, data: bytes) -> None:
        with self.errors(loc):
            self.fs.pipe_file(loc.path, data, **self._upload_kwargs(loc, len(data)))

    def _upload_kwargs(self, loc: Location, size: int) -> dict[str, Any]:
        """Our part size (s3), and the content type the back end would have guessed from a file name."""
        content_type, _ = mimetypes.guess_type(loc.prefix.rpartition("/")[2])
        if self.scheme == "s3":
            out: dict[str, Any] = {"chunksize": part_size_for(size)}
            if content_type:
                out["ContentType"] = content_type
            return out
        return {"content_type": content_type or "application/octet-stream", "chunksize": GS_CHUNK}

    def delete(self, locs: Sequence[Location]) -> None:
        if locs:
            with self.errors(locs[0]):
                self.fs.rm([loc.path for loc in locs])

    def local_checksum(self, fd: int) -> str:
        """What :attr:`RemoteObject.checksum` will be once ``fd`` is uploaded by :meth:`upload`."""
        if self.scheme == "s3":
            return s3_etag(fd)
        return base64.b64encode(_md5(fd).digest()).decode("ascii")

    def same_content(self, remote: RemoteObject | None, fd: int) -> bool:
        """True when ``remote`` already holds ``fd``'s bytes (size, then checksum)."""
        if remote is None or remote.checksum is None:
            return False
        if remote.size != os.fstat(fd).st_size:
            return False
        return remote.checksum == self.local_checksum(fd)

    def check_writable(self, loc: Location) -> None:
        """The bucket exists, the credentials are accepted and may list and write under ``loc``:
        a one-key listing, then a small probe object under ``<prefix>/.kubedgx/`` that is removed
        again (best effort: some buckets allow writes but not deletes)."""
        prefix = f"{loc.prefix}/" if loc.prefix else ""
        with self.errors(loc):
            if self.scheme == "s3":
                self.fs.call_s3("list_objects_v2", Bucket=loc.bucket, Prefix=prefix, MaxKeys=1)
            else:
                # An upload-only key (roles/storage.objectCreator) writes the probe but cannot list,
                # and the checkpoint uploader lists what is there: ask for one object first.
                try:
                    self.fs.call("GET", "b/{}/o", loc.bucket, prefix=prefix, maxResults=1)
                except FileNotFoundError:
                    raise bucket_not_found(loc.uri, loc.bucket) from None
        probe = loc.child(STATE_DIR, "probe")
        try:
            self.put_bytes(probe, b"")
        except FileNotFoundError as exc:  # gcsfs: a 404 on an upload is the bucket
            raise bucket_not_found(loc.uri, loc.bucket) from exc
        with contextlib.suppress(SyncError, OSError):
            self.delete([probe])


def list_source(
    loc: Location, options: StoreOptions, include: Sequence[str] = (), exclude: Sequence[str] = ()
) -> Listing:
    """The objects under ``loc`` that include/exclude select, with their digest."""
    objects = tuple(o.info() for o in Store(loc, options).list(loc) if selected(o.key, include, exclude))
    return Listing(loc.uri, objects)


def check_writable(loc: Location, options: StoreOptions) -> None:
    """For output destinations: raise SyncError unless ``loc`` can be listed and written."""
    Store(loc, options).check_writable(loc)
