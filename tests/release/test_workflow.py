""".github/workflows/release.yaml cannot run here (no GitHub, no registry, no Docker engine), so it is
checked three ways: actionlint (the workflow's syntax, expressions, job outputs and the known actions'
inputs), its own scripts run here (the version step in Python; every bash script parsed by bash), and a
dry render: the image references and the chart the workflow would publish for a tag, worked out from the
workflow file itself, and the chart packaged as its `helm package` line does, rendered with its default
values: it must install exactly those images. hadolint on both Dockerfiles is tests/images."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tempfile
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from tests.conftest import ROOT
from tests.release.actionlint import actionlint

WORKFLOWS = ROOT / ".github" / "workflows"
RELEASE = WORKFLOWS / "release.yaml"
CHART = ROOT / "charts" / "kubedgx"
#: Where the chart's default values point (ghcr.io/<this>/operator): the upstream repository's owner.
UPSTREAM_OWNER = "kubedgx"


def workflow() -> dict[str, Any]:
    loaded: dict[Any, Any] = yaml.safe_load(RELEASE.read_text(encoding="utf-8"))
    loaded["on"] = loaded.pop(True, loaded.get("on"))  # YAML 1.1 reads the key `on` as true
    return loaded


def job(name: str) -> dict[str, Any]:
    found: dict[str, Any] = workflow()["jobs"][name]
    return found


def step(job_name: str, *, id_: str | None = None, uses: str | None = None, runs: str | None = None) -> dict[str, Any]:
    """The one step of a job with this id, or using this action (name before @), or whose script has ``runs``."""
    steps: list[dict[str, Any]] = [
        s
        for s in job(job_name)["steps"]
        if (id_ is not None and s.get("id") == id_)
        or (uses is not None and str(s.get("uses", "")).split("@")[0] == uses)
        or (runs is not None and runs in str(s.get("run", "")))
    ]
    assert len(steps) == 1, f"{job_name}: expected one step {id_ or uses or runs}, found {len(steps)}"
    return steps[0]


def python_version() -> str:
    version: str = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    return version


# -- actionlint ------------------------------------------------------------------------------------------


def lint(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(actionlint()), "-no-color", *map(str, paths)], cwd=ROOT, capture_output=True, text=True, check=False
    )


def test_actionlint_finds_nothing_in_the_workflows() -> None:
    paths = sorted(WORKFLOWS.glob("*.y*ml"))
    assert RELEASE in paths
    proc = lint(*paths)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_actionlint_would_catch_a_broken_reference(tmp_path: Path) -> None:
    """The lint is not vacuous: a misspelt job output, an unknown input of a known action, a bad matrix key."""
    text = RELEASE.read_text(encoding="utf-8")
    for good, bad, complaint in (
        ("needs.plan.outputs.version }}", "needs.plan.outputs.versoin }}", "versoin"),
        ("          push: true\n", "          pushh: true\n", "pushh"),
        ("${{ matrix.dockerfile }}", "${{ matrix.dockerfiel }}", "dockerfiel"),
    ):
        assert good in text
        broken = tmp_path / ".github" / "workflows" / "release.yaml"
        broken.parent.mkdir(parents=True, exist_ok=True)
        broken.write_text(text.replace(good, bad, 1), encoding="utf-8")
        proc = lint(broken)
        assert proc.returncode == 1, (bad, proc.stdout)
        assert complaint in proc.stdout, proc.stdout


# -- what it may do --------------------------------------------------------------------------------------


def test_it_runs_on_version_tags_only_with_least_privilege() -> None:
    flow = workflow()
    assert flow["on"] == {"push": {"tags": ["v*"]}}
    assert flow["permissions"] == {"contents": "read", "packages": "write"}
    for name, spec in flow["jobs"].items():
        granted = spec.get("permissions")
        assert granted is not None, f"{name}: say what the job needs"
        assert set(granted.items()) <= set(flow["permissions"].items()), name
    assert job("plan")["permissions"] == {"contents": "read"}, "plan publishes nothing"
    secrets = set(re.findall(r"secrets\.(\w+)", RELEASE.read_text(encoding="utf-8")))
    assert secrets == {"GITHUB_TOKEN"}, "GHCR with the workflow's own token, no stored credentials"
    for name, spec in flow["jobs"].items():
        for s in spec["steps"]:
            if str(s.get("uses", "")).startswith("actions/checkout@"):
                assert s.get("with", {}).get("persist-credentials") is False, f"{name}: the token stays out of .git"


def test_nothing_is_published_before_the_plan_passed() -> None:
    assert job("images")["needs"] == "plan"
    assert set(job("chart")["needs"]) == {"plan", "images"}, "no chart whose images failed to push"


# -- its scripts, run or parsed here ---------------------------------------------------------------------


def run_version_step(tag: str, owner: str, cwd: Path = ROOT) -> tuple[subprocess.CompletedProcess[str], dict[str, str]]:
    spec = step("plan", id_="version")
    assert spec["shell"] == "python"
    assert spec["env"] == {"TAG": "${{ github.ref_name }}", "OWNER": "${{ github.repository_owner }}"}
    with tempfile.TemporaryDirectory() as tmp:
        output = Path(tmp) / "github-output"
        output.write_text("", encoding="utf-8")
        env = {**os.environ, "TAG": tag, "OWNER": owner, "GITHUB_OUTPUT": str(output)}
        proc = subprocess.run(
            ["python3", "-c", spec["run"]], cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=False
        )
        written = dict(line.split("=", 1) for line in output.read_text(encoding="utf-8").splitlines())
    return proc, written


def test_the_version_step_takes_the_version_from_a_tag_that_matches_the_distributions() -> None:
    proc, out = run_version_step(f"v{python_version()}", "KubeDGX")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert out == {"version": python_version(), "owner": "kubedgx"}, "GHCR names are lowercase"


@pytest.mark.parametrize("tag", ["v1.2", "1.2.3", "v1.2.3-foo", "v1.2.3-rc1", "v01.2.3x"])
def test_the_version_step_refuses_a_tag_that_is_not_a_release(tag: str) -> None:
    proc, out = run_version_step(tag, "kubedgx")
    assert proc.returncode == 1
    assert proc.stdout.startswith(f"::error::tag {tag!r} is not vX.Y.Z"), proc.stdout
    assert out == {}


def test_the_version_step_refuses_a_tag_the_distributions_do_not_carry() -> None:
    major, minor, patch = (int(n) for n in python_version().split(".")[:3])
    tag = f"v{major}.{minor}.{patch + 1}"
    proc, out = run_version_step(tag, "kubedgx")
    assert proc.returncode == 1
    assert f"::error::pyproject.toml says version {python_version()}, the tag {tag} needs" in proc.stdout
    assert out == {}


def test_a_pre_release_tag_needs_the_pep_440_spelling_in_the_distributions(tmp_path: Path) -> None:
    for path in ("pyproject.toml", "api/pyproject.toml", "datasync/pyproject.toml", "trainer/pyproject.toml"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text('[project]\nname = "x"\nversion = "1.4.0rc2"\n', encoding="utf-8")
    proc, out = run_version_step("v1.4.0-rc.2", "kubedgx", tmp_path)
    assert proc.returncode == 0, proc.stdout
    assert out["version"] == "1.4.0-rc.2", "semver for the images and the chart"
    (tmp_path / "trainer/pyproject.toml").write_text('[project]\nversion = "1.4.0"\n', encoding="utf-8")
    proc, _ = run_version_step("v1.4.0-rc.2", "kubedgx", tmp_path)
    assert "trainer/pyproject.toml says version 1.4.0, the tag v1.4.0-rc.2 needs 1.4.0rc2" in proc.stdout


def test_every_bash_script_parses() -> None:
    bash = shutil.which("bash")
    assert bash is not None
    scripts = [
        (name, s.get("name") or s.get("id"), s["run"])
        for name, spec in workflow()["jobs"].items()
        for s in spec["steps"]
        if "run" in s and s.get("shell", "bash") == "bash"
    ]
    assert len(scripts) >= 3
    for job_name, step_name, script in scripts:
        proc = subprocess.run([bash, "-n"], input=script, capture_output=True, text=True, check=False)
        assert proc.returncode == 0, f"{job_name}/{step_name}: {proc.stderr}"


# -- the dry render --------------------------------------------------------------------------------------


def expand(text: str, context: Mapping[str, str]) -> str:
    """``${{ expr }}`` replaced from ``context``; an expression this test does not model fails it."""

    def value(match: re.Match[str]) -> str:
        expr = match[1].strip()
        assert expr in context, f"the test does not model ${{{{ {expr} }}}}: extend it"
        return context[expr]

    return re.sub(r"\$\{\{(.*?)\}\}", value, text)


def shell(command: str, env: Mapping[str, str]) -> list[str]:
    """One shell command line's words with ``$VAR``/``"$VAR"`` expanded from ``env`` (unknown: fails)."""

    def var(match: re.Match[str]) -> str:
        name = match[1] or match[2]
        assert name in env, f"${name} is not set for this step"
        return env[name]

    return [re.sub(r"\$\{(\w+)\}|\$(\w+)", var, word) for word in shlex.split(command)]


def command(script: str, prefix: str, env: Mapping[str, str]) -> list[str]:
    (line,) = [line.strip() for line in script.splitlines() if line.strip().startswith(prefix)]
    return shell(line.split("<<<")[0], env)


@dataclass(frozen=True)
class Release:
    """What the workflow publishes for one tag, read from the workflow file."""

    version: str
    owner: str
    images: dict[str, str]  # matrix image -> the reference pushed
    dockerfiles: dict[str, str]
    chart_path: Path
    chart_version: str
    chart_app_version: str
    chart_remote: str


def release_for(tag: str, owner: str) -> Release:
    proc, out = run_version_step(tag, owner)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    flow = workflow()
    context = {
        "needs.plan.outputs.version": out["version"],
        "needs.plan.outputs.owner": out["owner"],
        "github.actor": "release-bot",
        **{f"env.{k}": v for k, v in flow["env"].items()},
    }
    assert job("plan")["outputs"] == {
        "version": "${{ steps.version.outputs.version }}",
        "owner": "${{ steps.version.outputs.owner }}",
    }

    meta = step("images", id_="meta")
    assert meta["uses"].startswith("docker/metadata-action@")
    build = step("images", uses="docker/build-push-action")
    assert build["with"]["push"] is True
    assert build["with"]["context"] == "."
    assert build["with"]["tags"] == "${{ steps.meta.outputs.tags }}"
    assert build["with"]["labels"] == "${{ steps.meta.outputs.labels }}"
    raw = re.fullmatch(r"type=raw,value=([^,\n]+)", meta["with"]["tags"].strip())
    assert raw is not None, "one tag, the version: the test models type=raw only"
    images, dockerfiles = {}, {}
    for entry in job("images")["strategy"]["matrix"]["include"]:
        matrix = {f"matrix.{k}": str(v) for k, v in entry.items()}
        images[entry["image"]] = expand(meta["with"]["images"], context | matrix) + ":" + expand(raw[1], context)
        dockerfiles[entry["image"]] = expand(build["with"]["file"], context | matrix)

    push = step("chart", runs="helm push")
    env = dict(flow["env"]) | {k: expand(v, context) for k, v in push["env"].items() if "secrets." not in v}
    package = command(push["run"], "helm package", env)
    assert package[:2] == ["helm", "package"]
    args = package[3:]
    options = dict(zip(args[::2], args[1::2], strict=True))
    pushed = command(push["run"], "helm push", env)
    archive = Path(options["--destination"]) / f"kubedgx-{options['--version']}.tgz"
    assert pushed[2] == str(archive), "it pushes the archive it packaged"
    return Release(
        version=out["version"],
        owner=out["owner"],
        images=images,
        dockerfiles=dockerfiles,
        chart_path=ROOT / package[2],
        chart_version=options["--version"],
        chart_app_version=options["--app-version"],
        chart_remote=pushed[3],
    )


def package(release: Release, destination: Path) -> Path:
    return Path(
        helm.package(
            release.chart_path,
            destination=destination,
            version=release.chart_version,
            app_version=release.chart_app_version,
        )
    )


def rendered(archive: Path) -> dict[str, str]:
    """``helm template kubedgx <archive> --namespace kubedgx``, as the plan job runs it (which prints no NOTES)."""
    with helm.Chart.load(str(archive)) as chart:
        out: dict[str, str] = chart.render({}, name="kubedgx", namespace="kubedgx", is_install=True)
    return {template: text for template, text in out.items() if not template.endswith("NOTES.txt")}


def operator_deployment(templates: Mapping[str, str]) -> dict[str, Any]:
    docs = [d for text in templates.values() for d in yaml.safe_load_all(text) if isinstance(d, dict)]
    (deployment,) = [d for d in docs if d.get("kind") == "Deployment"]
    return deployment


def test_the_published_chart_installs_the_images_published_with_it(tmp_path: Path) -> None:
    release = release_for(f"v{python_version()}", UPSTREAM_OWNER)
    assert release.images == {
        "operator": f"ghcr.io/{UPSTREAM_OWNER}/operator:{release.version}",
        "trainer": f"ghcr.io/{UPSTREAM_OWNER}/trainer:{release.version}",
    }
    assert release.dockerfiles == {"operator": "Dockerfile.operator", "trainer": "Dockerfile.trainer"}
    assert all((ROOT / d).is_file() for d in release.dockerfiles.values())
    assert release.chart_path == CHART
    assert release.chart_version == release.chart_app_version == release.version
    assert release.chart_remote == f"oci://ghcr.io/{UPSTREAM_OWNER}/charts"

    archive = package(release, tmp_path)
    assert archive.name == f"kubedgx-{release.version}.tgz"
    report = helm.lint(str(archive), strict=True, kube_version="v1.34.0")
    assert report["errors"] == [], report
    assert [m for m in report["messages"] if m["severity"] >= 2] == [], report["messages"]
    templates = rendered(archive)
    container = operator_deployment(templates)["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert container["image"] == release.images["operator"]
    assert env["KUBEDGX_TRAINER_IMAGE"] == release.images["trainer"]
    assert env["KUBEDGX_DATASYNC_IMAGE"] == release.images["trainer"], "the sync containers run the trainer image"
    # The plan job's own check (grep for the quoted reference in `helm template`) passes too.
    text = "\n".join(templates.values())
    assert all(f'"{image}"' in text for image in release.images.values())


def test_a_fork_whose_values_name_other_images_fails_the_plan_before_pushing(tmp_path: Path) -> None:
    release = release_for(f"v{python_version()}", "Some-Fork")
    assert release.images["operator"] == f"ghcr.io/some-fork/operator:{release.version}"
    text = "\n".join(rendered(package(release, tmp_path)).values())
    assert not any(f'"{image}"' in text for image in release.images.values()), "the plan's grep must fail"
    script = step("plan", runs="helm template")["run"]
    assert '"$REGISTRY/$OWNER/operator:$VERSION" "$REGISTRY/$OWNER/trainer:$VERSION"' in script
    assert "exit 1" in script


def test_the_docs_install_the_chart_from_where_it_is_pushed() -> None:
    release = release_for(f"v{python_version()}", UPSTREAM_OWNER)
    docs = (ROOT / "docs" / "releasing.md").read_text(encoding="utf-8")
    assert f"helm install kubedgx {release.chart_remote}/kubedgx --version" in docs
