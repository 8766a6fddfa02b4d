"""Users can use it (issue 17, item 3): the chart's ClusterRoles aggregate DGXTrainingJobs and
DGXDataMounts into Kubernetes' default ``admin``, ``edit`` and ``view`` roles, proven on the real
apiserver: the controller-manager's clusterrole-aggregation controller merges them, and kubectl,
impersonating users bound to those roles in one namespace, is allowed or refused by the apiserver's
RBAC authorizer. The admin impersonates (system:masters may)."""

from __future__ import annotations

import json
from typing import Any

from tests.chart.conftest import Rendered
from tests.e2e.jobs import command_job
from tests.e2e.kubectl import JOBS, MOUNTS, Kubectl, wait_for

MOUNT: dict[str, Any] = {
    "apiVersion": "kubedgx.io/v1alpha1",
    "kind": "DGXDataMount",
    "metadata": {"name": "data"},
    "spec": {"source": "s3://bucket/data"},
}


def bind(k: Kubectl, user: str, role: str) -> None:
    k.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": f"{user}-{role}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        }
    )


def can(k: Kubectl, user: str, *args: str) -> bool:
    return k.run("auth", "can-i", *args, f"--as={user}", check=False).stdout.strip() == "yes"


def test_the_default_roles_include_both_kinds(chart: list[Rendered], kubectl: Kubectl) -> None:
    """What the aggregation controller made of the chart's ClusterRoles: the rules are in the defaults."""
    for role, verbs in (("edit", {"create", "delete", "patch", "update"}), ("admin", {"create"}), ("view", {"list"})):

        def merged(role: str = role, verbs: set[str] = verbs) -> bool:
            rules = (kubectl.get("clusterrole", role) or {}).get("rules") or []
            return any("dgxtrainingjobs" in r.get("resources", []) and verbs <= set(r["verbs"]) for r in rules)

        wait_for(f"the {role} ClusterRole to aggregate the chart's rules", merged, timeout=60, interval=0.5)


def test_an_editor_applies_a_job_and_a_viewer_only_reads_it(chart: list[Rendered], namespace: Kubectl) -> None:
    bind(namespace, "alice", "edit")
    bind(namespace, "bob", "view")
    wait_for("alice may create jobs", lambda: can(namespace, "alice", "create", JOBS), timeout=60, interval=0.5)

    alice = namespace
    alice.run("apply", "--as=alice", "-f", "-", input=_json(command_job("mine")))
    alice.run("apply", "--as=alice", "-f", "-", input=_json(MOUNT))
    assert namespace.get(JOBS, "mine") is not None
    # Edits and deletes of their own namespace's objects are theirs too.
    alice.run("label", JOBS, "mine", "team=ml", "--as=alice")
    alice.run("delete", MOUNTS, "data", "--as=alice", "--wait=false")

    listed = namespace.run("get", JOBS, "--as=bob", "-o", "name").stdout.split()
    assert listed == ["dgxtrainingjob.kubedgx.io/mine"]
    refused = namespace.run("apply", "--as=bob", "-f", "-", input=_json(command_job("theirs")), check=False)
    assert refused.returncode != 0
    assert 'User "bob" cannot create resource "dgxtrainingjobs"' in refused.stderr, refused.stderr
    assert not can(namespace, "bob", "delete", f"{JOBS}/mine")

    # The status is the operator's: no user role writes it.
    for user in ("alice", "bob"):
        assert can(namespace, user, "get", f"{JOBS}/mine", "--subresource=status")
        assert not can(namespace, user, "patch", f"{JOBS}/mine", "--subresource=status")
    wrote = namespace.run(
        "patch",
        JOBS,
        "mine",
        "--as=alice",
        "--subresource=status",
        "--type=merge",
        "-p",
        '{"status": {"phase": "Succeeded"}}',
        check=False,
    )
    assert wrote.returncode != 0
    assert "forbidden" in wrote.stderr.lower(), wrote.stderr

    # Bound in this namespace only, and nobody else at all.
    assert not can(namespace.in_namespace("default"), "alice", "create", JOBS)
    assert not can(namespace, "mallory", "list", JOBS)


def _json(obj: dict[str, Any]) -> str:
    return json.dumps(obj)
