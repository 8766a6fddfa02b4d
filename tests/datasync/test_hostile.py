"""Hostile and broken input (issue 12): the training container writes the directories datasync
uploads from and may write those it downloads into, so a link it plants must never take datasync
out of the directory; and names, URIs and endpoints that cannot work get one clear line.

Every link here points at ``outside``, a directory beside the one under test holding a file with a
secret (standing in for /proc/self/environ, which holds the sync container's store credentials);
the tests check that no object in the bucket carries the secret and that nothing was written to
``outside``.
"""

from __future__ import annotations

import io
import json
import logging
import os
import tarfile
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from dgx_api.checkpoints import mark_complete
from dgx_api.progress import COMPLETE_MARKER, write_atomic
from dgx_datasync import StoreOptions, parse_uri
from dgx_datasync.watch import Watcher
from tests.datasync.conftest import ACCESS_KEY, REGION, SECRET_KEY, CliResult, MotoS3

SECRET = b"AWS_SECRET_ACCESS_KEY=never-upload-" + uuid.uuid4().hex.encode()


def options(s3: MotoS3) -> StoreOptions:
    return StoreOptions(
        endpoint_url=s3.endpoint,
        region=REGION,
        env={"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY},
    )


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory the data plane must neither read from nor write to: a secret file and a
    directory holding another copy of it."""
    root = tmp_path / "outside"
    (root / "dir").mkdir(parents=True)
    (root / "secret").write_bytes(SECRET)
    (root / "dir" / "secret").write_bytes(SECRET)
    return root


def tree(root: Path) -> dict[str, bytes | None]:
    """Everything under ``root`` (directories as None), links not followed."""
    out: dict[str, bytes | None] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs:
            out[os.path.relpath(os.path.join(folder, name), root)] = None
        for name in files:
            path = Path(folder, name)
            out[os.path.relpath(path, root)] = None if path.is_symlink() else path.read_bytes()
    return out


def assert_untouched(outside: Path) -> None:
    assert tree(outside) == {"dir": None, "secret": SECRET, "dir/secret": SECRET}


def assert_no_secret(s3: MotoS3, bucket: str) -> None:
    for key in s3.keys(bucket):
        data = s3.get(bucket, key)
        assert SECRET not in data, key
        if key.endswith(".tar.gz"):
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
                for member in tar.getmembers():
                    body = tar.extractfile(member) if member.isfile() else None
                    assert body is None or SECRET not in body.read(), member.name


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def assert_one_line(result: CliResult, reason: str, *fragments: str, alone: bool = True) -> str:
    """Exit 2 and one ``datasync:`` line, the last; the only line unless the store answered before
    the error (``alone=False``: then the listing was logged)."""
    assert result.rc == 2, result
    assert "Traceback" not in result.stderr, result
    assert [line for line in result.stderr_lines if line.startswith("datasync: ")] == result.stderr_lines[-1:], result
    if alone:
        assert len(result.stderr_lines) == 1, result
    line = result.stderr_lines[-1]
    for fragment in fragments:
        assert fragment in line, line
    assert result.termination == {"error": reason, "message": line.removeprefix("datasync: ")}
    return line


def checkpoint(root: Path, step: int, files: dict[str, bytes]) -> Path:
    directory = root / f"checkpoint-{step}"
    for name, data in files.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_bytes(data)
    mark_complete(directory, step)
    return directory


def succeed(root: Path) -> None:
    write_atomic(root / "summary.json", json.dumps({"status": "Succeeded", "step": 9}))


# -- uploads never read through a link -------------------------------------------------------------


def test_watch_skips_links_inside_a_checkpoint(
    s3: MotoS3, tmp_path: Path, outside: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dgx_datasync")
    bucket = s3.bucket("hostile")
    out = tmp_path / "out"
    ckpt = checkpoint(out, 2, {"model.safetensors": b"weights", "rng/state.pth": b"rng"})
    (ckpt / "leak.bin").symlink_to(outside / "secret")
    (ckpt / "rng" / "more").symlink_to(outside / "dir")

    watcher = Watcher(out, parse_uri(f"s3://{bucket}/ckpt"), options(s3), once=True)
    assert watcher.run() == {"checkpoints": [2]}
    assert s3.keys(bucket, "ckpt/") == [
        f"ckpt/checkpoint-2/{COMPLETE_MARKER}",
        "ckpt/checkpoint-2/model.safetensors",
        "ckpt/checkpoint-2/rng/state.pth",
    ]
    assert_no_secret(s3, bucket)
    said = warnings(caplog)
    assert any(str(ckpt / "leak.bin") in w and "symbolic link" in w for w in said), said
    assert any(str(ckpt / "rng" / "more") in w and "symbolic link" in w for w in said), said
    assert_untouched(outside)


def test_watch_skips_a_linked_checkpoint_directory(
    s3: MotoS3, tmp_path: Path, outside: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """checkpoint-5 -> a complete checkpoint elsewhere, and checkpoint-6 whose marker is a link:
    neither is uploaded at all, each warned about once; checkpoint-3 goes up as usual."""
    caplog.set_level(logging.INFO, logger="dgx_datasync")
    bucket = s3.bucket("hostile")
    out = tmp_path / "out"
    checkpoint(out, 3, {"model.safetensors": b"three"})
    elsewhere = checkpoint(outside / "dir", 5, {"secret": SECRET})
    (out / "checkpoint-5").symlink_to(elsewhere)
    six = out / "checkpoint-6"
    six.mkdir()
    (six / "model.safetensors").write_bytes(b"six")
    (six / COMPLETE_MARKER).symlink_to(elsewhere / COMPLETE_MARKER)

    watcher = Watcher(out, parse_uri(f"s3://{bucket}/ckpt"), options(s3), once=True)
    assert watcher.run() == {"checkpoints": [3]}
    watcher.scan()  # the sidecar's next scan says nothing new
    assert s3.keys(bucket, "ckpt/") == [f"ckpt/checkpoint-3/{COMPLETE_MARKER}", "ckpt/checkpoint-3/model.safetensors"]
    assert_no_secret(s3, bucket)
    said = warnings(caplog)
    assert len([w for w in said if str(out / "checkpoint-5") in w]) == 1, said
    assert len([w for w in said if str(six / COMPLETE_MARKER) in w]) == 1, said


def test_push_skips_links(s3: MotoS3, run_main: Callable[..., CliResult], tmp_path: Path, outside: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_bytes(b"a")
    (src / "sub" / "b.txt").write_bytes(b"b")
    (src / "leak").symlink_to(outside / "secret")
    (src / "sub" / "linked").symlink_to(outside / "dir")
    bucket = s3.bucket("hostile")

    result = run_main("push", str(src), f"s3://{bucket}/up")
    assert result.rc == 0, result
    assert result.result == {"objects": 2, "totalBytes": 2, "transferred": 2, "skipped": 0}
    assert s3.keys(bucket) == ["up/a.txt", "up/sub/b.txt"]
    assert_no_secret(s3, bucket)
    warned = [line for line in result.stderr_lines if " WARNING " in line]
    assert any(str(src / "leak") in w for w in warned), result
    assert any(str(src / "sub" / "linked") in w for w in warned), result


def test_push_skips_a_name_that_is_not_utf8(s3: MotoS3, run_main: Callable[..., CliResult], tmp_path: Path) -> None:
    """An object key is text; a file name need not be. The name is escaped in the warning."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "good.txt").write_bytes(b"good")
    fd = os.open(os.fsencode(src) + b"/bad\xff\x1b[2J.txt", os.O_WRONLY | os.O_CREAT, 0o644)
    os.close(fd)
    bucket = s3.bucket("hostile")
    result = run_main("push", str(src), f"s3://{bucket}/up")
    assert result.rc == 0, result
    assert s3.keys(bucket) == ["up/good.txt"]
    assert "Traceback" not in result.stderr
    assert "\x1b" not in result.stderr
    assert "\udcff" not in result.stderr
    warned = [line for line in result.stderr_lines if " WARNING " in line]
    assert len(warned) == 1, result
    assert "bad\\udcff\\x1b[2J.txt" in warned[0], warned


def test_archive_files_skips_links(s3: MotoS3, tmp_path: Path, outside: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="dgx_datasync")
    bucket = s3.bucket("hostile")
    out = tmp_path / "out"
    (out / "adapter").mkdir(parents=True)
    (out / "adapter" / "adapter_model.safetensors").write_bytes(b"adapter")
    (out / "adapter" / "leak.json").symlink_to(outside / "secret")
    (out / "merged").symlink_to(outside / "dir")
    succeed(out)

    result = Watcher(
        out, parse_uri(f"s3://{bucket}/ckpt"), options(s3), archive=parse_uri(f"s3://{bucket}/final"), once=True
    ).run()
    assert [a["name"] for a in result["artifacts"]] == ["adapter", "summary"]
    assert s3.keys(bucket, "final/") == ["final/adapter/adapter_model.safetensors", "final/summary.json"]
    assert_no_secret(s3, bucket)
    said = warnings(caplog)
    assert any(str(out / "adapter" / "leak.json") in w for w in said), said
    assert any(str(out / "merged") in w and "symbolic link" in w for w in said), said


def test_archive_tarball_skips_links(
    s3: MotoS3, tmp_path: Path, outside: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """tarfile.add would store adapter -> /elsewhere as a link member (and follow a link swapped in
    between its lstat and its open): the tarball holds regular files only."""
    caplog.set_level(logging.INFO, logger="dgx_datasync")
    bucket = s3.bucket("hostile")
    out = tmp_path / "out"
    out.mkdir()
    (out / "adapter").symlink_to(outside / "dir")
    (out / "merged").mkdir()
    (out / "merged" / "model.safetensors").write_bytes(b"merged")
    (out / "merged" / "leak").symlink_to(outside / "secret")
    succeed(out)

    result = Watcher(
        out,
        parse_uri(f"s3://{bucket}/ckpt"),
        options(s3),
        archive=parse_uri(f"s3://{bucket}/final"),
        archive_format="tar.gz",
        once=True,
    ).run()
    assert [a["name"] for a in result["artifacts"]] == ["model.tar.gz", "summary"]
    with tarfile.open(fileobj=io.BytesIO(s3.get(bucket, "final/model.tar.gz")), mode="r:gz") as tar:
        members = tar.getmembers()
        assert not [m.name for m in members if m.issym() or m.islnk()]
        files = {m.name: tar.extractfile(m).read() for m in members if m.isfile()}  # type: ignore[union-attr]
    assert files == {"merged/model.safetensors": b"merged", "summary.json": (out / "summary.json").read_bytes()}
    assert_no_secret(s3, bucket)
    said = warnings(caplog)
    assert any(str(out / "adapter") in w and "symbolic link" in w for w in said), said
    assert any(str(out / "merged" / "leak") in w for w in said), said
    assert list((out / ".kubedgx").iterdir()) == [out / ".kubedgx" / "uploaded.json"]


def test_a_linked_summary_is_not_archived(
    s3: MotoS3, tmp_path: Path, outside: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """summary.json -> a file elsewhere that says Succeeded: the training's own summary is not
    there, so nothing is archived (and the file elsewhere is not uploaded)."""
    caplog.set_level(logging.INFO, logger="dgx_datasync")
    bucket = s3.bucket("hostile")
    out = tmp_path / "out"
    (out / "adapter").mkdir(parents=True)
    (out / "adapter" / "a.bin").write_bytes(b"a")
    fake = outside / "summary.json"
    fake.write_text(json.dumps({"status": "Succeeded", "token": SECRET.decode()}))
    (out / "summary.json").symlink_to(fake)
    result = Watcher(
        out, parse_uri(f"s3://{bucket}/ckpt"), options(s3), archive=parse_uri(f"s3://{bucket}/final"), once=True
    ).run()
    assert result == {"checkpoints": []}
    assert s3.keys(bucket, "final/") == []
    assert any(str(out / "summary.json") in w and "symbolic link" in w for w in warnings(caplog))


# -- downloads never write through a link ----------------------------------------------------------


def test_pull_refuses_a_linked_subdirectory(
    s3: MotoS3, run_main: Callable[..., CliResult], tmp_path: Path, outside: Path
) -> None:
    bucket = s3.bucket("hostile", {"data/sub/a.bin": b"a", "data/top.bin": b"top"})
    # DEST itself may be a link (a hostPath mount point): only what is inside it is untrusted.
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "dest-link").symlink_to(real)
    fine = run_main("pull", f"s3://{bucket}/data", str(tmp_path / "dest-link"))
    assert fine.rc == 0, fine
    assert (real / "sub" / "a.bin").read_bytes() == b"a"

    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "sub").symlink_to(outside / "dir")
    mark = s3.mark()
    result = run_main("pull", f"s3://{bucket}/data", str(dest))
    assert_one_line(result, "LocalError", repr(str(dest / "sub")), "symbolic link", alone=False)
    assert_untouched(outside)
    assert s3.object_gets(bucket, mark) == {}  # refused before the first download


def test_restore_refuses_a_linked_checkpoint_directory(
    s3: MotoS3, run_main: Callable[..., CliResult], tmp_path: Path, outside: Path
) -> None:
    bucket = s3.bucket("hostile", {"ckpt/checkpoint-4/model.bin": b"m", f"ckpt/checkpoint-4/{COMPLETE_MARKER}": b"{}"})
    out = tmp_path / "out"
    out.mkdir()
    (out / "checkpoint-4").symlink_to(outside / "dir")
    result = run_main("restore", f"s3://{bucket}/ckpt", str(out))
    assert_one_line(result, "LocalError", repr(str(out / "checkpoint-4")), "symbolic link", alone=False)
    assert_untouched(outside)


@pytest.mark.parametrize("command", ["pull", "watch", "restore"])
def test_a_linked_state_directory_is_refused(
    s3: MotoS3, run_main: Callable[..., CliResult], tmp_path: Path, outside: Path, command: str
) -> None:
    """DEST/.kubedgx -> elsewhere: the lock, journal, manifest and uploaded.json would be written
    there. Refused before anything is transferred."""
    bucket = s3.bucket(
        "hostile", {"data/a.bin": b"a", "ckpt/checkpoint-4/m.bin": b"m", f"ckpt/checkpoint-4/{COMPLETE_MARKER}": b"{}"}
    )
    directory = tmp_path / "dir"
    directory.mkdir()
    (directory / ".kubedgx").symlink_to(outside / "dir")
    if command == "watch":
        checkpoint(directory, 1, {"m.bin": b"one"})
    args = {
        "pull": ["pull", f"s3://{bucket}/data", str(directory)],
        "watch": ["watch", str(directory), f"s3://{bucket}/up", "--once"],
        "restore": ["restore", f"s3://{bucket}/ckpt", str(directory)],
    }[command]
    mark = s3.mark()
    result = run_main(*args)
    assert_one_line(
        result, "LocalError", repr(str(directory / ".kubedgx")), "symbolic link", alone=command != "restore"
    )
    assert_untouched(outside)
    assert s3.object_gets(bucket, mark) == {}
    assert s3.keys(bucket, "up/") == []


# -- names, URIs and endpoints that cannot work ----------------------------------------------------


def test_long_object_names(s3: MotoS3, run_main: Callable[..., CliResult], tmp_path: Path) -> None:
    """244 and 255 bytes are legal file names, but not with the partial-file prefix and suffix
    around them: the partial name is shortened, the final name is the key's."""
    names = ["x" * 244, "y" * 255, "é" * 127]
    bucket = s3.bucket("long", {f"d/{n}": n.encode() for n in names})
    dest = tmp_path / "dest"
    result = run_main("pull", f"s3://{bucket}/d", str(dest))
    assert result.rc == 0, result
    for name in names:
        assert (dest / name).read_bytes() == name.encode()
    assert not list(dest.glob("*kubedgx-partial*"))


def test_a_key_too_long_for_a_file_name_is_refused_before_any_download(
    s3: MotoS3, run_main: Callable[..., CliResult], tmp_path: Path
) -> None:
    long = "z" * 256
    bucket = s3.bucket("long", {"d/ok.bin": b"ok", f"d/sub/{long}": b"long"})
    dest = tmp_path / "dest"
    mark = s3.mark()
    result = run_main("pull", f"s3://{bucket}/d", str(dest))
    assert_one_line(result, "LocalError", "255", "spec.exclude", "sub/zzz", alone=False)
    assert s3.object_gets(bucket, mark) == {}
    assert not (dest / "ok.bin").exists()


@pytest.mark.parametrize(
    "endpoint",
    ["not a url", "http://", "ftp://x", "http://[::1", "http://host:99999", "http://host:port", "//host:9000", "x"],
)
def test_bad_endpoint_urls(run_main: Callable[..., CliResult], tmp_path: Path, endpoint: str) -> None:
    """Exit 2 (no retry can fix a URL) and one line that names where it came from."""
    result = run_main("list", "s3://bucket/data", f"--endpoint-url={endpoint}", endpoint=None)
    assert_one_line(result, "InvalidURI", repr(endpoint), "--endpoint-url", "spec.endpoint")


def test_a_password_in_the_endpoint_is_not_repeated(run_main: Callable[..., CliResult], tmp_path: Path) -> None:
    result = run_main("list", "s3://bucket/data", "--endpoint-url=http://minio:hunter2@store:9000", endpoint=None)
    assert_one_line(result, "InvalidURI", "'http://***@store:9000'", "credentials Secret")
    assert "hunter2" not in result.stderr


def test_bad_region(run_main: Callable[..., CliResult], tmp_path: Path) -> None:
    result = run_main("list", "s3://bucket/data", "--region=us east 1", endpoint=None)
    assert_one_line(result, "InvalidURI", "'us east 1'", "--region", "spec.region")


def test_control_characters_are_escaped(run_main: Callable[..., CliResult], tmp_path: Path) -> None:
    """A name printed in a message cannot clear the terminal or pose as a line of its own."""
    result = run_main("list", "s3://bad\x1b[2Jbucket/x")
    line = assert_one_line(result, "InvalidURI", "invalid bucket name")
    assert "\x1b" not in result.stderr
    assert "\\x1b[2J" in line


def test_malformed_state_files_are_ignored(s3: MotoS3, run_main: Callable[..., CliResult], tmp_path: Path) -> None:
    """The training container can write DEST/.kubedgx (a shared hostPath cache) and summary.json:
    garbage there means "nothing known", never a traceback."""
    bucket = s3.bucket("garbage", {"d/a.bin": b"a"})
    dest = tmp_path / "dest"
    (dest / ".kubedgx").mkdir(parents=True)
    manifest = {"version": 1, "digest": "sha256:x", "objects": 5, "totalBytes": "many"}
    (dest / ".kubedgx" / "manifest.json").write_text(json.dumps(manifest))
    (dest / ".kubedgx" / "journal.jsonl").write_text("[" * 100_000 + "\n" + '{"key": 1, "size": []}\n')
    result = run_main("pull", f"s3://{bucket}/d", str(dest), "--expect-digest", "sha256:x", "--reuse")
    assert result.rc == 0, result
    assert (dest / "a.bin").read_bytes() == b"a"

    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.json").write_text("[" * 100_000)
    (out / ".kubedgx").mkdir()
    (out / ".kubedgx" / "uploaded.json").write_text('{"destination": ' + "[" * 100_000)
    watched = run_main("watch", str(out), f"s3://{bucket}/ckpt", "--archive", f"s3://{bucket}/final", "--once")
    assert watched.rc == 0, watched
    assert watched.result == {"checkpoints": []}


@pytest.mark.parametrize("interval", ["inf", "nan", "-1", "1e400"])
def test_bad_intervals_are_usage_errors(run_main: Callable[..., CliResult], tmp_path: Path, interval: str) -> None:
    result = run_main("watch", str(tmp_path), "s3://bucket/x", f"--interval={interval}", "--once")
    assert result.rc == 2, result
    assert "Traceback" not in result.stderr
    assert "--interval" in result.stderr_lines[-1]
