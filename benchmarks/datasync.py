"""How fast `datasync pull` mirrors a prefix, against the obvious alternative: a sequential fsspec
``fs.get`` loop, one file at a time, for both schemes the data plane speaks:

- **s3://**: moto's S3 server in its own process on loopback; the loop is s3fs's.
- **gs://**: fake-gcs-server (the Go emulator tests/gcs.py builds) behind tests/gcs.py's
  authenticating proxy, the two in a process of their own on loopback; the loop is gcsfs's plain
  ``gcsfs.core.GCSFileSystem(endpoint_url=..., token=<service-account key file>)``, the class and
  credential path the data plane uses.

The gs:// runs go **through the proxy**, not straight to the emulator: every request then carries
an OAuth token obtained from the service-account key (google-auth signs a JWT, the proxy's token
endpoint exchanges it) and is checked, as GCS does, so the credential path of a real pull is part
of what is timed. The proxy (Python, threaded) adds the same work to each request of both methods,
as moto's Python server does on the s3 side, so the ratio stays a fair comparison; straight to the
Go emulator a request costs the server almost nothing and the figures would measure client CPU
alone. One thing of the proxy's is not like GCS and is switched off here: without TCP_NODELAY each
object read waited about 40 ms for the client's delayed ACK (see :func:`serve_gcs`). The absolute
figures are those of this loopback setup, not of GCS.

Either server can add a delay per request (``--latency-ms``) standing in for a real store's
first-byte latency (on gs:// in the proxy, for every request but the token exchange); without it
the figures measure client and server CPU per request, not a network.

    python benchmarks/datasync.py                          # 2,000 objects of 4-64 KiB, 3 rounds, s3 and gs
    python benchmarks/datasync.py --scheme s3              # s3:// only (no Go needed)
    python benchmarks/datasync.py --objects 500 --workers 16 --rounds 1
    python benchmarks/datasync.py --large 2 --large-mb 200 # plus two 200 MB objects
    python benchmarks/datasync.py --objects 500 --latency-ms 20   # a store 20 ms away

The gs:// runs need the fake-gcs-server binary: ``KUBEDGX_FAKE_GCS_SERVER`` names a built one,
otherwise it is built with Go (as ``python -m tests.gcs`` does, cached), and tests/gcs.py's imports
(pytest, cryptography, google-auth) must be installed. When it cannot be had the gs rows are
skipped and the table says why; the s3 rows need none of it.

Per scheme, each round pulls the same tree (the same objects on both stores) into a fresh
directory with both methods (alternating which goes first), then times a second `pull` into the
datasync copy when nothing changed (a listing and no object read). Both methods include their
listing. The schemes run one after the other, each with only its own server up. The first method
of the first round also pays for importing its client library (s3fs or gcsfs, about half a second);
with the default three rounds the median leaves that round out for datasync. The table shows, per
scheme, medians over the rounds: seconds, MB/s and objects/s of each method, the no-change re-pull,
and the speed-up (the sequential loop's seconds over datasync's). Target: datasync at least 3x the
sequential loop's objects/s on small objects.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "datasync"), str(ROOT / "api")]

from dgx_datasync import StoreOptions, parse_uri  # noqa: E402
from dgx_datasync.sync import pull  # noqa: E402

KEY, SECRET, REGION = "AKIABENCHMARK0000000", "benchmark-secret", "us-east-1"
BUCKET = "bench"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve(port: int, latency_ms: float) -> None:
    """moto's S3 server (what ``python -m moto.server`` runs), each request delayed by ``latency_ms``:
    a loopback server answers in microseconds, a real object store's first byte takes tens of
    milliseconds, and that latency is what parallel transfers hide."""
    import logging

    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    app = DomainDispatcherApplication(create_backend_app)

    def delayed(environ: dict[str, Any], start_response: Any) -> Any:
        if latency_ms > 0 and not environ.get("PATH_INFO", "").startswith("/moto-api"):
            time.sleep(latency_ms / 1000)
        return app(environ, start_response)

    make_server("127.0.0.1", port, delayed, threaded=True).serve_forever()


def start_moto(latency_ms: float) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(port), "--latency-ms", str(latency_ms)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return proc, f"http://127.0.0.1:{port}"
        if proc.poll() is not None:
            raise SystemExit("moto's server did not start")
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("moto's server did not open its port within 60 s")


def serve_gcs(binary: str, latency_ms: float) -> None:
    """tests/gcs.py's FakeGCS (fake-gcs-server behind the authenticating proxy), in this process,
    with each request to the store delayed by ``latency_ms`` in the proxy. Prints one JSON line
    (the proxy's and the emulator's URLs, the admin's key file), then serves until stdin closes or
    SIGTERM arrives, and removes the emulator and its key files.

    The proxy answers with Nagle's algorithm off (tests/gcs.py): with it on, every response body
    waited ~40 ms for a delayed ACK, a hidden ``--latency-ms 40`` that the parallel pull hides and
    the loop pays."""
    sys.path.insert(0, str(ROOT))
    from tests.gcs import FakeGCS

    server = FakeGCS(Path(binary))
    try:
        if latency_ms > 0:
            base: Any = server.proxy.RequestHandlerClass

            def delayed(self: Any) -> None:
                if not self.path.startswith("/token"):
                    time.sleep(latency_ms / 1000)
                base._handle(self)

            methods = ("do_GET", "do_HEAD", "do_POST", "do_PUT", "do_PATCH", "do_DELETE")
            # socketserver reads it for each new connection; nothing has connected to the proxy yet.
            server.proxy.RequestHandlerClass = type("BenchmarkHandler", (base,), dict.fromkeys(methods, delayed))
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        ready = {"endpoint": server.endpoint, "upstream": server.upstream, "key": str(server.key_files["admin"])}
        print(json.dumps(ready), flush=True)
        sys.stdin.read()
    finally:
        server.stop()


def fake_gcs_binary() -> tuple[str | None, str]:
    """(the fake-gcs-server binary, "") or (None, why the gs:// runs cannot happen)."""
    sys.path.insert(0, str(ROOT))
    try:
        from tests import gcs
    except ImportError as exc:
        return None, f"tests/gcs.py cannot be imported ({exc}): install the test dependencies"
    if not os.environ.get("KUBEDGX_FAKE_GCS_SERVER") and gcs.go() is None:
        return None, "no Go toolchain to build fake-gcs-server and KUBEDGX_FAKE_GCS_SERVER is not set"
    if not os.environ.get("KUBEDGX_FAKE_GCS_SERVER"):
        print("gs: fake-gcs-server, built with Go unless cached (minutes the first time)...", file=sys.stderr)
    try:
        binary = gcs.build().binary
    except Exception as exc:
        return None, f"fake-gcs-server could not be built: {type(exc).__name__}: {str(exc)[-500:]}"
    if not binary.is_file():
        return None, f"fake-gcs-server binary {binary} does not exist"
    return str(binary), ""


def start_gcs(binary: str, latency_ms: float, log: Path) -> tuple[subprocess.Popen[str], dict[str, str]]:
    with log.open("w") as errors:
        proc = subprocess.Popen(
            [sys.executable, __file__, "--serve-gcs", binary, "--latency-ms", str(latency_ms)],
            stdin=subprocess.PIPE,  # closed (by stop() or this process's end): the server goes
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
        )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # FakeGCS waits for its emulator's health check (60 s at most)
    if not line:
        proc.wait(timeout=30)
        raise SystemExit(f"fake-gcs-server did not start: {log.read_text(errors='replace')[-2000:]}")
    return proc, json.loads(line)


def stop(proc: subprocess.Popen[Any]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            pipe.close()


def tree(args: argparse.Namespace) -> tuple[dict[str, memoryview], int]:
    """The objects to pull (keys under data/, views of two random blobs), and their total size."""
    rng = random.Random(args.seed)
    sizes = [rng.randint(args.min_kib * 1024, args.max_kib * 1024) for _ in range(args.objects)]
    blob = memoryview(os.urandom(max(sizes, default=0)))
    objects: dict[str, memoryview] = {
        f"data/d{i % 20:02d}/obj-{i:06d}.bin": blob[: sizes[i]] for i in range(args.objects)
    }
    large = memoryview(os.urandom(args.large_mb * 10**6) if args.large else b"")
    for i in range(args.large):
        objects[f"data/large/shard-{i}.bin"] = large
    return objects, sum(sizes) + args.large * len(large)


def populate_s3(endpoint: str, objects: dict[str, memoryview]) -> None:
    import boto3

    client = boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id=KEY, aws_secret_access_key=SECRET, region_name=REGION
    )
    client.create_bucket(Bucket=BUCKET)
    small = [(k, v) for k, v in objects.items() if not k.startswith("data/large/")]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda kv: client.put_object(Bucket=BUCKET, Key=kv[0], Body=bytes(kv[1])), small))
    for key, body in objects.items():
        if key.startswith("data/large/"):
            client.put_object(Bucket=BUCKET, Key=key, Body=bytes(body))


def populate_gcs(upstream: str, objects: dict[str, memoryview]) -> None:
    """Straight to the emulator (no token, not through the proxy), as tests/gcs.py sets up its buckets."""

    def call(path: str, body: bytes, content_type: str) -> None:
        request = urllib.request.Request(
            f"{upstream}{path}", data=body, method="POST", headers={"Content-Type": content_type}
        )
        with urllib.request.urlopen(request, timeout=300) as response:
            response.read()

    call("/storage/v1/b?project=kubedgx-bench", json.dumps({"name": BUCKET}).encode(), "application/json")

    def put(item: tuple[str, memoryview]) -> None:
        name = urllib.parse.quote(item[0], safe="")
        call(
            f"/upload/storage/v1/b/{BUCKET}/o?uploadType=media&name={name}", bytes(item[1]), "application/octet-stream"
        )

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, objects.items()))


def naive_s3(endpoint: str, dest: Path) -> None:
    """The baseline: list, then fs.get one file after the other."""
    import s3fs

    fs = s3fs.S3FileSystem(
        key=KEY, secret=SECRET, endpoint_url=endpoint, client_kwargs={"region_name": REGION}, skip_instance_cache=True
    )
    fetch_all(fs, dest)


def naive_gcs(endpoint: str, key_file: str, dest: Path) -> None:
    """The baseline on gs://: gcsfs's plain JSON-API class with the service-account key, as datasync's."""
    from gcsfs.core import GCSFileSystem

    fs = GCSFileSystem(endpoint_url=endpoint, token=key_file, skip_instance_cache=True)
    fetch_all(fs, dest)


def fetch_all(fs: Any, dest: Path) -> None:
    root = f"{BUCKET}/data"
    for path in fs.find(root):
        target = dest / path[len(root) + 1 :]
        target.parent.mkdir(parents=True, exist_ok=True)
        fs.get(path, str(target))


def timed(fn: Callable[[], None]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


@dataclass
class Result:
    scheme: str
    medians: dict[str, float] | None = None  # datasync, naive, rerun
    skipped: str = ""


def compare(
    scheme: str,
    args: argparse.Namespace,
    count: int,
    options: StoreOptions,
    naive: Callable[[Path], None],
    scratch: Path,
) -> dict[str, float]:
    source = parse_uri(f"{scheme}://{BUCKET}/data")
    times: dict[str, list[float]] = {"datasync": [], "naive": [], "rerun": []}
    for r in range(args.rounds):
        ours, theirs = scratch / f"{scheme}-ours-{r}", scratch / f"{scheme}-naive-{r}"

        def run_ours(dest: Path = ours) -> None:
            result = pull(source, dest, options, workers=args.workers)
            assert result["objects"] == count, result

        def run_naive(dest: Path = theirs) -> None:
            naive(dest)

        order = [("datasync", run_ours), ("naive", run_naive)]
        for name, fn in order if r % 2 == 0 else order[::-1]:
            times[name].append(timed(fn))
        times["rerun"].append(timed(run_ours))
        copied = sum(1 for p in theirs.rglob("*") if p.is_file())
        assert copied == count, f"the sequential loop copied {copied} of {count} objects"
        shutil.rmtree(ours)
        shutil.rmtree(theirs)
        print(
            f"{scheme} round {r + 1}: datasync {times['datasync'][-1]:.2f}s, naive {times['naive'][-1]:.2f}s, "
            f"re-run {times['rerun'][-1]:.2f}s",
            file=sys.stderr,
        )
    return {k: statistics.median(v) for k, v in times.items()}


def bench_s3(args: argparse.Namespace, objects: dict[str, memoryview], scratch: Path) -> Result:
    proc, endpoint = start_moto(args.latency_ms)
    try:
        populate_s3(endpoint, objects)
        options = StoreOptions(
            endpoint_url=endpoint, region=REGION, env={"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET}
        )
        medians = compare("s3", args, len(objects), options, lambda dest: naive_s3(endpoint, dest), scratch)
    finally:
        stop(proc)
    return Result("s3", medians)


def bench_gcs(args: argparse.Namespace, objects: dict[str, memoryview], scratch: Path) -> Result:
    binary, why = fake_gcs_binary()
    if binary is None:
        print(f"gs: skipped: {why}", file=sys.stderr)
        return Result("gs", skipped=why)
    proc, server = start_gcs(binary, args.latency_ms, scratch / "fake-gcs.stderr")
    try:
        populate_gcs(server["upstream"], objects)
        endpoint, key_file = server["endpoint"], server["key"]
        options = StoreOptions(endpoint_url=endpoint, env={"GOOGLE_APPLICATION_CREDENTIALS": key_file})
        medians = compare("gs", args, len(objects), options, lambda dest: naive_gcs(endpoint, key_file, dest), scratch)
    finally:
        stop(proc)
    return Result("gs", medians)


def report(args: argparse.Namespace, results: list[Result], count: int, total: int) -> None:
    mb = total / 1e6
    servers = {
        "s3": "s3: moto's server in its own process",
        "gs": "gs: fake-gcs-server behind the authenticating proxy of tests/gcs.py (OAuth tokens from a "
        "service-account key), in their own process",
    }
    print(
        f"\n{count} objects, {mb:.1f} MB ({args.min_kib}-{args.max_kib} KiB"
        + (f", plus {args.large} x {args.large_mb} MB" if args.large else "")
        + f"), {args.latency_ms:g} ms added per request, {os.cpu_count()} CPUs, median of {args.rounds} rounds"
        + "".join(f"; {servers[r.scheme]}" for r in results if r.medians is not None)
        + "\n"
    )
    print("| scheme | method | seconds | MB/s | objects/s | speed-up |")
    print("|---|---|---:|---:|---:|---:|")
    for r in results:
        if r.medians is None:
            print(f"| {r.scheme} | skipped: {r.skipped} | - | - | - | - |")
            continue
        med = r.medians
        ours, theirs = med["datasync"], med["naive"]
        print(
            f"| {r.scheme} | datasync pull ({args.workers} workers) | {ours:.2f} | {mb / ours:.1f} "
            f"| {count / ours:.0f} | {theirs / ours:.2f}x |"
        )
        print(f"| {r.scheme} | sequential fs.get loop | {theirs:.2f} | {mb / theirs:.1f} | {count / theirs:.0f} | 1x |")
        print(f"| {r.scheme} | datasync pull, nothing changed | {med['rerun']:.2f} | - | - | - |")
    ratios = [f"{r.scheme} {r.medians['naive'] / r.medians['datasync']:.2f}x" for r in results if r.medians]
    if ratios:
        print(f"\nspeed-up: {', '.join(ratios)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scheme", choices=("s3", "gs", "both"), default="both", help="store(s) to run (default both)")
    parser.add_argument("--objects", type=int, default=2000, help="small objects (default 2000)")
    parser.add_argument("--min-kib", type=int, default=4)
    parser.add_argument("--max-kib", type=int, default=64)
    parser.add_argument("--large", type=int, default=0, help="additional large objects (default 0)")
    parser.add_argument("--large-mb", type=int, default=100, help="size of each large object in MB (default 100)")
    parser.add_argument("--workers", type=int, default=8, help="datasync workers (default 8)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--latency-ms", type=float, default=0.0, help="server-side delay per request (default 0)")
    parser.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--serve-gcs", metavar="BINARY", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.latency_ms)
        return
    if args.serve_gcs:
        serve_gcs(args.serve_gcs, args.latency_ms)
        return

    objects, total = tree(args)
    scratch = Path(tempfile.mkdtemp(prefix="datasync-bench-"))
    results: list[Result] = []
    try:
        if args.scheme in ("s3", "both"):
            results.append(bench_s3(args, objects, scratch))
        if args.scheme in ("gs", "both"):
            results.append(bench_gcs(args, objects, scratch))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report(args, results, len(objects), total)


if __name__ == "__main__":
    main()
