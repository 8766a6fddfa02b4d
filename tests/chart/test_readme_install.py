"""README.md's "Install on a cluster" is a newcomer's first contact with a cluster, and its commands are
copied as they are. So they are read out of README.md itself (its bash blocks, continuation lines joined,
and every `--set` in its prose) and checked here, where no Docker engine or cluster exists:

* the images pushed are the images built, from Dockerfiles that exist, with the build context `.`;
* every `helm install` renders (with Helm's own Go code, helm-python-sdk), so every `--set` is a value
  the chart's values.schema.json accepts; and the main one points the operator's Deployment at the
  pushed operator image and KUBEDGX_TRAINER_IMAGE / KUBEDGX_DATASYNC_IMAGE at the pushed trainer image,
  with the pull Secret created in the release's namespace, even for a tag that looks like a number;
* the rollout check names the Deployment the chart renders, in that namespace;
* the workers' namespace gets the same pull Secret on its default ServiceAccount, and the quickstart
  is applied there;
* the no-Helm path applies `kubedgx manifests` and runs `kubedgx operator` with flags it has, whose
  trainer image is the pushed one.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import helm_python as helm
import pytest

from dgx_operator.cli.main import build_parser, operator_environment
from dgx_operator.runtime.settings import OperatorConfig
from tests.chart.conftest import one, render
from tests.conftest import ROOT

#: What the test substitutes for the README's variables. A tag of digits only: Helm's --set would read
#: it as a number, which the chart's schema refuses, so the README must pass tags as strings.
VARIABLES = {
    "REGISTRY": "registry.test:5000/team-a",
    "TAG": "20260101",
    "REGISTRY_USER": "someone",
    "REGISTRY_TOKEN": "s3cr3t",
}


def section() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    return readme.split("\n## Install on a cluster\n", 1)[1].split("\n## ", 1)[0]


def commands(text: str) -> list[list[str]]:
    """The commands of the section's bash blocks, as the shell would split them (comments dropped,
    continuation lines joined, pipelines cut at ``|``), with the test's VARIABLES expanded. Assignments
    are checked to be of the VARIABLES the README defines and left out."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if not words:
                continue
            if re.fullmatch(r"[A-Z_]+=.*", words[0]):
                assert words[0].split("=", 1)[0] in VARIABLES, words[0]
                continue
            pipeline: list[list[str]] = [[]]
            for word in words:
                if word == "|":
                    pipeline.append([])
                else:
                    pipeline[-1].append(expand(word))
            out.extend(pipeline)
    return out


def expand(word: str) -> str:
    def var(match: re.Match[str]) -> str:
        name = match[1] or match[2]
        assert name in VARIABLES, f"README uses ${name}, which it never sets"
        return VARIABLES[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", var, word)


def readme_assignments() -> dict[str, str]:
    """The README's own ``NAME=value`` lines (values as written)."""
    return dict(re.findall(r"^([A-Z_]+)=(\S+)", section(), flags=re.MULTILINE))


def kubectl_namespace(words: list[str]) -> str | None:
    for i, word in enumerate(words):
        if word in ("-n", "--namespace"):
            return words[i + 1]
        if word.startswith("--namespace="):
            return word.split("=", 1)[1]
    return None


def merge(base: dict[str, Any], layer: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in layer.items():
        out[key] = merge(out[key], value) if isinstance(value, Mapping) and isinstance(out.get(key), dict) else value
    return out


@dataclass
class HelmInstall:
    release: str
    chart: str
    namespace: str | None
    values: dict[str, Any] = field(default_factory=dict)


def helm_install(words: list[str]) -> HelmInstall:
    """``helm install NAME CHART [-n NS] [--create-namespace] [--set X]... [--set-string X]...``; Helm's
    own parsers for the --set expressions, merged in order as Helm merges them."""
    assert words[:2] == ["helm", "install"], words
    positional: list[str] = []
    namespace = None
    values: dict[str, Any] = {}
    rest = iter(words[2:])
    for word in rest:
        if word in ("-n", "--namespace"):
            namespace = next(rest)
        elif word in ("--set", "--set-string"):
            parse = helm.parse_set_string if word == "--set" else helm.parse_set_string_values
            values = merge(values, parse(next(rest)))
        elif word in ("--create-namespace", "--wait", "--atomic"):
            continue
        elif word == "--version":
            next(rest)
        else:
            assert not word.startswith("-"), f"the test does not know helm install {word}: extend it"
            positional.append(word)
    release, chart = positional
    return HelmInstall(release, chart, namespace, values)


@dataclass
class Install:
    """The section's commands, read."""

    builds: dict[str, str]  # Dockerfile -> image reference
    pushes: list[str]
    secrets: dict[str, str]  # namespace -> docker-registry Secret created there
    servers: dict[str, str]  # namespace -> its --docker-server
    installs: list[HelmInstall]
    rollouts: list[tuple[str | None, str]]
    patches: dict[str, dict[str, Any]]  # namespace -> the patch of its default ServiceAccount
    applies: dict[str, list[str]]  # namespace -> files applied there
    no_helm: list[list[str]]  # kubedgx ... commands


def read() -> Install:
    install = Install({}, [], {}, {}, [], [], {}, {}, [])
    for words in commands(section()):
        if words[:2] == ["docker", "build"]:
            options = dict(zip(words[2:-1:2], words[3:-1:2], strict=True))
            assert words[-1] == ".", "the build context is the checkout (what .dockerignore describes)"
            install.builds[options["-f"]] = options["-t"]
        elif words[:2] == ["docker", "push"]:
            install.pushes.append(words[2])
        elif words[:2] == ["helm", "test"]:
            # The release installed above; its hook is rendered and run in tests/chart and test_chart_hooks.py.
            assert words[2:] == ["kubedgx", "-n", "kubedgx"], words
        elif words[0] == "helm":
            install.installs.append(helm_install(words))
        elif words[0] == "kubectl":
            ns = kubectl_namespace(words)
            verb = [w for w in words[1:] if w not in ("-n", ns)]
            if verb[:3] == ["create", "secret", "docker-registry"]:
                assert ns is not None
                install.secrets[ns] = verb[3]
                install.servers[ns] = next(w.split("=", 1)[1] for w in verb if w.startswith("--docker-server="))
            elif verb[:2] == ["rollout", "status"]:
                install.rollouts.append((ns, verb[2]))
            elif verb[:3] == ["patch", "serviceaccount", "default"]:
                assert ns is not None
                install.patches[ns] = json.loads(verb[verb.index("-p") + 1])
            elif verb[:2] == ["apply", "-f"] and ns is not None:
                install.applies.setdefault(ns, []).append(verb[2])
        elif words[0] == "kubedgx":
            install.no_helm.append(words)
    return install


def image(repository: str, tag: str) -> str:
    return f"{VARIABLES['REGISTRY']}/{repository}:{tag}"


PUSHED_OPERATOR = image("kubedgx-operator", VARIABLES["TAG"])
PUSHED_TRAINER = image("kubedgx-trainer", VARIABLES["TAG"])


def test_the_images_pushed_are_the_images_built_from_the_dockerfiles() -> None:
    install = read()
    assert install.builds == {"Dockerfile.operator": PUSHED_OPERATOR, "Dockerfile.trainer": PUSHED_TRAINER}
    assert all((ROOT / dockerfile).is_file() for dockerfile in install.builds)
    assert sorted(install.pushes) == sorted(install.builds.values())
    assert set(readme_assignments()) == {"REGISTRY", "TAG"}, "the README sets what its commands use"


def main_install() -> tuple[HelmInstall, Install]:
    install = read()
    (main,) = [i for i in install.installs if "image" in i.values]
    return main, install


def test_the_helm_install_points_the_chart_at_the_pushed_images() -> None:
    main, install = main_install()
    assert (ROOT / main.chart).resolve() == (ROOT / "charts" / "kubedgx").resolve()
    assert main.namespace is not None
    objects = render(main.values, name=main.release, namespace=main.namespace)  # the schema is checked here
    deployment = one(objects, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert container["image"] == PUSHED_OPERATOR
    assert env["KUBEDGX_TRAINER_IMAGE"] == PUSHED_TRAINER
    assert env["KUBEDGX_DATASYNC_IMAGE"] == PUSHED_TRAINER
    assert pod["imagePullSecrets"] == [{"name": install.secrets[main.namespace]}], "the Secret of its namespace"
    assert install.rollouts == [(main.namespace, f"deployment/{deployment['metadata']['name']}")]


def test_the_tags_survive_helms_number_parsing() -> None:
    """The same install with the README's --set-string turned into --set: the schema refuses the numeric
    tag, so this test would notice a README that dropped --set-string."""
    main, _ = main_install()
    as_number = helm.parse_set_string(f"image.tag={VARIABLES['TAG']}")
    with pytest.raises(helm.HelmValuesError, match="/image/tag"):
        render(merge(main.values, as_number), name=main.release, namespace=main.namespace or "default")


def test_the_pull_secret_is_for_the_registry_pushed_to() -> None:
    install = read()
    host = readme_assignments()["REGISTRY"].split("/")[0]
    assert install.servers
    assert set(install.servers.values()) == {host}


def test_every_set_in_the_section_is_a_value_the_chart_accepts() -> None:
    """Each `helm install` of the section's blocks, and each `--set ...` its prose names, rendered."""
    install = read()
    for each in install.installs:
        render(each.values, name=each.release, namespace=each.namespace or "default")
    inline = re.findall(r"`((?:--set(?:-string)? )[^`]+)`", section())
    assert inline, "the prose names other values (cert-manager, watchNamespaces)"
    for text in inline:
        words = shlex.split(text)
        values = helm_install(["helm", "install", "kubedgx", "./charts/kubedgx", *words]).values
        assert values, text
        render(values)


def test_the_workers_namespace_pulls_with_the_same_secret() -> None:
    install = read()
    (namespace,) = [ns for ns, files in install.applies.items() if "examples/quickstart.yaml" in files]
    secret = install.secrets[namespace]
    assert install.patches[namespace] == {"imagePullSecrets": [{"name": secret}]}


def parse_operator(words: list[str]) -> argparse.Namespace:
    assert words[:2] == ["kubedgx", "operator"], words
    return build_parser().parse_args(words[1:])


def test_the_no_helm_path_applies_the_manifests_and_runs_the_pushed_trainer_image() -> None:
    install = read()
    assert ["kubedgx", "manifests"] in install.no_helm
    section_text = section()
    assert "kubedgx manifests | kubectl apply -f -" in section_text
    (operator,) = [w for w in install.no_helm if w[:2] == ["kubedgx", "operator"]]
    config = OperatorConfig.from_env(operator_environment(parse_operator(operator), {}))
    assert config.trainer_image == PUSHED_TRAINER
    assert config.namespaces == ("ml",)
