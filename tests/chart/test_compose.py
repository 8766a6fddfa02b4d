"""The chart composes (issue 17, item 4): it renders as the dependency of an umbrella chart (``global``);
the operator pod's security contexts, extra volumes and mounts, ``envFrom`` and topology spread are
values whose defaults render what the chart rendered before; a CA bundle for object stores behind a
private CA reaches the operator; and the opt-in objects (NetworkPolicy, PodMonitor, the ``helm
test`` hook, PriorityClass ``preemptionPolicy``) render valid objects when asked and nothing when
not. Built-in kinds are checked against the Kubernetes 1.34 schemas; the PodMonitor, a CRD kind, by
hand. tests/cluster/test_chart_hooks.py installs them on the real apiserver and runs the hook."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from dgx_datasync import trust
from dgx_operator.cli.main import build_parser, cmd_check_install
from dgx_operator.runtime.settings import OperatorConfig
from tests.chart.conftest import CHART, KUBE_VERSION, NAMESPACE, find, is_hook, notes, one, render
from tests.chart.render_helpers import container, deployment, env, restricted_violations
from tests.private_ca import PrivateCA

CA = PrivateCA()


def valid(obj: dict[str, Any]) -> dict[str, Any]:
    kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
    return obj


def pod_spec(objects: list[Any]) -> dict[str, Any]:
    spec: dict[str, Any] = deployment(objects)["spec"]["template"]["spec"]
    return spec


def operator_labels(objects: list[Any]) -> dict[str, str]:
    labels: dict[str, str] = deployment(objects)["spec"]["selector"]["matchLabels"]
    return labels


# -- global: an umbrella chart -------------------------------------------------------------------------


def umbrella(tmp_path: Path, chart: Path = CHART) -> Path:
    """A platform chart that depends on kubedgx through a file:// repository, resolved as `helm dependency
    update` does (the chart packaged into charts/, .helmignore applied), with globals and subchart values."""
    parent = tmp_path / "platform"
    parent.mkdir()
    (parent / "Chart.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v2",
                "name": "platform",
                "version": "1.0.0",
                "dependencies": [{"name": "kubedgx", "version": "0.1.0", "repository": f"file://{chart}"}],
            }
        ),
        encoding="utf-8",
    )
    (parent / "values.yaml").write_text(
        yaml.safe_dump(
            {
                "global": {"imageRegistry": "registry.example", "imagePullSecrets": ["regcred"], "team": {"a": 1}},
                "kubedgx": {"replicaCount": 3, "watchNamespaces": ["ml"]},
            }
        ),
        encoding="utf-8",
    )
    helm.dependency_update(str(parent), skip_refresh=True)
    assert helm.dependency_list(str(parent)) == [
        {"name": "kubedgx", "version": "0.1.0", "repository": f"file://{chart}", "status": "ok"}
    ]
    return parent


def render_umbrella(parent: Path, values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    with helm.Chart.load(str(parent)) as loaded:
        out = loaded.render(values or {}, name="platform", namespace=NAMESPACE, is_install=True)
    return [
        d for path, text in sorted(out.items()) if not path.endswith("NOTES.txt") for d in yaml.safe_load_all(text) if d
    ]


def test_an_umbrella_chart_with_globals_renders_kubedgx_with_its_values(tmp_path: Path) -> None:
    objects = render_umbrella(umbrella(tmp_path), {"global": {"clusterName": "gpu-east"}})
    [dep] = [o for o in objects if o["kind"] == "Deployment"]
    assert dep["metadata"]["name"] == "platform-kubedgx-operator"
    assert dep["spec"]["replicas"] == 3  # the parent's kubedgx: values arrive
    roles = {(o["metadata"]["namespace"], o["metadata"]["name"]) for o in objects if o["kind"] == "Role"}
    assert ("ml", "platform-kubedgx-operator") in roles
    with helm.Chart.load(str(CHART)) as chart:
        # What Helm hands the subchart: its values with the parent's globals (the reason the schema must take them).
        chart.validate_schema(chart.merge_values({"global": {"imageRegistry": "x", "anything": [1, {"b": None}]}}))


def test_without_global_in_its_schema_the_chart_would_fail_every_umbrella(tmp_path: Path) -> None:
    """The check above can fail: a copy of the chart whose schema does not take ``global`` is refused as a
    dependency (Helm gives every subchart the parent's globals), though it renders on its own."""
    copied = tmp_path / "kubedgx"
    shutil.copytree(CHART, copied)
    schema = json.loads((copied / "values.schema.json").read_text(encoding="utf-8"))
    del schema["properties"]["global"]
    (copied / "values.schema.json").write_text(json.dumps(schema), encoding="utf-8")
    values = (copied / "values.yaml").read_text(encoding="utf-8")
    start = values.index("# -- Values an umbrella chart shares")
    (copied / "values.yaml").write_text(values[:start] + values[values.index("# -- Replaces the chart name") :])
    with helm.Chart.load(str(copied)) as alone:
        assert alone.render({}, name="x", namespace=NAMESPACE, is_install=True)
    (tmp_path / "parent").mkdir()
    with pytest.raises(helm.HelmValuesError, match=r"global"):
        render_umbrella(umbrella(tmp_path / "parent", copied))


# -- pod values: defaults unchanged, overrides applied -----------------------------------------------------


def test_security_contexts_merge_with_the_restricted_defaults() -> None:
    objects = render({"podSecurityContext": {"runAsUser": 20000, "fsGroupChangePolicy": "OnRootMismatch"},
                      "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}}})  # fmt: skip
    spec = pod_spec(objects)
    assert spec["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 20000,
        "runAsGroup": 10001,
        "fsGroup": 10001,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert container(objects)["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container(objects)["securityContext"]["readOnlyRootFilesystem"] is True
    assert restricted_violations(spec) == []
    valid(deployment(objects))
    # An admin who removes a default (null) leaves the restricted standard, and the check says so.
    loose = pod_spec(render({"securityContext": {"allowPrivilegeEscalation": None}}))
    assert restricted_violations(loose) == ["operator: allowPrivilegeEscalation is not false"]


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"podSecurityContext": {"runAsUsr": 1}}, "additional properties 'runAsUsr' not allowed"),
        ({"securityContext": {"capabilities": {"drop": "ALL"}}}, "drop"),
        ({"envFrom": [{"prefix": "X_"}]}, "envFrom"),
        ({"extraVolumes": [{"emptyDir": {}}]}, "name"),
        ({"extraVolumeMounts": [{"name": "x", "mountPath": "relative"}]}, "mountPath"),
        ({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone"}]}, "whenUnsatisfiable"),
        ({"caBundle": {"pem": "not a certificate"}}, "pem"),
        ({"networkPolicy": {"metricsFrom": [{"podSelectr": {}}]}}, "podSelectr"),
        ({"priorityClasses": {"low": {"preemptionPolicy": "Sometimes"}}}, "preemptionPolicy"),
        ({"tests": {"enable": False}}, "additional properties 'enable' not allowed"),
    ],
    ids=lambda v: str(v)[:40],
)
def test_the_new_values_are_checked_by_the_schema(values: dict[str, Any], complaint: str) -> None:
    with pytest.raises(helm.HelmValuesError, match=complaint.replace("'", ".")):
        render(values)


def test_env_from_extra_volumes_and_mounts_reach_the_operator() -> None:
    values: dict[str, Any] = {
        "envFrom": [
            {"configMapRef": {"name": "proxy"}},
            {"secretRef": {"name": "tokens", "optional": True}, "prefix": "T_"},
        ],
        "extraVolumes": [{"name": "aws-token", "projected": {"sources": [{"serviceAccountToken": {
            "audience": "sts.amazonaws.com", "path": "token", "expirationSeconds": 3600}}]}}],
        "extraVolumeMounts": [{"name": "aws-token", "mountPath": "/var/run/secrets/aws", "readOnly": True}],
        "extraEnv": [{"name": "AWS_WEB_IDENTITY_TOKEN_FILE", "value": "/var/run/secrets/aws/token"}],
    }  # fmt: skip
    objects = render(values)
    c, spec = container(objects), pod_spec(objects)
    assert c["envFrom"] == values["envFrom"]
    assert c["volumeMounts"][-1] == values["extraVolumeMounts"][0]
    assert [v["name"] for v in c["volumeMounts"]] == ["tmp", "catalog", "aws-token"]
    assert spec["volumes"][-1] == values["extraVolumes"][0]
    assert env(objects)["AWS_WEB_IDENTITY_TOKEN_FILE"] == "/var/run/secrets/aws/token"
    assert restricted_violations(spec) == []
    valid(deployment(objects))


#: The README's example: replicas on different nodes (a hard rule), and spread over zones where there are any.
HA_SPREAD = [
    {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule",
     "matchLabelKeys": ["pod-template-hash"]},
    {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway",
     "matchLabelKeys": ["pod-template-hash"]},
]  # fmt: skip


def test_topology_spread_counts_the_operator_pods_unless_told_otherwise() -> None:
    objects = render({"topologySpreadConstraints": HA_SPREAD})
    spread = pod_spec(objects)["topologySpreadConstraints"]
    assert spread == [{**c, "labelSelector": {"matchLabels": operator_labels(objects)}} for c in HA_SPREAD]
    # Every pod the selector counts is this release's operator: not its test pod, not another release's.
    assert operator_labels(objects).items() <= deployment(objects)["spec"]["template"]["metadata"]["labels"].items()
    own = {"matchLabels": {"team": "ops"}}
    kept = pod_spec(render({"topologySpreadConstraints": [{**HA_SPREAD[0], "labelSelector": own}]}))
    assert kept["topologySpreadConstraints"][0]["labelSelector"] == own
    assert chart_default("topologySpreadConstraints") == []
    valid(deployment(objects))


def chart_default(key: str) -> Any:
    with helm.Chart.load(str(CHART)) as chart:
        return copy.deepcopy(chart.values[key])


# -- the CA bundle of object stores ------------------------------------------------------------------------


def test_an_inline_ca_bundle_is_a_configmap_mounted_where_the_operator_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    objects = render({"caBundle": {"pem": CA.pem}})
    config_map = valid(one(objects, "ConfigMap", "kubedgx-ca-bundle"))
    spec, c = pod_spec(objects), container(objects)
    assert {"name": "ca-bundle", "configMap": {"name": "kubedgx-ca-bundle",
            "items": [{"key": "ca.crt", "path": "ca.crt"}]}} in spec["volumes"]  # fmt: skip
    assert {"name": "ca-bundle", "mountPath": "/etc/kubedgx/ca-bundle", "readOnly": True} in c["volumeMounts"]
    assert env(objects)["KUBEDGX_CA_BUNDLE"] == "/etc/kubedgx/ca-bundle/ca.crt"
    # The operator, as it starts in that pod: the mounted key is read, and the PEM is what it passes on.
    (tmp_path / "ca.crt").write_text(config_map["data"]["ca.crt"], encoding="utf-8")
    for name, value in env(objects).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("KUBEDGX_CA_BUNDLE", str(tmp_path / "ca.crt"))
    assert OperatorConfig.from_env().defaults().ca_bundle_pem == trust.certificates(CA.pem) == CA.pem
    # A new bundle rolls the operator (it reads it at startup); none leaves the pod as it was.
    annotations = deployment(objects)["spec"]["template"]["metadata"]["annotations"]
    other = deployment(render({"caBundle": {"pem": PrivateCA().pem}}))["spec"]["template"]["metadata"]["annotations"]
    assert annotations["checksum/ca-bundle"] != other["checksum/ca-bundle"]
    assert "checksum/ca-bundle" not in deployment(render())["spec"]["template"]["metadata"]["annotations"]
    assert restricted_violations(spec) == []
    valid(deployment(objects))


def test_an_existing_configmap_such_as_trust_managers_is_mounted_by_name_and_key() -> None:
    objects = render({"caBundle": {"configMap": {"name": "corp-cas", "key": "trust-bundle.pem"}}})
    assert find(objects, "ConfigMap", "kubedgx-ca-bundle") == []
    volume = next(v for v in pod_spec(objects)["volumes"] if v["name"] == "ca-bundle")
    assert volume == {"name": "ca-bundle", "configMap": {"name": "corp-cas", "items": [{"key": "trust-bundle.pem",
                      "path": "ca.crt"}]}}  # fmt: skip
    assert env(objects)["KUBEDGX_CA_BUNDLE"] == "/etc/kubedgx/ca-bundle/ca.crt"
    assert "checksum/ca-bundle" not in deployment(objects)["spec"]["template"]["metadata"]["annotations"]
    with pytest.raises(helm.HelmRenderError, match=r"caBundle: give the PEM .* not both"):
        render({"caBundle": {"pem": CA.pem, "configMap": {"name": "corp-cas"}}})


def test_without_a_bundle_nothing_of_it_is_rendered() -> None:
    objects = render()
    assert "KUBEDGX_CA_BUNDLE" not in env(objects)
    assert "ca-bundle" not in {v["name"] for v in pod_spec(objects)["volumes"]}
    assert find(objects, "ConfigMap", "kubedgx-ca-bundle") == []


# -- NetworkPolicy -----------------------------------------------------------------------------------------


def ports_by_name(objects: list[Any]) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container(objects)["ports"]}


def test_the_network_policy_admits_the_apiserver_the_kubelet_and_prometheus() -> None:
    assert find(render(), "NetworkPolicy") == []
    prometheus = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
                  "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}  # fmt: skip
    objects = render({"networkPolicy": {"enabled": True, "metricsFrom": [prometheus]}})
    policy = valid(one(objects, "NetworkPolicy", "kubedgx-operator"))["spec"]
    assert policy["podSelector"] == {"matchLabels": operator_labels(objects)}
    assert policy["policyTypes"] == ["Ingress"]  # egress: every destination, unless restricted
    ingress = {rule["ports"][0]["port"]: rule.get("from") for rule in policy["ingress"]}
    assert ingress == {"webhook": None, "health": None, "metrics": [prometheus]}  # None: from anywhere
    assert set(ingress) <= set(ports_by_name(objects))  # named ports of the operator's container
    # No webhook, no metrics: no rules for them.
    quiet = render({"networkPolicy": {"enabled": True}, "webhook": {"enabled": False}, "metrics": {"enabled": False}})
    assert [r["ports"][0]["port"] for r in one(quiet, "NetworkPolicy")["spec"]["ingress"]] == ["health"]


def test_egress_can_be_restricted_to_dns_the_apiserver_and_the_object_stores() -> None:
    minio = {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "minio"}}}],
             "ports": [{"port": 9000, "protocol": "TCP"}]}  # fmt: skip
    apiserver_cidr = [{"ipBlock": {"cidr": "10.0.0.0/28"}}]
    egress = {"enabled": True, "objectStores": [minio], "apiServer": apiserver_cidr}
    values = {"networkPolicy": {"enabled": True, "egress": egress}}
    policy = valid(one(render(values), "NetworkPolicy"))["spec"]
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    dns, apiserver, store = policy["egress"]
    assert dns["ports"] == [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]
    assert dns["to"][0]["podSelector"] == {"matchLabels": {"k8s-app": "kube-dns"}}
    assert apiserver == {"ports": [{"port": 443, "protocol": "TCP"}, {"port": 6443, "protocol": "TCP"}],
                         "to": [{"ipBlock": {"cidr": "10.0.0.0/28"}}]}  # fmt: skip
    assert store == minio
    anywhere = one(render({"networkPolicy": {"enabled": True, "egress": {"enabled": True}}}), "NetworkPolicy")
    assert "to" not in anywhere["spec"]["egress"][1]  # the apiserver's ports, to any address
    assert len(anywhere["spec"]["egress"]) == 2


# -- PodMonitor ----------------------------------------------------------------------------------------------


def test_the_pod_monitor_scrapes_each_operator_pod_and_excludes_the_service_monitor() -> None:
    assert find(render(), "PodMonitor") == []
    objects = render({"metrics": {"podMonitor": {"enabled": True, "interval": "15s", "scrapeTimeout": "10s",
                                                 "labels": {"release": "prometheus"}}}})  # fmt: skip
    monitor = one(objects, "PodMonitor", "kubedgx-operator")
    # monitoring.coreos.com/v1 PodMonitor: the fields prometheus-operator reads (its CRD is not ours to validate with).
    assert (monitor["apiVersion"], monitor["kind"]) == ("monitoring.coreos.com/v1", "PodMonitor")
    assert set(monitor["spec"]) == {"namespaceSelector", "selector", "podMetricsEndpoints"}
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert monitor["spec"]["selector"] == {"matchLabels": operator_labels(objects)}
    assert monitor["spec"]["podMetricsEndpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "15s",
                                                       "scrapeTimeout": "10s"}]  # fmt: skip
    assert "metrics" in ports_by_name(objects)
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert find(objects, "ServiceMonitor") == []
    with pytest.raises(helm.HelmRenderError, match="choose one"):
        render({"metrics": {"podMonitor": {"enabled": True}, "serviceMonitor": {"enabled": True}}})
    assert find(render({"metrics": {"enabled": False, "podMonitor": {"enabled": True}}}), "PodMonitor") == []


# -- the helm test hook --------------------------------------------------------------------------------------


def hook_objects(values: dict[str, Any] | None = None) -> list[Any]:
    return [r for r in render(values, hooks=True) if is_hook(r.obj)]


def test_the_test_hook_checks_the_install_as_a_service_account_that_may_only_create_jobs() -> None:
    hooks = hook_objects()
    assert sorted((r.kind, r.name) for r in hooks) == [
        (kind, "kubedgx-test") for kind in ("Pod", "Role", "RoleBinding", "ServiceAccount")
    ]
    by_kind = {r.kind: valid(r.obj) for r in hooks}
    for kind, obj in by_kind.items():
        annotations = obj["metadata"]["annotations"]
        assert annotations["helm.sh/hook"] == "test", kind
        assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded", kind
        # The account and its rights exist before the pod that uses them (lower weight first).
        assert annotations.get("helm.sh/hook-weight", "0") == ("0" if kind == "Pod" else "-1"), kind
    assert by_kind["Role"]["rules"] == [
        {"apiGroups": ["kubedgx.io"], "resources": ["dgxtrainingjobs"], "verbs": ["create"]}
    ]
    assert by_kind["RoleBinding"]["subjects"] == [
        {"kind": "ServiceAccount", "name": "kubedgx-test", "namespace": NAMESPACE}
    ]
    assert by_kind["Role"]["metadata"]["namespace"] == by_kind["RoleBinding"]["metadata"]["namespace"] == NAMESPACE
    pod = by_kind["Pod"]
    spec = pod["spec"]
    assert spec["serviceAccountName"] == "kubedgx-test"
    assert spec["restartPolicy"] == "Never"
    assert restricted_violations(spec) == []
    [c] = spec["containers"]
    assert c["image"] == container(render())["image"]  # the operator image
    args = build_parser().parse_args(c["args"])
    assert args.func is cmd_check_install
    assert (args.namespace, args.catalog, args.webhook, args.timeout) == (
        NAMESPACE,
        "/etc/kubedgx/catalog/catalog.yaml",
        True,
        60.0,
    )
    catalog_mount = next(m for m in c["volumeMounts"] if m["name"] == "catalog")
    assert args.catalog.startswith(catalog_mount["mountPath"] + "/")
    assert {"name": "catalog", "configMap": {"name": "kubedgx-catalog"}} in spec["volumes"]
    # Not one of the operator's pods: neither the ReplicaSet (which would adopt it) nor the webhook Service selects it.
    labels = pod["metadata"]["labels"]
    objects = render()
    for selector in (operator_labels(objects), one(objects, "Service", "kubedgx-webhook")["spec"]["selector"]):
        assert not selector.items() <= labels.items()


def test_the_test_hook_follows_the_installation() -> None:
    namespaced = {r.kind: r.obj for r in hook_objects({"watchNamespaces": ["ml", "research"]})}
    assert namespaced["Role"]["metadata"]["namespace"] == namespaced["RoleBinding"]["metadata"]["namespace"] == "ml"
    assert "--namespace" in namespaced["Pod"]["spec"]["containers"][0]["args"]
    args = build_parser().parse_args(namespaced["Pod"]["spec"]["containers"][0]["args"])
    assert args.namespace == "ml"  # the webhook selects only the watched namespaces
    chosen = {r.kind: r.obj for r in hook_objects({"tests": {"namespace": "jobs", "timeoutSeconds": 120}})}
    args = build_parser().parse_args(chosen["Pod"]["spec"]["containers"][0]["args"])
    assert (args.namespace, args.timeout, chosen["Role"]["metadata"]["namespace"]) == ("jobs", 120.0, "jobs")
    no_webhook = {r.kind: r.obj for r in hook_objects({"webhook": {"enabled": False}})}
    assert build_parser().parse_args(no_webhook["Pod"]["spec"]["containers"][0]["args"]).webhook is False
    assert sorted(r.kind for r in hook_objects({"rbac": {"create": False}})) == ["Pod", "ServiceAccount"]
    assert hook_objects({"tests": {"enabled": False}}) == []
    assert "helm test kubedgx -n kubedgx" in notes()
    assert "helm test" not in notes({"tests": {"enabled": False}})
    # Never part of what helm install applies.
    assert not [r for r in render() if r.name.endswith("-test")]


# -- PriorityClass preemptionPolicy ----------------------------------------------------------------------


def test_preemption_policy_is_rendered_only_where_set() -> None:
    classes = {c["metadata"]["name"]: c for c in find(render(), "PriorityClass")}
    assert not [c for c in classes.values() if "preemptionPolicy" in c]
    values = {
        "priorityClasses": {"low": {"preemptionPolicy": "Never"}, "high": {"preemptionPolicy": "PreemptLowerPriority"}}
    }
    set_ = {c["metadata"]["name"]: valid(c) for c in find(render(values), "PriorityClass")}
    assert {n: c.get("preemptionPolicy") for n, c in set_.items()} == {
        "kubedgx-low": "Never",
        "kubedgx-normal": None,
        "kubedgx-high": "PreemptLowerPriority",
    }
