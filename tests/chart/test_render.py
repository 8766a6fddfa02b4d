"""charts/kubedgx rendered with Helm's Go code for the default values and every ci/*.yaml scenario:
lint, strict Kubernetes 1.34 schemas, restricted Pod Security, and what each value does to the objects."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from dgx_operator.catalog import Catalog
from dgx_operator.runtime.settings import OperatorConfig
from dgx_operator.webhook import admission
from tests.chart.conftest import (
    CHART,
    KUBE_VERSION,
    NAMESPACE,
    RELEASE,
    ROOT,
    SCENARIOS,
    Rendered,
    chart_values,
    find,
    notes,
    one,
    render,
    render_raw,
)
from tests.chart.render_helpers import container, deployment, env, restricted_violations

SCENARIO_IDS = [name for name, _ in SCENARIOS]

#: Kinds kubernetes-validate has no schema for (their CRDs are not part of Kubernetes); the tests below
#: check their essentials by hand.
CUSTOM_KINDS = {
    ("cert-manager.io/v1", "Certificate"),
    ("cert-manager.io/v1", "Issuer"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
}
#: Kinds that hold or run pods.
POD_KINDS = {"Pod", "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob"}
DIGEST = "sha256:" + "ab" * 32


def merged(*layers: dict[str, Any]) -> dict[str, Any]:
    """Values layers merged as Helm merges -f files (maps deeply, everything else replaced)."""
    out: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if isinstance(value, dict) and isinstance(out.get(key), dict):
                out[key] = merged(out[key], value)
            else:
                out[key] = copy.deepcopy(value)
    return out


# -- lint and schemas ----------------------------------------------------------------------------


@pytest.mark.parametrize(("scenario", "values"), SCENARIOS, ids=SCENARIO_IDS)
def test_helm_lint_strict_finds_nothing(scenario: str, values: dict[str, Any]) -> None:
    report = helm.lint(str(CHART), values, strict=True, namespace=NAMESPACE, kube_version=f"v{KUBE_VERSION}.0")
    assert report["errors"] == []
    # Severity 1 is information ("icon is recommended"); warnings (2) and errors (3) fail.
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert problems == []


@pytest.mark.parametrize(("scenario", "values"), SCENARIOS, ids=SCENARIO_IDS)
def test_every_object_passes_the_kubernetes_schemas_strictly(scenario: str, values: dict[str, Any]) -> None:
    objects = render(values, hooks=True)
    assert objects
    checked = 0
    for rendered in objects:
        obj = rendered.obj
        if (obj["apiVersion"], obj["kind"]) in CUSTOM_KINDS:
            continue
        try:
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{rendered}: {exc.message} at {'.'.join(str(p) for p in exc.path)}")
        checked += 1
    assert checked >= 7  # at least the Deployment, its ServiceAccount, RBAC, catalog and Services


def test_the_schema_validator_is_strict() -> None:
    """The check above can fail: an unknown field in the operator's Deployment is an error."""
    broken = copy.deepcopy(deployment(render()))
    broken["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy2"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBE_VERSION, strict=True)


@pytest.mark.parametrize(("scenario", "values"), SCENARIOS, ids=SCENARIO_IDS)
def test_every_object_is_labelled_and_namespaced_objects_are_in_the_release_namespace(
    scenario: str, values: dict[str, Any]
) -> None:
    watched = set(values.get("watchNamespaces") or [])
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "PriorityClass"}
    cluster_scoped.add("ValidatingWebhookConfiguration")
    for rendered in render(values, hooks=True):
        meta = rendered.obj["metadata"]
        assert meta["labels"]["app.kubernetes.io/instance"] == RELEASE, rendered
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "Helm", rendered
        if rendered.kind in cluster_scoped:
            assert "namespace" not in meta, rendered
        elif rendered.kind in ("Role", "RoleBinding") and rendered.name.endswith("-self"):
            assert meta["namespace"] == NAMESPACE, rendered  # the Lease and the webhook's Secret
        elif rendered.kind in ("Role", "RoleBinding") and rendered.name.endswith("-test"):
            # helm test's dry runs, where jobs run: the first watched namespace, else the release's.
            assert meta["namespace"] == (values.get("watchNamespaces") or [NAMESPACE])[0], rendered
        elif rendered.kind in ("Role", "RoleBinding"):
            assert meta["namespace"] in watched, rendered
        else:
            assert meta["namespace"] == NAMESPACE, rendered


# -- Pod Security ----------------------------------------------------------------------------------


def pod_specs(objects: list[Rendered]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for rendered in objects:
        if rendered.kind not in POD_KINDS:
            continue
        spec = rendered.obj["spec"]
        if rendered.kind == "CronJob":
            spec = spec["jobTemplate"]["spec"]
        if rendered.kind != "Pod":
            spec = spec["template"]["spec"]
        out.append((str(rendered), spec))
    return out


@pytest.mark.parametrize(("scenario", "values"), SCENARIOS, ids=SCENARIO_IDS)
def test_every_pod_template_meets_restricted_pod_security(scenario: str, values: dict[str, Any]) -> None:
    specs = pod_specs(render(values, hooks=True))
    assert [name for name, _ in specs] == [
        "Deployment/kubedgx-operator (kubedgx/templates/deployment.yaml)",
        "Pod/kubedgx-test (kubedgx/templates/tests/check-install.yaml)",  # helm test
    ]
    for name, spec in specs:
        assert restricted_violations(spec) == [], name
        for c in spec["containers"]:
            assert c["securityContext"]["readOnlyRootFilesystem"] is True, name
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}


def test_the_pod_security_check_catches_violations() -> None:
    spec = copy.deepcopy(deployment(render())["spec"]["template"]["spec"])
    spec["hostNetwork"] = True
    spec["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
    spec["containers"][0]["securityContext"] = {"privileged": True}
    spec["securityContext"] = {}
    assert restricted_violations(spec) == [
        "hostNetwork: true",
        "volume host: ['hostPath']",
        "operator: privileged",
        "operator: allowPrivilegeEscalation is not false",
        "operator: capabilities do not drop ALL",
        "operator: runAsNonRoot is not true",
        "operator: seccompProfile is not RuntimeDefault",
    ]


# -- the operator's Deployment -------------------------------------------------------------------------


def test_two_replicas_roll_and_one_leads_with_the_documented_interface() -> None:
    """Every replica serves the webhook, one (the Lease's holder) reconciles; an upgrade starts a new replica
    before it stops an old one, and a stopping one stays in service for shutdownDelay (docs: chart README)."""
    objects = render()
    dep = deployment(objects)
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    pod = dep["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 30
    assert pod["serviceAccountName"] == one(objects, "ServiceAccount")["metadata"]["name"] == "kubedgx-operator"
    # The securityContexts are values now (podSecurityContext, securityContext); their defaults are what
    # the chart rendered before they were.
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 10001,
        "runAsGroup": 10001,
        "fsGroup": 10001,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert container(objects)["securityContext"] == {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert not {"topologySpreadConstraints"} & set(pod)
    assert "envFrom" not in container(objects)
    assert pod["securityContext"]["runAsUser"] == 10001
    c = container(objects)
    assert c["image"] == "ghcr.io/kubedgx/operator:0.1.0"
    assert c["command"] == ["kubedgx"]
    assert c["args"] == ["operator", "--standalone", "--log-format", "json"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"health": 8081, "metrics": 8080, "webhook": 9443}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert c["resources"]["requests"] == {"cpu": "100m", "memory": "256Mi"}
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in c["env"]
    assert env(objects) == {
        "POD_NAME": "",  # valueFrom, above
        "KUBEDGX_SHUTDOWN_DELAY": "5s",
        "KUBEDGX_PROGRESS_INTERVAL": "30s",
        "KUBEDGX_STATUS_INTERVAL": "10s",
        "KUBEDGX_USAGE_INTERVAL": "5m",
        "KUBEDGX_LEADER_ELECTION": "1",
        "KUBEDGX_LEADER_ELECTION_ID": "kubedgx-leader",
        "KUBEDGX_LEADER_ELECTION_NAMESPACE": NAMESPACE,
        "KUBEDGX_LEADER_ELECTION_LEASE_DURATION": "15s",
        "KUBEDGX_LEADER_ELECTION_RENEW_DEADLINE": "10s",
        "KUBEDGX_LEADER_ELECTION_RETRY_PERIOD": "2s",
        "KUBEDGX_WATCH_NAMESPACES": "",
        "KUBEDGX_HEALTH_PORT": "8081",
        "KUBEDGX_METRICS_PORT": "8080",
        "KUBEDGX_CATALOG": "/etc/kubedgx/catalog/catalog.yaml",
        "KUBEDGX_TRAINER_IMAGE": "ghcr.io/kubedgx/trainer:0.1.0",
        "KUBEDGX_DATASYNC_IMAGE": "ghcr.io/kubedgx/trainer:0.1.0",
        "KUBEDGX_IMAGE_PULL_POLICY": "IfNotPresent",
        "KUBEDGX_SCHEDULER_NAME": "",
        "KUBEDGX_CACHE_ROOT": "/raid/kubedgx",
        "KUBEDGX_CHECKPOINT_SYNC_INTERVAL": "30s",
        "KUBEDGX_PRIORITY_CLASSES": "low=kubedgx-low,normal=kubedgx-normal,high=kubedgx-high",
        "KUBEDGX_KUEUE": "1",
        "KUBEDGX_KUEUE_MANAGE_JOBS_WITHOUT_QUEUE_NAME": "0",
        "KUBEDGX_WEBHOOK_PORT": "9443",
        "KUBEDGX_WEBHOOK_TIMEOUT_SECONDS": "10",
        "KUBEDGX_WEBHOOK_SELF_SIGNED": "1",
        "KUBEDGX_WEBHOOK_SERVICE": "kubedgx-webhook",
        "KUBEDGX_WEBHOOK_NAMESPACE": NAMESPACE,
        "KUBEDGX_WEBHOOK_CONFIGURATION": "kubedgx-webhook",
        "KUBEDGX_WEBHOOK_FAILURE_POLICY": "Fail",
        "KUBEDGX_WEBHOOK_SECRET": "kubedgx-webhook-tls",
    }
    # The catalog ConfigMap is mounted where KUBEDGX_CATALOG points; /tmp is writable.
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounts == {"tmp": "/tmp", "catalog": "/etc/kubedgx/catalog"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["tmp"]["emptyDir"] == {"sizeLimit": "256Mi"}
    assert volumes["catalog"]["configMap"] == {"name": "kubedgx-catalog"}
    assert "catalog.yaml" in one(objects, "ConfigMap", "kubedgx-catalog")["data"]


def test_the_operator_accepts_the_environment_the_chart_gives_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The chart's KUBEDGX_* variables, as the operator parses them (settings.OperatorConfig.from_env)."""
    from dgx_operator.runtime.settings import OperatorConfig

    for scenario, values in SCENARIOS:
        for name in [n for n in os.environ if n.startswith("KUBEDGX_")]:
            monkeypatch.delenv(name)
        for name, value in env(render(values)).items():
            monkeypatch.setenv(name, value)
        config = OperatorConfig.from_env()
        assert config.catalog_path == "/etc/kubedgx/catalog/catalog.yaml", scenario
        assert config.trainer_image == "ghcr.io/kubedgx/trainer:0.1.0", scenario
        assert config.webhook is not None, scenario
        assert config.webhook.port == 9443
        if scenario == "cert-manager":
            assert config.webhook.mode == "certificate"
            assert config.webhook.certfile == "/etc/kubedgx/webhook-tls/tls.crt"
        else:
            assert config.webhook.mode == "self-signed"
            assert (config.webhook.service, config.webhook.namespace) == ("kubedgx-webhook", NAMESPACE)
            assert config.webhook.configuration == "kubedgx-webhook"
        expected = tuple(values.get("watchNamespaces") or ())
        assert tuple(config.namespaces) == expected, scenario


def test_images_by_tag_or_digest() -> None:
    objects = render(
        {
            "image": {"tag": "1.2.3", "digest": DIGEST, "pullPolicy": "Always"},
            "trainer": {"image": {"repository": "registry.example/trainer", "digest": DIGEST}},
            "dataSync": {"image": {"repository": "registry.example/sync", "tag": "9"}},
        }
    )
    c = container(objects)
    assert c["image"] == f"ghcr.io/kubedgx/operator:1.2.3@{DIGEST}"
    assert c["imagePullPolicy"] == "Always"
    variables = env(objects)
    assert variables["KUBEDGX_TRAINER_IMAGE"] == f"registry.example/trainer:0.1.0@{DIGEST}"
    assert variables["KUBEDGX_DATASYNC_IMAGE"] == "registry.example/sync:9"


def test_pod_placement_and_extras_come_from_values() -> None:
    toleration = {"key": "dedicated", "operator": "Equal", "value": "ops", "effect": "NoSchedule"}
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["ops"]}]}]
            }
        }
    }
    values = {
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [toleration],
        "affinity": affinity,
        "podAnnotations": {"example.com/a": "1"},
        "podLabels": {"team": "ml"},
        "priorityClassName": "system-cluster-critical",
        "imagePullSecrets": [{"name": "regcred"}],
        "extraArgs": ["--verbose"],
        "extraEnv": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}],
        "logFormat": "plain",
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
    }
    objects = render(values)
    pod = deployment(objects)["spec"]["template"]
    assert pod["metadata"]["annotations"]["example.com/a"] == "1"
    assert pod["metadata"]["labels"]["team"] == "ml"
    spec = pod["spec"]
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert spec["tolerations"] == [toleration]
    assert spec["affinity"] == affinity
    assert spec["priorityClassName"] == "system-cluster-critical"
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    c = container(objects)
    assert c["args"] == ["operator", "--standalone", "--log-format", "plain", "--verbose"]
    assert env(objects)["HTTPS_PROXY"] == "http://proxy:3128"
    assert c["resources"] == values["resources"]
    kubernetes_validate.validate(deployment(objects), KUBE_VERSION, strict=True)


def test_a_changed_catalog_rolls_the_operator() -> None:
    def checksum(values: dict[str, Any]) -> str:
        annotations = deployment(render(values))["spec"]["template"]["metadata"]["annotations"]
        return str(annotations["checksum/catalog"])

    assert checksum({}) == checksum({"verbose": True})
    assert checksum({}) != checksum({"catalog": {"topologyKey": "example.com/rail"}})


def test_peering_replaces_standalone() -> None:
    objects = render({"peering": {"enabled": True, "name": "team-a"}})
    assert container(objects)["args"][:3] == ["operator", "--peering", "team-a"]
    assert "--standalone" not in container(objects)["args"]


def test_names_follow_the_release() -> None:
    objects = render(name="team-a")
    assert deployment(render())["metadata"]["name"] == "kubedgx-operator"
    names = {r.name for r in objects if r.kind not in ("CustomResourceDefinition", "PriorityClass")}
    assert names == {
        "team-a-kubedgx-operator",
        "team-a-kubedgx-operator-self",
        "team-a-kubedgx-catalog",
        "team-a-kubedgx-webhook",
        "team-a-kubedgx-webhook-tls",
        "team-a-kubedgx-leader",
        "team-a-kubedgx-metrics",
        "team-a-kubedgx-edit",
        "team-a-kubedgx-view",
        "team-a-kubedgx-limits-admin",
        "team-a-kubedgx-budget-admin",
    }
    objects = render({"fullnameOverride": "dgx"})
    assert {r.name for r in objects if r.kind == "Service"} == {"dgx-webhook", "dgx-metrics"}


def test_an_existing_service_account_can_be_used() -> None:
    objects = render({"serviceAccount": {"create": False, "name": "ops"}})
    assert find(objects, "ServiceAccount") == []
    assert deployment(objects)["spec"]["template"]["spec"]["serviceAccountName"] == "ops"
    assert one(objects, "ClusterRoleBinding")["subjects"] == [
        {"kind": "ServiceAccount", "name": "ops", "namespace": NAMESPACE}
    ]
    with pytest.raises(helm.HelmError, match=r"serviceAccount\.name is required"):
        render({"serviceAccount": {"create": False}})
    annotated = render({"serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/x"}}})
    assert one(annotated, "ServiceAccount")["metadata"]["annotations"] == {
        "eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/x"
    }


def test_rbac_can_be_left_to_the_admin() -> None:
    kinds = {r.kind for r in render({"rbac": {"create": False}})}
    assert not kinds & {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}


# -- values: the schema --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"replicas": 2}, "additional properties 'replicas' not allowed"),
        ({"image": {"tagg": "1"}}, "additional properties 'tagg' not allowed"),
        ({"webhook": {"certManager": {"enable": True}}}, "additional properties 'enable' not allowed"),
        ({"metrics": {"serviceMonitor": {"intervall": "1m"}}}, "additional properties 'intervall' not allowed"),
        ({"catalog": {"labels": {"products": "x"}}}, "additional properties 'products' not allowed"),
        (
            {
                "catalogExtraGpus": [
                    {
                        "family": "x1",
                        "memoryGiB": 1,
                        "products": ["X"],
                        "shapes": [1],
                        "perGpu": {"cpu": 1, "memoryGi": 1, "shmGi": 1},
                        "nvlink": True,
                    }
                ]
            },
            "additional properties 'nvlink' not allowed",
        ),
        ({"webhook": {"failurePolicy": "Sometimes"}}, "failurePolicy"),
        ({"logFormat": "xml"}, "logFormat"),
        ({"watchNamespaces": ["Not_A_Namespace"]}, "watchNamespaces"),
        ({"image": {"digest": "latest"}}, "digest"),
    ],
    ids=lambda v: str(v)[:40],
)
def test_render_rejects_unknown_keys_and_bad_values(values: dict[str, Any], complaint: str) -> None:
    with pytest.raises(helm.HelmValuesError, match=complaint.replace("'", ".")):
        render(values)


def test_the_default_values_render_and_pass_the_schema() -> None:
    with helm.Chart.load(str(CHART)) as chart:
        chart.validate_schema(chart.values)
        assert chart.values == chart_values()
    assert render_raw()


# -- the catalog ---------------------------------------------------------------------------------------


def test_the_default_catalog_is_the_operators_built_in_one() -> None:
    built_in = yaml.safe_load((ROOT / "operator/dgx_operator/catalog.yaml").read_text(encoding="utf-8"))
    assert chart_values()["catalog"] == built_in, (
        "values.yaml's catalog differs from operator/dgx_operator/catalog.yaml: copy the file's content there"
    )
    assert chart_values()["catalogExtraGpus"] == []
    rendered = yaml.safe_load(one(render(), "ConfigMap", "kubedgx-catalog")["data"]["catalog.yaml"])
    # Helm drops keys whose value is null (topologyKey: null), which the catalog reads as absent.
    assert rendered == {k: v for k, v in built_in.items() if v is not None}
    assert Catalog.from_mapping(rendered).spec == Catalog.from_mapping(built_in).spec


def rendered_catalog(values: dict[str, Any]) -> Catalog:
    text = one(render(values), "ConfigMap", "kubedgx-catalog")["data"]["catalog.yaml"]
    return Catalog.from_mapping(yaml.safe_load(text), "the chart's catalog")


def test_admins_add_instance_types_and_override_labels_in_values() -> None:
    extra = {
        "family": "h20",
        "memoryGiB": 96,
        "description": "NVIDIA H20",
        "products": ["NVIDIA-H20"],
        "shapes": [8],
        "perGpu": {"cpu": 16, "memoryGi": 128, "shmGi": 8},
    }
    reserved = {"description": "Reserved", "nodeSelector": {"pool": "reserved"}}
    catalog = rendered_catalog(
        {
            "catalogExtraGpus": [extra],
            "catalog": {"labels": {"product": "example.com/gpu"}, "capacities": {"reserved": reserved, "debug": None}},
        }
    )
    built_in = {n for n in Catalog.load().instances if not n.endswith(".debug")}
    assert built_in < catalog.instances.keys()
    assert "dgxh20.96g.8.norm" in catalog.instances
    assert "dgxh100.80g.8.reserved" in catalog.instances
    assert not [n for n in catalog.instances if n.endswith(".debug")]
    instance = catalog.instances["dgxh100.80g.8.norm"]
    assert instance.labels.product == "example.com/gpu"
    assert instance.labels.count == "nvidia.com/gpu.count"  # maps merge: the other labels stay


@pytest.mark.parametrize(("scenario", "values"), SCENARIOS, ids=SCENARIO_IDS)
def test_the_rendered_catalog_loads_in_the_operator(scenario: str, values: dict[str, Any]) -> None:
    assert rendered_catalog(values).instances.keys() == Catalog.load().instances.keys()


# -- watchNamespaces -------------------------------------------------------------------------------------


def test_namespaced_mode_puts_a_role_in_each_namespace() -> None:
    objects = render({"watchNamespaces": ["ml", "research"]})
    assert env(objects)["KUBEDGX_WATCH_NAMESPACES"] == "ml,research"
    roles = {(r["metadata"]["namespace"], r["metadata"]["name"]) for r in find(objects, "Role")}
    # ... and one in the release namespace for the Lease and the webhook's Secret (by name).
    assert roles == {("ml", "kubedgx-operator"), ("research", "kubedgx-operator"), (NAMESPACE, "kubedgx-operator-self")}
    for binding in [b for b in find(objects, "RoleBinding") if b["metadata"]["namespace"] != NAMESPACE]:
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": "kubedgx-operator",
        }
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kubedgx-operator", "namespace": NAMESPACE}]
    assert {b["metadata"]["namespace"] for b in find(objects, "RoleBinding")} == {"ml", "research", NAMESPACE}
    # The cluster-scoped part only: no pods, jobs or secrets anywhere but in the two namespaces.
    cluster_resources = {
        res for rule in one(objects, "ClusterRole", "kubedgx-operator")["rules"] for res in rule["resources"]
    }
    assert cluster_resources == {
        "customresourcedefinitions",
        "namespaces",
        "resourceflavors",
        "workloadpriorityclasses",
        "priorityclasses",
        "validatingwebhookconfigurations",
    }
    assert "watches the namespaces ml, research" in notes({"watchNamespaces": ["ml", "research"]})


# -- the webhook -----------------------------------------------------------------------------------------


def handler_paths() -> set[str]:
    """Where kopf serves the operator's validating handlers: /<handler id>."""
    from tests.integration.admission_helpers import operator_registry

    return {f"/{h.id}" for h in operator_registry()._webhooks.get_all_handlers()}


@pytest.mark.parametrize("namespaces", [[], ["ml", "research"]], ids=["cluster-wide", "namespaced"])
def test_self_signed_mode_renders_the_configuration_the_operator_would_and_an_empty_secret(
    namespaces: list[str],
) -> None:
    """The configuration is the release's: exactly admission.webhook_configuration's body (what the operator
    writes when run without the chart), with no caBundle (the replicas set it from the Secret)."""
    from dgx_operator.webhook.config import WebhookConfig

    objects = render({"watchNamespaces": namespaces, "webhook": {"timeoutSeconds": 7, "failurePolicy": "Ignore"}})
    vwc = one(objects, "ValidatingWebhookConfiguration")
    assert "annotations" not in vwc["metadata"]
    hook = WebhookConfig(self_signed=True, service="kubedgx-webhook", namespace=NAMESPACE,
                         configuration="kubedgx-webhook", failure_policy="Ignore", timeout_seconds=7)  # fmt: skip
    expected = admission.webhook_configuration(hook, b"", namespaces)["webhooks"]
    for webhook in expected:
        del webhook["clientConfig"]["caBundle"]
    assert vwc["webhooks"] == expected
    secret = one(objects, "Secret", "kubedgx-webhook-tls")
    assert (secret["type"], secret.get("data")) == ("Opaque", None)
    assert env(objects)["KUBEDGX_WEBHOOK_SECRET"] == "kubedgx-webhook-tls"
    assert env(objects)["KUBEDGX_WEBHOOK_TIMEOUT_SECONDS"] == "7"
    # RBAC: that configuration and that Secret, by name, and no create of either.
    rules = [r for role in find(objects, "ClusterRole") + find(objects, "Role") for r in role["rules"]]
    vwc_rules = [r for r in rules if "validatingwebhookconfigurations" in r["resources"]]
    assert vwc_rules == [
        {
            "apiGroups": ["admissionregistration.k8s.io"],
            "resources": ["validatingwebhookconfigurations"],
            "resourceNames": ["kubedgx-webhook"],
            "verbs": ["get", "patch"],
        }
    ]
    named = [r for r in rules if "secrets" in r["resources"] and "resourceNames" in r]
    assert named == [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["kubedgx-webhook-tls"],
                      "verbs": ["get", "patch"]}]  # fmt: skip
    assert not [r for r in rules if "create" in r["verbs"] and {"secrets", "leases"} & set(r["resources"])]


def test_the_service_reaches_every_replica() -> None:
    objects = render()
    assert not {r.obj["apiVersion"] for r in objects} & {"cert-manager.io/v1"}
    service = one(objects, "Service", "kubedgx-webhook")
    assert service["spec"]["ports"] == [{"name": "https", "port": 443, "targetPort": "webhook", "protocol": "TCP"}]
    assert service["spec"]["selector"] == deployment(objects)["spec"]["selector"]["matchLabels"]
    assert env(render({"webhook": {"failurePolicy": "Ignore"}}))["KUBEDGX_WEBHOOK_FAILURE_POLICY"] == "Ignore"


@pytest.mark.parametrize("namespaces", [[], ["ml", "research"]], ids=["cluster-wide", "namespaced"])
def test_cert_manager_mode_renders_issuer_certificate_and_configuration(namespaces: list[str]) -> None:
    values = merged(dict(SCENARIOS)["cert-manager"], {"watchNamespaces": namespaces})
    objects = render(values)
    issuer = one(objects, "Issuer")
    assert issuer["spec"] == {"selfSigned": {}}
    certificate = one(objects, "Certificate")
    assert certificate["apiVersion"] == "cert-manager.io/v1"
    assert certificate["spec"]["secretName"] == "kubedgx-webhook-tls"
    assert certificate["spec"]["dnsNames"] == [
        f"kubedgx-webhook.{NAMESPACE}.svc",
        f"kubedgx-webhook.{NAMESPACE}.svc.cluster.local",
    ]
    assert certificate["spec"]["issuerRef"] == {
        "name": issuer["metadata"]["name"],
        "kind": "Issuer",
        "group": "cert-manager.io",
    }
    vwc = one(objects, "ValidatingWebhookConfiguration")
    assert vwc["metadata"]["annotations"] == {
        "cert-manager.io/inject-ca-from": f"{NAMESPACE}/{certificate['metadata']['name']}"
    }
    service = one(objects, "Service", "kubedgx-webhook")
    paths = set()
    for hook in vwc["webhooks"]:
        assert hook["failurePolicy"] == "Ignore"
        assert hook["sideEffects"] == "None"
        # The same requests reach it as in self-signed mode: deletes and metadata-only updates never.
        assert hook["matchConditions"] == [dict(c) for c in admission.MATCH_CONDITIONS]
        assert hook["clientConfig"]["service"]["name"] == service["metadata"]["name"]
        assert hook["clientConfig"]["service"]["port"] == service["spec"]["ports"][0]["port"]
        paths.add(hook["clientConfig"]["service"]["path"])
        [rule] = hook["rules"]
        assert rule["apiGroups"] == ["kubedgx.io"]
        assert rule["apiVersions"] == ["v1alpha1"]
        assert rule["operations"] == ["CREATE", "UPDATE"]
        assert rule["resources"][0] in hook["clientConfig"]["service"]["path"] + "s"
        if namespaces:
            assert hook["namespaceSelector"]["matchExpressions"] == [
                {"key": "kubernetes.io/metadata.name", "operator": "In", "values": namespaces}
            ]
        else:
            assert "namespaceSelector" not in hook
    assert paths == handler_paths() == {"/validate-dgxtrainingjob", "/validate-dgxdatamount"}
    # The operator serves the Certificate's Secret, and no longer manages a configuration itself.
    variables = env(objects)
    assert variables["KUBEDGX_WEBHOOK_CERT"] == "/etc/kubedgx/webhook-tls/tls.crt"
    assert variables["KUBEDGX_WEBHOOK_KEY"] == "/etc/kubedgx/webhook-tls/tls.key"
    assert not {"KUBEDGX_WEBHOOK_SELF_SIGNED", "KUBEDGX_WEBHOOK_CONFIGURATION"} & set(variables)
    pod = deployment(objects)["spec"]["template"]["spec"]
    assert {"name": "webhook-tls", "secret": {"secretName": "kubedgx-webhook-tls"}} in pod["volumes"]
    rules = [r for role in find(objects, "ClusterRole") + find(objects, "Role") for r in role["rules"]]
    assert not [r for r in rules if "validatingwebhookconfigurations" in r["resources"]]
    assert find(objects, "Secret") == []  # cert-manager's Certificate makes its own


def test_cert_manager_mode_with_an_issuer_of_your_own() -> None:
    issuer = {"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}
    objects = render({"webhook": {"certManager": {"enabled": True, "issuerRef": issuer}}})
    assert find(objects, "Issuer") == []
    assert one(objects, "Certificate")["spec"]["issuerRef"] == issuer


def test_the_webhook_can_be_switched_off() -> None:
    for values in ({"webhook": {"enabled": False}}, {"webhook": {"enabled": False, "certManager": {"enabled": True}}}):
        objects = render(values)
        assert not [r for r in objects if "webhook" in r.name]
        assert not [name for name in env(objects) if name.startswith("KUBEDGX_WEBHOOK")]
        assert "webhook" not in {p["name"] for p in container(objects)["ports"]}
        rules = [r for role in find(objects, "ClusterRole") for r in role["rules"]]
        assert not [r for r in rules if r["apiGroups"] == ["admissionregistration.k8s.io"]]


# -- metrics -----------------------------------------------------------------------------------------------


def test_metrics_service_and_service_monitor() -> None:
    objects = render(dict(SCENARIOS)["metrics"])
    service = one(objects, "Service", "kubedgx-metrics")
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 8080, "targetPort": "metrics", "protocol": "TCP"}]
    monitor = one(objects, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    labels = service["metadata"]["labels"]
    assert all(labels[k] == v for k, v in monitor["spec"]["selector"]["matchLabels"].items())
    assert not [
        s
        for s in find(objects, "Service")
        if s is not service
        and all(s["metadata"]["labels"].get(k) == v for k, v in monitor["spec"]["selector"]["matchLabels"].items())
    ]
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "15s", "scrapeTimeout": "10s"}
    ]
    assert find(render(), "ServiceMonitor") == []


def test_metrics_off_means_port_0_and_no_service() -> None:
    objects = render({"metrics": {"enabled": False, "serviceMonitor": {"enabled": True}}})
    assert env(objects)["KUBEDGX_METRICS_PORT"] == "0"
    assert find(objects, "Service", "kubedgx-metrics") == []
    assert find(objects, "ServiceMonitor") == []
    assert env(render({"metrics": {"port": 9090}}))["KUBEDGX_METRICS_PORT"] == "9090"


# -- CRDs, PriorityClasses, Argo CD ------------------------------------------------------------------------


def source_crds() -> dict[str, dict[str, Any]]:
    return {
        crd["metadata"]["name"]: crd
        for crd in (yaml.safe_load(p.read_text(encoding="utf-8")) for p in sorted((ROOT / "crds").glob("*.yaml")))
    }


def test_the_crds_are_the_generated_ones_kept_on_uninstall() -> None:
    rendered = {c["metadata"]["name"]: c for c in find(render(), "CustomResourceDefinition")}
    sources = source_crds()
    assert (
        rendered.keys()
        == sources.keys()
        == {"dgxtrainingjobs.kubedgx.io", "dgxdatamounts.kubedgx.io", "dgxlimits.kubedgx.io", "dgxbudgets.kubedgx.io"}
    )
    for name, crd in rendered.items():
        assert crd["spec"] == sources[name]["spec"], (
            f"templates/crds differ from crds/: run python charts/kubedgx/hack/generate.py ({name})"
        )
        assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    unkept = find(render({"crds": {"keep": False}}), "CustomResourceDefinition")
    assert len(unkept) == 4
    assert all("annotations" not in c["metadata"] for c in unkept)
    assert find(render(dict(SCENARIOS)["no-crds"]), "CustomResourceDefinition") == []


def test_the_crd_templates_are_up_to_date() -> None:
    from tests.chart.conftest import generator

    stale = [str(p.relative_to(ROOT)) for p in generator().stale() if "crds" in p.parts]
    assert stale == [], f"{stale} differ from crds/: run python charts/kubedgx/hack/generate.py and commit them"


def test_priority_classes() -> None:
    classes = {c["metadata"]["name"]: c for c in find(render(), "PriorityClass")}
    assert {n: (c["value"], c["globalDefault"]) for n, c in classes.items()} == {
        "kubedgx-low": (1000, False),
        "kubedgx-normal": (10000, False),
        "kubedgx-high": (100000, False),
    }
    existing = render(dict(SCENARIOS)["no-crds"])
    assert find(existing, "PriorityClass") == []
    assert env(existing)["KUBEDGX_PRIORITY_CLASSES"] == "low=kubedgx-low,normal=kubedgx-normal,high=kubedgx-high"
    off = render({"priorityClasses": {"enabled": False}})
    assert find(off, "PriorityClass") == []
    assert env(off)["KUBEDGX_PRIORITY_CLASSES"] == ""
    renamed = render({"priorityClasses": {"high": {"name": "urgent", "value": 500000}}})
    assert one(renamed, "PriorityClass", "urgent")["value"] == 500000
    assert env(renamed)["KUBEDGX_PRIORITY_CLASSES"].endswith(",high=urgent")


def test_argo_cd_health_checks_are_rendered_on_request() -> None:
    assert find(render(), "ConfigMap", "kubedgx-argocd-health") == []
    customizations = CHART / "files/argocd/resource_customizations/kubedgx.io"
    scripts = {kind: customizations / kind / "health.lua" for kind in ("DGXTrainingJob", "DGXDataMount")}
    values = {"argocd": {"healthChecks": {"enabled": True}}}
    missing = [str(p.relative_to(ROOT)) for p in scripts.values() if not p.is_file()]
    if missing:
        with pytest.raises(
            helm.HelmRenderError, match=r"argocd\.healthChecks\.enabled: the chart has no files/argocd/"
        ):
            render(values)
        pytest.skip(f"{missing} not written yet: only the missing-file error was checked")
    config = one(render(values), "ConfigMap", "kubedgx-argocd-health")
    actions = config["data"].pop("resource.customizations.actions.kubedgx.io_DGXTrainingJob")
    assert config["data"] == {
        f"resource.customizations.health.kubedgx.io_{kind}": path.read_text(encoding="utf-8").rstrip("\n") + "\n"
        for kind, path in scripts.items()
    }
    # The DGXTrainingJob's resource actions, as Argo CD's ResourceActions (tests/argocd runs them in Argo CD's VM).
    job = customizations / "DGXTrainingJob" / "actions"
    assert yaml.safe_load(actions) == {
        "discovery.lua": (job / "discovery.lua").read_text(encoding="utf-8"),
        "definitions": [
            {"name": name, "action.lua": (job / name / "action.lua").read_text(encoding="utf-8")}
            for name in ("resume", "suspend")
        ],
    }


# -- NOTES ---------------------------------------------------------------------------------------------------


def test_notes_tell_how_to_submit_a_first_job() -> None:
    text = notes()
    assert "kubectl -n default apply -f examples/quickstart.yaml" in text
    assert "kubectl -n default get dgxtrainingjobs -w" in text
    # The configuration and its certificate's Secret are the release's; who leads is one command away.
    assert "Secret kubedgx-webhook-tls" in text
    assert "ValidatingWebhookConfiguration kubedgx-webhook (both part of this release)" in text
    assert "kubectl -n kubedgx get lease kubedgx-leader -o jsonpath='{.spec.holderIdentity}'" in text
    assert (ROOT / "examples/quickstart.yaml").is_file()
    namespaced = notes({"watchNamespaces": ["ml", "research"]})
    assert "kubectl -n ml apply -f examples/quickstart.yaml" in namespaced
    assert "cainjector sets the caBundle" in notes(dict(SCENARIOS)["cert-manager"])


def test_the_chart_describes_itself() -> None:
    with helm.Chart.load(str(CHART)) as chart:
        metadata = chart.metadata
        packaged = {f["name"] for f in chart.files}
    assert metadata["apiVersion"] == "v2"
    assert metadata["appVersion"] == "0.1.0"
    import dgx_operator

    assert metadata["appVersion"] == dgx_operator.__version__
    # .helmignore keeps the generator out of the package; the Argo CD scripts and ci/ are in.
    assert not [name for name in packaged if name.startswith("hack/")]
    assert Path(CHART / ".helmignore").is_file()


# -- guard rails (limits) ------------------------------------------------------------------------


LIMITS_VALUE = {"maxDuration": {"default": "24h", "max": "168h"}, "priorities": ["low", "normal"], "maxNodes": 8}


def test_the_charts_limits_reach_the_operator_as_a_file_it_reads_with_the_dgxlimits_schema(tmp_path: Path) -> None:
    objects = render({"limits": LIMITS_VALUE})
    data = one(objects, "ConfigMap", "kubedgx-limits")["data"]["limits.yaml"]
    assert env(objects)["KUBEDGX_LIMITS"] == "/etc/kubedgx/limits/limits.yaml"
    mounts = {m["name"]: m["mountPath"] for m in container(objects)["volumeMounts"]}
    assert mounts["limits"] == "/etc/kubedgx/limits"
    # The operator's own reader takes what the chart renders.
    path = tmp_path / "limits.yaml"
    path.write_text(data, encoding="utf-8")
    read = OperatorConfig.from_env({"KUBEDGX_LIMITS": str(path)}).limits
    assert read is not None
    assert read.to_manifest() == LIMITS_VALUE


def test_no_limits_render_nothing_and_a_change_rolls_the_operator() -> None:
    plain = render()
    assert find(plain, "ConfigMap", "kubedgx-limits") == []
    assert "KUBEDGX_LIMITS" not in env(plain)

    def checksum(values: dict[str, Any]) -> str | None:
        annotations = deployment(render(values))["spec"]["template"]["metadata"]["annotations"]
        return annotations.get("checksum/limits")

    assert checksum({}) is None
    assert checksum({"limits": LIMITS_VALUE}) != checksum({"limits": {**LIMITS_VALUE, "maxNodes": 4}})


def test_a_limits_value_the_schema_refuses_fails_the_install() -> None:
    with pytest.raises(Exception, match="limits"):
        render({"limits": {"maxDuration": {"max": "3 days"}}})
    with pytest.raises(Exception, match="limits"):
        render({"limits": {"priority": ["low"]}})


def test_users_read_dgxlimits_and_only_the_limits_admin_role_writes_them() -> None:
    roles = {r.name: r.obj for r in render() if r.kind == "ClusterRole"}
    writes = {"create", "update", "patch", "delete", "deletecollection"}
    for name, role in roles.items():
        for rule in role["rules"]:
            if "dgxlimits" in rule["resources"] and writes & set(rule["verbs"]):
                assert name == "kubedgx-limits-admin", name
    admin = roles["kubedgx-limits-admin"]
    assert "aggregationRule" not in admin
    assert not any(k.startswith("rbac.authorization.k8s.io/aggregate") for k in admin["metadata"]["labels"])
    view = roles["kubedgx-view"]["rules"]
    assert any("dgxlimits" in r["resources"] and r["verbs"] == ["get", "list", "watch"] for r in view)
