"""What the chart tests read off a rendering (test_render.py, test_compose.py): the operator's
Deployment, its container and environment, and what restricted Pod Security (v1.34) refuses in a pod
spec."""

from __future__ import annotations

from typing import Any

from tests.chart.conftest import Rendered, one

#: Volume types restricted Pod Security allows.
RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def deployment(objects: list[Rendered]) -> dict[str, Any]:
    return one(objects, "Deployment", "kubedgx-operator")


def container(objects: list[Rendered]) -> dict[str, Any]:
    containers = deployment(objects)["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["operator"]
    return dict(containers[0])


def env(objects: list[Rendered]) -> dict[str, str]:
    variables = container(objects)["env"]
    names = [e["name"] for e in variables]
    assert len(names) == len(set(names)), f"an environment variable is set twice: {names}"
    return {e["name"]: e.get("value", "") for e in variables}


def restricted_violations(spec: dict[str, Any]) -> list[str]:
    """What the restricted Pod Security Standard (v1.34) refuses in this pod spec."""
    problems = []
    pod_security = spec.get("securityContext") or {}
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(flag):
            problems.append(f"{flag}: true")
    for volume in spec.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            problems.append(f"volume {volume['name']}: {sorted(kinds - RESTRICTED_VOLUMES)}")
    pod_seccomp = (pod_security.get("seccompProfile") or {}).get("type")
    containers = [*spec.get("initContainers", []), *spec["containers"], *spec.get("ephemeralContainers", [])]
    for c in containers:
        sc = c.get("securityContext") or {}
        name = c["name"]
        if sc.get("privileged"):
            problems.append(f"{name}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation is not false")
        capabilities = sc.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            problems.append(f"{name}: capabilities do not drop ALL")
        if set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"}:
            problems.append(f"{name}: adds capabilities {capabilities['add']}")
        if not sc.get("runAsNonRoot", pod_security.get("runAsNonRoot")):
            problems.append(f"{name}: runAsNonRoot is not true")
        if sc.get("runAsUser", pod_security.get("runAsUser")) == 0:
            problems.append(f"{name}: runAsUser 0")
        if (sc.get("seccompProfile") or {}).get("type", pod_seccomp) not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{name}: seccompProfile is not RuntimeDefault")
        if any("hostPort" in p for p in c.get("ports") or []):
            problems.append(f"{name}: hostPort")
    return problems
