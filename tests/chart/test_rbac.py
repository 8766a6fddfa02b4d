"""The chart's RBAC: no wildcards, a purpose comment on every rule, and exactly what the operator calls.

The last part runs the real operator (dgx_operator.runtime.handlers and its validating webhook, configured from
the environment the chart renders) against the in-memory API server of tests/integration, through a
scenario that touches every API path it has: a job's whole life up to its TTL deletion, children whose
create meets a 409 (the operator reads them to see whose they are), a data mount listed with its
Secret and deleted while a job uses it, the deletion of a running job, Events, admission reviews, and
the self-signed webhook's ValidatingWebhookConfiguration. Every request it made, (verb, group,
resource[/subresource], namespace, name), must be allowed by the rendered (Cluster)Roles bound to its
ServiceAccount, and every granted verb must have been used, but for the few listed in EXTRAS.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import ssl
import types
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import kopf
import pytest
import yaml

from dgx_operator.runtime.settings import OperatorConfig
from tests.chart.conftest import CHART, NAMESPACE, OPERATOR_SA, SCENARIOS, Rendered, one, render, render_raw
from tests.conftest import BASE_JOB, with_changes
from tests.integration.admission_helpers import JOB_PATH, MOUNT_PATH, operator_registry, review_request, stored
from tests.integration.conftest import RunOperator
from tests.integration.emulator import Call, Emulator
from tests.integration.mount_scenarios import FILES, SECRET, job_using, mount_events, mount_of, wait_mount
from tests.integration.scenarios import (
    JOB,
    JOBS,
    MOUNTS,
    NS,
    Clock,
    Operator,
    exit_pod,
    lose_a_worker_then_edit_the_trainer,
    run_pod,
    wait_phase,
    worker,
)
from tests.s3 import S3, secret
from tests.support.ports import free_port

ROLE_KINDS = ("ClusterRole", "Role")
VWC = "validatingwebhookconfigurations"

#: The Kueue integration's rules (kueue.enabled): the emulator serves no Kueue API.
KUEUE_RULES = (
    ("kueue.x-k8s.io", "workloads", "list"),
    ("kueue.x-k8s.io", "workloads", "watch"),
    ("kueue.x-k8s.io", "workloads", "create"),
    ("kueue.x-k8s.io", "workloads", "delete"),
    ("kueue.x-k8s.io", "workloads", "patch"),
    ("kueue.x-k8s.io", "workloads/status", "patch"),
    ("kueue.x-k8s.io", "resourceflavors", "list"),
    ("kueue.x-k8s.io", "resourceflavors", "watch"),
    ("kueue.x-k8s.io", "workloadpriorityclasses", "get"),
)
KUEUE_WHY = (
    "Kueue's integration (kueue.enabled): the emulator serves no Kueue API; tests/cluster/test_kueue.py exercises "
    "these against a real Kueue, with the operator authenticated as the chart's ServiceAccount"
)

#: DGXBudgets (issue 31): the API and its pure ledger exist (api/budget.py, reconcile/budgets.py), the controller
#: that calls these does not yet; drop this entry when it does. (``list`` is used already: the webhook lists a
#: namespace's budgets at each admission review of a job.)
BUDGET_RULES = (
    ("kubedgx.io", "dgxbudgets", "get"),
    ("kubedgx.io", "dgxbudgets", "watch"),
    ("kubedgx.io", "dgxbudgets/status", "patch"),
)
BUDGET_WHY = (
    "the scenario run here creates no DGXBudget; the budget controller's reads and its ledger writes are "
    "exercised as the chart's ServiceAccount in tests/cluster/test_cost.py (no 403 at the module's end) and "
    "against the emulator in tests/integration/test_budgets.py"
)

#: Granted but not exercised against the emulator, each with its reason: (group, resource, verb).
EXTRAS = {
    ("kubedgx.io", "dgxtrainingjobs/finalizers", "update"): (
        "the OwnerReferencesPermissionEnforcement admission plugin (on in OpenShift and many distributions) "
        "requires it to create children whose ownerReference has blockOwnerDeletion: true; the emulator has no "
        "admission plugins, and the operator never writes /finalizers itself"
    ),
    **dict.fromkeys(KUEUE_RULES, KUEUE_WHY),
    **dict.fromkeys(BUDGET_RULES, BUDGET_WHY),
}


# -- rules: no wildcards, every rule explained -------------------------------------------------------------


def roles(objects: list[Rendered]) -> list[Rendered]:
    return [r for r in objects if r.kind in ROLE_KINDS]


VARIANTS = [
    *SCENARIOS,
    ("peering", {"peering": {"enabled": True}}),
    ("peering-namespaced", {"peering": {"enabled": True}, "watchNamespaces": ["ml"]}),
    ("no-secrets", {"dataMounts": {"readSecrets": False}}),
]


@pytest.mark.parametrize(("scenario", "values"), VARIANTS, ids=[name for name, _ in VARIANTS])
def test_no_rule_uses_a_wildcard(scenario: str, values: dict[str, Any]) -> None:
    found = roles(render(values))
    assert found
    for role in found:
        for rule in role.obj["rules"]:
            for field in ("verbs", "resources", "apiGroups", "resourceNames"):
                assert not [v for v in rule.get(field, []) if "*" in v], f"{role}: {field} {rule}"
            assert "nonResourceURLs" not in rule, role


def uncommented_rules(text: str) -> list[int]:
    """Line numbers of `- apiGroups:` lines whose previous non-blank line is not a `#` comment."""
    lines = text.splitlines()
    missing = []
    for i, line in enumerate(lines):
        if line.lstrip().startswith("- apiGroups:"):
            above = next((x for x in reversed(lines[:i]) if x.strip()), "")
            if not above.lstrip().startswith("# "):
                missing.append(i + 1)
    return missing


def test_every_rule_carries_a_purpose_comment_in_the_template() -> None:
    """Each rule of the RBAC templates follows a `#` comment line saying what it is for; the comments are
    rendered too, so `helm template` shows an admin why each permission is there."""
    sources = [CHART / "templates" / "_rbac.tpl", CHART / "templates" / "rbac.yaml"]
    rules = sum(p.read_text(encoding="utf-8").count("- apiGroups:") for p in sources)
    assert rules >= 12
    for path in sources:
        assert uncommented_rules(path.read_text(encoding="utf-8")) == [], path.name
    for _, values in VARIANTS:
        text = render_raw(values)["kubedgx/templates/rbac.yaml"]
        assert text.count("- apiGroups:") >= 8
        assert uncommented_rules(text) == []
    assert uncommented_rules("rules:\n  - apiGroups: []\n") == [2]


def test_secrets_are_read_only_when_data_mounts_may() -> None:
    """Any Secret (a mount's credentials) only with dataMounts.readSecrets; the webhook's own Secret, by name,
    always (self-signed mode)."""

    def grants_secrets(values: dict[str, Any]) -> bool:
        return any(
            "secrets" in rule["resources"] and "resourceNames" not in rule
            for role in roles(render(values))
            for rule in role.obj["rules"]
        )

    assert grants_secrets({})
    assert not grants_secrets({"dataMounts": {"readSecrets": False}})
    assert not grants_secrets({"dataMounts": {"readSecrets": False}, "watchNamespaces": ["ml"]})


def test_peering_adds_kopfs_peering_objects() -> None:
    def resources(values: dict[str, Any], kind: str) -> set[str]:
        return {
            res
            for role in roles(render(values))
            if role.kind == kind
            for r in role.obj["rules"]
            for res in r["resources"]
        }

    assert "clusterkopfpeerings" in resources({"peering": {"enabled": True}}, "ClusterRole")
    namespaced = {"peering": {"enabled": True}, "watchNamespaces": ["ml"]}
    assert "kopfpeerings" in resources(namespaced, "Role")
    assert "clusterkopfpeerings" not in resources(namespaced, "ClusterRole")
    assert not {"kopfpeerings", "clusterkopfpeerings"} & (resources({}, "ClusterRole"))


# -- what the rules grant ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Grant:
    group: str
    resource: str  # "pods", "dgxtrainingjobs/status"
    verb: str
    namespace: str | None  # None: every namespace (a ClusterRole bound cluster-wide)
    names: frozenset[str] | None  # resourceNames; None: any

    def allows(self, call: Call) -> bool:
        resource = f"{call.resource}/{call.subresource}" if call.subresource else call.resource
        return (
            (self.group, self.resource, self.verb) == (call.group, resource, call.verb)
            and self.namespace in (None, call.namespace)
            and (self.names is None or call.name in self.names)
        )


def grants(objects: list[Rendered], account: str = OPERATOR_SA, namespace: str = NAMESPACE) -> list[Grant]:
    """What the roles bound to the ServiceAccount grant it."""
    subject = {"kind": "ServiceAccount", "name": account, "namespace": namespace}
    role_rules = {(r.kind, r.obj["metadata"].get("namespace"), r.name): r.obj["rules"] for r in roles(objects)}
    out = []
    for binding in objects:
        if binding.kind not in ("ClusterRoleBinding", "RoleBinding") or subject not in binding.obj["subjects"]:
            continue
        where = binding.obj["metadata"].get("namespace")  # None for a ClusterRoleBinding
        ref = binding.obj["roleRef"]
        rules = role_rules[(ref["kind"], where if ref["kind"] == "Role" else None, ref["name"])]
        for rule in rules:
            names = frozenset(rule["resourceNames"]) if "resourceNames" in rule else None
            out += [
                Grant(group, resource, verb, where, names)
                for group in rule["apiGroups"]
                for resource in rule["resources"]
                for verb in rule["verbs"]
            ]
    return out


def test_the_grant_model_reads_bindings_and_resource_names() -> None:
    namespaced = grants(render({"watchNamespaces": ["ml", "research"]}))
    pods_in = {g.namespace for g in namespaced if (g.resource, g.verb) == ("pods", "create")}
    assert pods_in == {"ml", "research"}
    vwc = [g for g in grants(render()) if g.resource == VWC]
    assert {(g.verb, g.names) for g in vwc} == {
        ("get", frozenset({"kubedgx-webhook"})),
        ("patch", frozenset({"kubedgx-webhook"})),
    }
    assert grants(render({"serviceAccount": {"create": False, "name": "other"}})) == []

    def call(verb: str, resource: str, namespace: str | None, name: str | None) -> Call:
        group = "admissionregistration.k8s.io" if resource == VWC else ""
        return Call("X", "/", {}, verb, group, resource, None, namespace, name)

    assert any(g.allows(call("patch", VWC, None, "kubedgx-webhook")) for g in grants(render()))
    assert not any(g.allows(call("patch", VWC, None, "someone-elses")) for g in grants(render()))
    assert any(g.allows(call("create", "pods", "research", "p")) for g in namespaced)
    assert not any(g.allows(call("create", "pods", "default", "p")) for g in namespaced)
    assert not any(g.allows(call("list", "pods", None, None)) for g in namespaced)


# -- the operator's calls ------------------------------------------------------------------------------------


def chart_config(objects: list[Rendered], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> OperatorConfig:
    """The operator's configuration from the rendered Deployment's environment, as in the cluster, but for
    local files and ports: the catalog ConfigMap written to a file, the webhook on a free loopback port,
    no metrics or health servers, the short backoffs of the integration tests."""
    deployment = one(objects, "Deployment")
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    variables = {e["name"]: e["value"] for e in env if "value" in e}
    variables["POD_NAME"] = "kubedgx-operator-0"  # valueFrom metadata.name
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(one(objects, "ConfigMap", "kubedgx-catalog")["data"]["catalog.yaml"], encoding="utf-8")
    variables |= {"KUBEDGX_CATALOG": str(catalog), "KUBEDGX_METRICS_PORT": "0", "KUBEDGX_HEALTH_PORT": "0"}
    variables["KUBEDGX_WEBHOOK_PORT"] = str(free_port())
    for name in [n for n in os.environ if n.startswith("KUBEDGX_")]:
        monkeypatch.delenv(name)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    config = OperatorConfig.from_env()
    assert config.webhook is not None
    assert config.webhook.mode == "self-signed"
    return dataclasses.replace(
        config,
        webhook=dataclasses.replace(config.webhook, host="127.0.0.1"),
        error_backoffs=(0.1, 0.2, 0.5, 1.0),
        retry_base=0.1,
        metrics_port=0,
        health_port=0,
    )


def install_webhook_configuration_api(emulator: Emulator, tmp_path: Path) -> None:
    """The emulator serves no admissionregistration.k8s.io: a cluster-scoped stand-in CRD of the same
    group and plural gives the operator's create and patch of its ValidatingWebhookConfiguration the same
    URLs and verbs."""
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{VWC}.admissionregistration.k8s.io"},
        "spec": {
            "group": "admissionregistration.k8s.io",
            "scope": "Cluster",
            "names": {
                "plural": VWC,
                "singular": "validatingwebhookconfiguration",
                "kind": "ValidatingWebhookConfiguration",
                "listKind": "ValidatingWebhookConfigurationList",
            },
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                }
            ],
        },
    }
    path = tmp_path / "vwc-crd.yaml"
    path.write_text(yaml.safe_dump(crd), encoding="utf-8")
    emulator.install_crds([path])


async def start(
    emulator: Emulator, run_operator: RunOperator, config: OperatorConfig, namespaces: tuple[str, ...]
) -> Operator:
    """The operator with its webhook (dgx_operator.runtime.handlers + webhooks in a registry of their own), and the
    test's clock on its controller (for the TTL)."""
    module = types.ModuleType("kubedgx_operator_for_rbac")
    module.registry = operator_registry()  # type: ignore[attr-defined]
    memo = kopf.Memo(config=config)
    run = await run_operator(
        module, clusterwide=not namespaces, namespaces=namespaces or ("ml",), wait_for=(JOBS, "pods"), memo=memo
    )
    op = Operator(emulator, run, memo, Clock())
    op.controller.now = op.clock
    op.controller.on_reconciled = op._reconciled
    trigger = op.controller.trigger

    def triggered(namespace: str, name: str) -> None:
        trigger(namespace, name)
        emulator.notify()

    op.controller.trigger = triggered  # type: ignore[method-assign]
    return op


async def admit(port: int, path: str, obj: dict[str, Any]) -> None:
    """An AdmissionReview over TLS to the operator's self-signed webhook (the certificate is for the
    Service's DNS names, not 127.0.0.1: not verified here)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    async with aiohttp.ClientSession() as http:
        url = f"https://127.0.0.1:{port}{path}"
        async with http.post(url, json=review_request("CREATE", obj), ssl=context) as response:
            assert response.status == 200, await response.text()
            answer = await response.json()
    assert answer["response"]["allowed"] is True, answer


async def exercise(op: Operator, s3: S3, config: OperatorConfig) -> None:
    emulator = op.emulator
    assert config.webhook is not None
    # The chart's webhook configuration gets the replicas' CA; this replica wins the chart's empty Lease.
    await emulator.wait_for(
        lambda: all(
            "caBundle" in h["clientConfig"] for h in emulator.get(VWC, None, config.webhook.configuration)["webhooks"]
        ),
        message="the caBundle",
    )
    await emulator.wait_for(lambda: op.memo.elector.leading, message="the Lease")

    # A job's whole life; its children's creates each meet a 409 first (the operator reads the object
    # to see whose it is: gone, so it tries again).
    for resource in ("pods", "services", "configmaps"):
        emulator.fail("create", resource, code=409, times=1)
    emulator.create(JOBS, with_changes(BASE_JOB, {"metadata.name": "ttl", "spec.ttlSecondsAfterFinished": 60}))
    await emulator.wait_for_object("pods", NS, worker(0, "ttl"))
    run_pod(emulator, worker(0, "ttl"))
    await wait_phase(emulator, "Running", name="ttl")
    exit_pod(emulator, worker(0, "ttl"), 0)
    await wait_phase(emulator, "Succeeded", name="ttl")
    op.clock.advance(timedelta(seconds=60))
    await op.trigger("ttl")
    await emulator.wait_for_absence(JOBS, NS, "ttl")

    # A worker stuck on a lost node is let go of (pods patch); a superseded trainer config is
    # deleted (configmaps delete).
    await lose_a_worker_then_edit_the_trainer(op)

    # A data mount listed with its Secret; admission of a job using it (the webhook reads the mount).
    bucket = s3.bucket(objects=FILES)
    emulator.create("secrets", secret(SECRET))
    mount = mount_of(s3, bucket)
    emulator.create(MOUNTS, mount)
    await wait_mount(emulator, "Ready")
    job = job_using(("data", "/data"))
    await admit(config.webhook.port, MOUNT_PATH, stored(mount))
    await admit(config.webhook.port, JOB_PATH, stored(job))
    emulator.create(JOBS, job)
    await emulator.wait_for_object("pods", NS, worker(0))
    run_pod(emulator, worker(0))
    await wait_phase(emulator, "Running")

    # The mount's deletion waits for the job (an InUse Event); deleting the running job deletes its
    # worker and releases both finalizers.
    emulator.delete(MOUNTS, NS, "data")
    await emulator.wait_for(
        lambda: "InUse" in [r for _, r, _ in mount_events(emulator)], message="the mount's InUse event"
    )
    emulator.delete(JOBS, NS, JOB)
    await emulator.wait_for_absence(JOBS, NS, JOB, timeout=10)
    await emulator.wait_for_absence(MOUNTS, NS, "data", timeout=10)
    await op.stop()


def used(calls: Iterable[Call]) -> set[tuple[str, str, str]]:
    return {
        (c.group or "", f"{c.resource}/{c.subresource}" if c.subresource else str(c.resource), c.verb)
        for c in calls
        if c.verb is not None
    }


MODES = [("cluster-wide", ()), ("namespaced", ("ml", "research"))]


@pytest.mark.asyncio
@pytest.mark.timeout(60)
@pytest.mark.parametrize(("mode", "namespaces"), MODES, ids=[m for m, _ in MODES])
async def test_the_rbac_allows_every_call_of_the_operator_and_no_more(
    emulator: Emulator,
    run_operator: RunOperator,
    s3: S3,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
    namespaces: tuple[str, ...],
) -> None:
    objects = render({"watchNamespaces": list(namespaces)})
    config = chart_config(objects, tmp_path, monkeypatch)
    assert tuple(config.namespaces) == namespaces
    for namespace in namespaces:
        if namespace != "ml":
            emulator.create_namespace(namespace)
    install_webhook_configuration_api(emulator, tmp_path)
    assert config.webhook is not None
    # What the chart renders for the replicas to write: the configuration, the certificate's Secret (empty)
    # and the leader election Lease (empty), in the release namespace.
    emulator.create_namespace(NAMESPACE)
    for kind, resource in (("ValidatingWebhookConfiguration", VWC), ("Secret", "secrets"), ("Lease", "leases")):
        (obj,) = [r.obj for r in objects if r.kind == kind]
        emulator.create(resource, obj, namespace=None if kind == "ValidatingWebhookConfiguration" else NAMESPACE)
    op = await start(emulator, run_operator, config, namespaces)
    await asyncio.wait_for(exercise(op, s3, config), timeout=45)

    calls = [c for c in emulator.log if c.verb is not None]
    allowed = grants(objects)
    refused = sorted(
        {
            f"{c.verb} {c.group}/{c.resource}{'/' + c.subresource if c.subresource else ''} "
            f"ns={c.namespace} name={c.name}"
            for c in calls
            if not any(g.allows(c) for g in allowed)
        }
    )
    assert refused == [], "the operator made calls its RBAC does not allow"

    granted = {(g.group, g.resource, g.verb) for g in allowed}
    assert EXTRAS.keys() <= granted, "an EXTRAS entry is no longer granted: drop it"
    unused = sorted(granted - used(calls) - EXTRAS.keys())
    assert unused == [], "granted but never used by the operator: drop the verb or list it in EXTRAS with why"
    # Sanity: the scenario did reach the paths that make each rule necessary.
    assert {("", "secrets", "get"), ("kubedgx.io", "dgxtrainingjobs", "delete"), ("", "events", "create")} <= used(
        calls
    )
    assert {("admissionregistration.k8s.io", VWC, "get"), ("admissionregistration.k8s.io", VWC, "patch")} <= used(calls)
    assert {("coordination.k8s.io", "leases", "update"), ("", "secrets", "patch")} <= used(calls)
    if namespaces:
        assert ("", "namespaces", "watch") in used(calls)


def test_the_rules_match_the_documented_list() -> None:
    """The chart README's RBAC table names every rule the default and namespaced installs render."""
    readme = (CHART / "README.md").read_text(encoding="utf-8")
    for values in ({}, {"watchNamespaces": ["ml"]}):
        for role in roles(render(values)):
            for rule in role.obj["rules"]:
                for resource in rule["resources"]:
                    verbs = ", ".join(rule["verbs"])
                    assert re.search(rf"\| `{re.escape(resource)}` \| {re.escape(verbs)} \|", readme), (resource, verbs)
