"""kubedgx is five distributions, one per layer (the fifth, the Flyte plugin, runs in no kubedgx
image: in Flyte's connector service and in the user's image), so that each installs only what it runs.

Read from the sources, not from a list kept by hand: each package's imports (its AST) decide which
of kubedgx's distributions it needs and which third-party packages its distribution must bring; the
Dockerfiles must install exactly the distributions of what their containers run (the operator; the
trainer and the sync containers' data plane); and a wheel built from each folder holds exactly its
package.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.conftest import ROOT
from tests.images.dockerfiles import OPERATOR, TRAINER, stages


@dataclass(frozen=True)
class Distribution:
    folder: str  # relative to the repository root; "." for the root project
    name: str
    version: str
    package: str  # the one import package it ships (flytekitplugins.dgx: a portion of a namespace package)
    requires: tuple[Requirement, ...]
    extras: dict[str, tuple[Requirement, ...]]


def _read(folder: str) -> Distribution:
    data = tomllib.loads((ROOT / folder / "pyproject.toml").read_text(encoding="utf-8"))
    project = data["project"]
    find = data["tool"]["setuptools"]["packages"]["find"]
    (package,) = [p for p in find["include"] if "*" not in p and "." not in p.removeprefix("flytekitplugins.")]
    extras = {k: tuple(Requirement(r) for r in v) for k, v in project.get("optional-dependencies", {}).items()}
    return Distribution(
        folder,
        canonicalize_name(project["name"]),
        project["version"],
        package,
        tuple(Requirement(r) for r in project["dependencies"]),
        extras,
    )


DISTRIBUTIONS = tuple(_read(f) for f in ("api", "datasync", "trainer", ".", "flyte"))
BY_PACKAGE = {d.package: d for d in DISTRIBUTIONS}
BY_NAME = {d.name: d for d in DISTRIBUTIONS}
OURS = set(BY_NAME)


def test_one_distribution_per_source_folder() -> None:
    assert {d.package for d in DISTRIBUTIONS} == {
        "dgx_api", "dgx_datasync", "dgx_trainer", "dgx_operator", "flytekitplugins.dgx"
    }  # fmt: skip
    for d in DISTRIBUTIONS:
        source = _source_dir(d)
        assert (source / "__init__.py").is_file(), f"{source}: a regular package (a namespace package ships no files)"
        assert (source / "py.typed").is_file(), f"{source}: typed (py.typed) for the other layers' mypy"


def test_versions_agree_and_our_requirements_pin_them() -> None:
    (version,) = {d.version for d in DISTRIBUTIONS}
    for d in DISTRIBUTIONS:
        assert importlib.import_module(d.package).__version__ == version, d.package
        for r in d.requires + tuple(r for rs in d.extras.values() for r in rs):
            if canonicalize_name(r.name) in OURS:
                assert str(r.specifier) == f"=={version}", f"{d.name} requires {r}: pin our own at =={version}"


# --------------------------------------------------------------------------------------------
# What each package imports
# --------------------------------------------------------------------------------------------


def _source_dir(d: Distribution) -> Path:
    return ROOT / ("operator" if d.folder == "." else d.folder) / d.package.replace(".", "/")


@cache
def top_level_imports(package: str) -> frozenset[str]:
    """Top-level names the package's own modules import (absolute imports; stdlib left out)."""
    found: set[str] = set()
    for path in _source_dir(BY_PACKAGE[package]).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return frozenset(found - set(sys.stdlib_module_names) - {package.split(".")[0], "__future__"})


def ours_imported(package: str) -> set[str]:
    """kubedgx packages this one stands on, transitively."""
    seen: set[str] = set()
    todo = [m for m in top_level_imports(package) if m in BY_PACKAGE]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += [n for n in top_level_imports(m) if n in BY_PACKAGE and n != package]
    return seen


@pytest.mark.parametrize("d", DISTRIBUTIONS, ids=lambda d: d.name)
def test_a_distribution_requires_exactly_the_kubedgx_layers_its_package_imports(d: Distribution) -> None:
    imported = {BY_PACKAGE[m].name for m in top_level_imports(d.package) if m in BY_PACKAGE}
    # The operator extra is part of the package's imports (the daemon's modules); the trainer extra
    # is not: `kubedgx run --local` finds the trainer with find_spec and runs it in a subprocess.
    daemon = d.extras.get("operator", ())
    declared = {canonicalize_name(r.name) for r in d.requires + daemon} & OURS
    assert declared == imported, f"{d.name}: requires {sorted(declared)}, its package imports {sorted(imported)}"


def _closure(requirements: tuple[Requirement, ...]) -> set[str]:
    """Every distribution installing ``requirements`` brings (from the installed metadata)."""
    env = default_environment()
    out: set[str] = set()
    todo: list[tuple[Requirement, frozenset[str]]] = [(r, frozenset(r.extras)) for r in requirements]
    while todo:
        req, extras = todo.pop()
        name = canonicalize_name(req.name)
        key = f"{name}[{','.join(sorted(extras))}]"
        if key in out:
            continue
        out |= {key, name}
        if name in BY_NAME:  # ours: read the pyproject, which is what the image installs from
            ours = BY_NAME[name]
            todo += [(r, frozenset(r.extras)) for r in ours.requires]
            todo += [(r, frozenset(r.extras)) for x in extras for r in ours.extras.get(x, ())]
            continue
        try:
            listed = importlib.metadata.requires(req.name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for text in listed:
            sub = Requirement(text)
            if sub.marker is None or any(sub.marker.evaluate({**env, "extra": x}) for x in ({""} | extras)):
                todo.append((sub, frozenset(sub.extras)))
    return {n for n in out if "[" not in n}


@cache
def _providers() -> dict[str, set[str]]:
    return {m: {canonicalize_name(d) for d in ds} for m, ds in importlib.metadata.packages_distributions().items()}


@pytest.mark.parametrize("d", DISTRIBUTIONS, ids=lambda d: d.name)
def test_every_third_party_import_comes_with_the_distribution(d: Distribution) -> None:
    """A package importing something its distribution does not bring breaks in the image that installs it."""
    runtime_extras = tuple(r for name, rs in d.extras.items() if name != "test" for r in rs)
    brought = _closure(d.requires + runtime_extras)
    missing = []
    for module in sorted(top_level_imports(d.package) - set(BY_PACKAGE)):
        providers = _providers().get(module)
        assert providers, f"{d.package} imports {module}, which nothing installed here provides"
        if not providers & brought:
            missing.append(f"{module} (from {sorted(providers)})")
    assert missing == [], f"{d.name} does not bring what {d.package} imports: {missing}"


def test_the_closure_check_can_fail() -> None:
    """kopf is not in the trainer's closure: a trainer importing it would be caught above."""
    assert "kopf" not in _closure(BY_NAME["kubedgx-trainer"].requires)
    assert "kopf" in _closure(BY_NAME["kubedgx"].extras["operator"])
    assert "torch" not in _closure(BY_NAME["kubedgx"].requires)


def test_the_user_cli_pulls_no_daemon_dependency() -> None:
    """`pip install kubedgx` (no extra) in someone else's CI: the CLI's validate, render and crds,
    with no kopf, async cluster client, object-storage client or torch (the `operator` extra has
    the daemon's; tests/unit/test_cli_without_daemon.py runs the CLI without them)."""
    base = _closure(BY_NAME["kubedgx"].requires)
    daemon = {"kopf", "kubernetes-asyncio", "kubedgx-datasync", "fsspec", "s3fs", "gcsfs", "torch"}
    assert base & daemon == set(), sorted(base & daemon)
    assert {"kopf", "kubedgx-datasync", "s3fs", "gcsfs"} <= _closure(BY_NAME["kubedgx"].extras["operator"])


# --------------------------------------------------------------------------------------------
# The images install what they run
# --------------------------------------------------------------------------------------------


def _pip_installs(dockerfile: str) -> Iterator[tuple[str, list[str]]]:
    """(stage base, the arguments of each ``pip install``) in the Dockerfile."""
    for stage in stages(dockerfile):
        for run in stage.all("RUN"):
            for part in run.args.split("&&"):
                words = part.split()
                if words[:2] == ["pip", "install"]:
                    yield stage.base, [w for w in words[2:] if not w.startswith("-")]


def installed_distributions(dockerfile: str) -> set[str]:
    ((_base, args),) = list(_pip_installs(dockerfile))
    out = set()
    for arg in args:
        arg, _, extras = arg.strip("\"'").partition("[")
        # Each layer by its own folder; the one extra an image may name is the operator's own
        # daemon dependencies (never the trainer extra: the operator image has no torch).
        assert extras in ("", "operator]"), f"{dockerfile}: pip install {arg}[{extras}: only the operator extra"
        assert not extras or dockerfile == OPERATOR, f"{dockerfile}: the operator extra is the operator image's"
        folder = "." if arg == "." else arg.removeprefix("./").rstrip("/")
        (d,) = [d for d in DISTRIBUTIONS if d.folder == folder]
        out.add(d.name)
    return out


def _datasync_module() -> str:
    from dgx_operator.render.datasync import DATASYNC

    assert DATASYNC[:2] == ["python", "-m"]
    return DATASYNC[2].split(".")[0]


def _needs(*packages: str) -> set[str]:
    return {BY_PACKAGE[p].name for root in packages for p in {root, *ours_imported(root)}}


def test_the_operator_image_installs_the_operator_and_the_layers_it_stands_on() -> None:
    assert installed_distributions(OPERATOR) == _needs("dgx_operator")
    assert "kubedgx-trainer" not in installed_distributions(OPERATOR)


def test_the_trainer_image_installs_the_trainer_and_the_data_plane_of_the_sync_containers() -> None:
    assert _datasync_module() == "dgx_datasync"
    assert installed_distributions(TRAINER) == _needs("dgx_trainer", _datasync_module())
    assert "kubedgx" not in installed_distributions(TRAINER)


@pytest.mark.parametrize("dockerfile", [OPERATOR, TRAINER])
def test_an_image_copies_the_folders_it_installs_and_no_other_source(dockerfile: str) -> None:
    copied = {
        w.rstrip("/")
        for stage in stages(dockerfile)
        for c in stage.all("COPY")
        if "from" not in c.flags()
        for w in c.words()[:-1]
    }
    folders = {BY_NAME[n].folder for n in installed_distributions(dockerfile)}
    sources = {"operator" if f == "." else f for f in folders}
    others = {"api", "datasync", "operator", "trainer"} - sources
    assert sources <= copied, f"{dockerfile} installs {sorted(sources)} but copies {sorted(copied)}"
    assert not others & copied, f"{dockerfile} copies {sorted(others & copied)}, which it does not install"
    root = "." in folders
    assert ("pyproject.toml" in copied) == root, "the root pyproject only where the root project is installed"


# --------------------------------------------------------------------------------------------
# What a wheel of each folder holds
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A wheel of each distribution, built from a copy of its folder (a build leaves build/ and
    *.egg-info behind, which must not land in the work tree)."""
    out = tmp_path_factory.mktemp("wheels")
    copies = tmp_path_factory.mktemp("sources")
    built: dict[str, Path] = {}
    for d in DISTRIBUTIONS:
        skip = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
        if d.folder == ".":
            source = copies / "root"
            shutil.copytree(ROOT / "operator", source / "operator", ignore=skip)
            for name in ("pyproject.toml", "README.md"):
                shutil.copy(ROOT / name, source / name)
        else:
            source = copies / d.folder
            shutil.copytree(ROOT / d.folder, source, ignore=skip)
        result = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(out),
             str(source)],
            capture_output=True, text=True, check=False, timeout=300,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        (wheel,) = out.glob(f"{d.name.replace('-', '_')}-{d.version}-*.whl")
        built[d.name] = wheel
    return built


@pytest.mark.parametrize("d", DISTRIBUTIONS, ids=lambda d: d.name)
def test_a_wheel_holds_exactly_its_package(d: Distribution, wheels: dict[str, Path]) -> None:
    with zipfile.ZipFile(wheels[d.name]) as z:
        names = z.namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    path = d.package.replace(".", "/")
    assert top == {path.split("/")[0]}, f"{wheels[d.name].name} holds {sorted(top)}"
    shipped = {n for n in names if n.endswith(".py")}
    source = _source_dir(d)
    expected = {f"{path}/{p.relative_to(source).as_posix()}" for p in source.rglob("*.py")}
    assert shipped == expected
    assert f"{path}/py.typed" in names
    if d.package == "dgx_operator":
        assert "dgx_operator/catalog.yaml" in names, "the built-in instance catalog ships with the operator"
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    with zipfile.ZipFile(wheels[d.name]) as z:
        text = z.read(metadata).decode()
    assert re.search(rf"^Name: {re.escape(d.name)}$", text, re.M | re.I), text[:200]
