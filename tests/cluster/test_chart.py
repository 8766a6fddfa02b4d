"""charts/kubedgx installed, upgraded and uninstalled by Helm's own Go code against the real control plane.

helm-python-sdk's ``Config`` (helm-c-sdk's C ABI over the Helm v4 SDK: ``action.Install``,
``action.Upgrade``, ``action.Rollback``, ``action.Uninstall``; the release stored as a Secret in its
namespace) talks to the session's kube-apiserver v1.34.12 with the admin kubeconfig, context
``kubedgx-local``; kubectl (the one built with the control plane) and SubjectAccessReviews read back
what the apiserver holds. No mocks: what Helm applies, the apiserver validates, admits (RBAC's
escalation check included) and stores.

Each test has its own release and namespace (fixture ``release``). Cluster-scoped objects whose
names do not depend on the release (the two CRDs; the PriorityClasses where a test keeps their
default names) may exist already, applied by another module (tests/cluster/operator.py applies the
chart with kubectl): the release then takes them over as ``helm install --take-ownership
--force-conflicts`` would (Release._adopt), and after the test they are put back as they were.
Every other cluster-scoped object the release rendered is deleted once it is uninstalled: nothing
stays behind. The operator's pod never runs (every fake node is tainted nvidia.com/gpu and kwok runs
no containers), so nothing waits for readiness. README-chart.md says what runs, the Helm calls, and
the timings (printed at the end of the module).
"""

from __future__ import annotations

import contextlib
import copy
import json
import re
import secrets
import shutil
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import helm_python as helm
import pytest
import yaml

from tests.chart.conftest import CHART, CI, chart_values
from tests.cluster.chart_helpers import documents, render, stub_crd
from tests.cluster.controlplane import CONTEXT, ControlPlane
from tests.e2e.kubectl import JOBS, MOUNTS, Kubectl, KubectlError, condition, dig, wait_for
from tests.support.wait import WaitTimeoutError

T = TypeVar("T")

CRDS = (JOBS, MOUNTS)
CRD_RESOURCE = "customresourcedefinition.apiextensions.k8s.io"
KEEP_POLICY = "helm.sh/resource-policy"
RELEASE_NAME = "meta.helm.sh/release-name"
RELEASE_NAMESPACE = "meta.helm.sh/release-namespace"
MANAGED_BY = "app.kubernetes.io/managed-by"
INSTANCE = "app.kubernetes.io/instance"
#: The chart's cluster-scoped kinds (every other object it renders lives in a namespace).
CLUSTER_KINDS = frozenset(
    {"CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding", "PriorityClass", "ValidatingWebhookConfiguration"}
)
#: Metadata the apiserver owns: dropped from a snapshot before it is written back.
SERVER_FIELDS = ("resourceVersion", "uid", "creationTimestamp", "generation", "managedFields", "deletionTimestamp",
                 "deletionGracePeriodSeconds", "selfLink")  # fmt: skip
TIMEOUT = 60
POLL = 0.25
#: How long a deleted CRD may take to go. The apiserver's CRD finalizer lists the CRD's objects
#: first; a CRD deleted soon after it was created or changed meets its watch cache still
#: initializing ("storage is (re)initializing"), and the finalizer's retries back off exponentially:
#: minutes on a loaded machine (operator-framework/operator-controller#1437 waits 5 minutes). Seen in
#: CI as a 60 s timeout in one test's teardown and the next test's install.
CRD_GONE_TIMEOUT = 300
#: (release, action, seconds) of every Helm call of this module; summarised at its end.
TIMINGS: list[tuple[str, str, float]] = []
#: The ci/ scenarios, by file name.
CI_VALUES: dict[str, dict[str, Any]] = {
    path.stem: yaml.safe_load(path.read_text(encoding="utf-8")) or {} for path in sorted(CI.glob("*.yaml"))
}

#: (kind, namespace or "" for cluster-scoped, name)
Key = tuple[str, str, str]
#: (kubectl resource, name) of a cluster-scoped object
Ref = tuple[str, str]


# --------------------------------------------------------------------------------------------
# Objects
# --------------------------------------------------------------------------------------------


def resource(obj: Mapping[str, Any]) -> str:
    """kubectl's name of the object's type: kind.group, or the kind for the core group."""
    group = str(obj["apiVersion"]).rpartition("/")[0]
    kind = str(obj["kind"]).lower()
    return f"{kind}.{group}" if group else kind


def key(obj: Mapping[str, Any], namespace: str) -> Key:
    """Helm puts a namespaced object that names no namespace in the release's."""
    kind, meta = str(obj["kind"]), obj["metadata"]
    return kind, "" if kind in CLUSTER_KINDS else str(meta.get("namespace") or namespace), str(meta["name"])


def keys(objects: list[dict[str, Any]], namespace: str) -> set[Key]:
    return {key(o, namespace) for o in objects}


def live(k: Kubectl, objects: list[dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    """Those of ``objects`` that exist, as the apiserver returns them (one ``kubectl get -f`` per
    namespace: kubectl refuses objects of another namespace than its own)."""
    by_namespace: dict[str, list[dict[str, Any]]] = {}
    for obj in objects:
        by_namespace.setdefault(key(obj, str(k.namespace))[1] or str(k.namespace), []).append(obj)
    found: dict[Key, dict[str, Any]] = {}
    for ns, group in sorted(by_namespace.items()):
        text = k.in_namespace(ns).run("get", "-f", "-", "--ignore-not-found", "-o", "json",
                                      input=yaml.safe_dump_all(group)).stdout  # fmt: skip
        if text.strip():
            data = json.loads(text)
            items: list[dict[str, Any]] = data["items"] if data.get("kind") == "List" else [data]
            found.update((key(i, ns), i) for i in items)
    return found


def one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}: {[o['metadata']['name'] for o in found]}"
    return found[0]


def owned_by(obj: Mapping[str, Any] | None, name: str, namespace: str) -> bool:
    """Whether Helm takes ``obj`` for an object of release namespace/name (its ownership check)."""
    return bool(
        dig(obj, "metadata", "labels", MANAGED_BY) == "Helm"
        and dig(obj, "metadata", "annotations", RELEASE_NAME) == name
        and dig(obj, "metadata", "annotations", RELEASE_NAMESPACE) == namespace
    )


def established(k: Kubectl, crd: str) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        obj = k.get(CRD_RESOURCE, crd)
        return obj if (condition(obj, "Established") or {}).get("status") == "True" else None

    return wait_for(f"CRD {crd} Established", probe, timeout=TIMEOUT, interval=POLL)


def serving_lists(k: Kubectl, *crds: str) -> None:
    """Wait until each CRD's storage serves a list (lists come from the watch cache since v1.34;
    Established comes earlier). A CRD deleted only then has its finalizer's first list succeed,
    instead of backing off past CRD_GONE_TIMEOUT's cause."""
    cluster = k.in_namespace(None)
    wait_for(f"the storage of {', '.join(crds)} to serve lists", lambda: all(cluster.run("get", crd, "--all-namespaces",
             check=False).returncode == 0 for crd in crds), timeout=TIMEOUT, interval=POLL)  # fmt: skip


#: Kinds a ci/ scenario renders that this cluster does not serve, by scenario.
FOREIGN_CRDS: dict[str, list[dict[str, Any]]] = {
    "metrics": [stub_crd("monitoring.coreos.com", "ServiceMonitor", "servicemonitors")],
    "cert-manager": [stub_crd("cert-manager.io", "Issuer", "issuers"), stub_crd("cert-manager.io", "Certificate",
                                                                                "certificates")],
}  # fmt: skip


def merged(base: Mapping[str, Any], *layers: Mapping[str, Any]) -> dict[str, Any]:
    """Values merged as Helm merges -f files: maps deeply, everything else replaced."""
    out = copy.deepcopy(dict(base))
    for layer in layers:
        for k, v in layer.items():
            if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
                out[k] = merged(out[k], v)
            else:
                out[k] = copy.deepcopy(v)
    return out


def copy_chart(tmp_path: Path, edits: Mapping[str, list[tuple[str, str]]]) -> Path:
    """A copy of charts/kubedgx with text replaced in some files ({file: [(old, new)]}, each old once)."""
    chart = tmp_path / "kubedgx"
    shutil.copytree(CHART, chart)
    for name, replacements in edits.items():
        path = chart / name
        text = path.read_text(encoding="utf-8")
        for old, new in replacements:
            assert text.count(old) == 1, f"{name}: {old!r} occurs {text.count(old)} times"
            text = text.replace(old, new)
        path.write_text(text, encoding="utf-8")
    return chart


def taking_ownership(config: helm.Config, action: str, chart: Path, name: str,
                     values: dict[str, Any] | None) -> dict[str, Any]:  # fmt: skip
    """``helm install|upgrade --take-ownership --force-conflicts``: Helm takes over objects another
    field manager created (tests/cluster/operator.py applies the chart's CRDs and PriorityClasses
    with kubectl). helm-c-sdk's install and upgrade options have both (take_ownership,
    force_conflicts), helm-python-sdk 0.2's Config.install/upgrade pass neither: this is their
    native call with them."""
    from helm_python import _native  # the SDK's own binding; no public way to these two options

    options = json.dumps({"take_ownership": True, "force_conflicts": True})
    none = _native.HANDLE(0)  # no cancellation context, no loaded chart: the chart by path
    payload = _native.call_string(action, config._raw(), none, none, str(chart), name,
                                  None if values is None else json.dumps(values), options)  # fmt: skip
    summary: dict[str, Any] = json.loads(payload)
    return summary


# --------------------------------------------------------------------------------------------
# A release under test
# --------------------------------------------------------------------------------------------


@dataclass
class Release:
    """One Helm release of the chart in its own namespace, and what it leaves to clean up."""

    name: str
    namespace: str
    admin: Kubectl
    plane: ControlPlane
    config: helm.Config
    #: Cluster-scoped objects that existed before this release adopted them, as they were.
    adopted: dict[Ref, dict[str, Any]] = field(default_factory=dict)
    #: Every cluster-scoped object any revision of this release rendered.
    cluster_scoped: set[Ref] = field(default_factory=set)
    #: CRDs the test created for the release (stand-ins for other projects' kinds).
    created_crds: list[str] = field(default_factory=list)
    #: Namespaces the test created for the release (watchNamespaces).
    created_namespaces: list[str] = field(default_factory=list)
    #: Helm calls take ownership and force conflicts (the release adopted objects).
    forced: bool = False

    @property
    def fullname(self) -> str:
        return self.name if "kubedgx" in self.name else f"{self.name}-kubedgx"

    @property
    def service_account(self) -> str:
        return f"{self.fullname}-operator"

    def priority_classes(self) -> dict[str, Any]:
        """Values that give the PriorityClasses this release's own names (they are cluster-scoped)."""
        return {"priorityClasses": {level: {"name": f"{self.name}-{level}"} for level in ("low", "normal", "high")}}

    def render(self, values: dict[str, Any] | None = None, *, chart: Path = CHART) -> list[dict[str, Any]]:
        return render(chart, values, name=self.name, namespace=self.namespace)

    def _timed(self, action: str, call: Callable[[], T]) -> T:
        started = time.monotonic()
        try:
            return call()
        finally:
            TIMINGS.append((self.name, action, time.monotonic() - started))

    def install(self, values: dict[str, Any] | None = None, *, chart: Path = CHART) -> list[dict[str, Any]]:
        """``helm install <name> <chart> -n <namespace> -f values``; the objects of its manifest.
        With ``--take-ownership --force-conflicts`` once the release adopted objects (see _adopt)."""
        self._adopt(self.render(values, chart=chart))
        summary = self._timed("install", lambda: self.config.install(str(chart), self.name, values) if not self.forced
                              else taking_ownership(self.config, "helm_install", chart, self.name, values))  # fmt: skip
        assert (summary["status"], summary["revision"]) == ("deployed", 1), summary
        return documents(summary["manifest"])

    def upgrade(self, values: dict[str, Any] | None = None, *, chart: Path = CHART) -> list[dict[str, Any]]:
        """``helm upgrade <name> <chart> -f values`` (values replace the previous revision's)."""
        self._adopt(self.render(values, chart=chart))
        summary = self._timed("upgrade", lambda: self.config.upgrade(str(chart), self.name, values) if not self.forced
                              else taking_ownership(self.config, "helm_upgrade", chart, self.name, values))  # fmt: skip
        assert summary["status"] == "deployed", summary
        return documents(summary["manifest"])

    def rollback(self, version: int) -> None:
        self._timed("rollback", lambda: self.config.rollback(self.name, version=version))

    def uninstall(self) -> dict[str, Any]:
        return self._timed("uninstall", lambda: self.config.uninstall(self.name))

    def _settled(self, ref: Ref) -> dict[str, Any] | None:
        """The object once it is not being deleted (None: absent)."""

        def probe() -> tuple[dict[str, Any] | None] | None:
            obj = self.admin.get(*ref)
            return None if dig(obj, "metadata", "deletionTimestamp") else (obj,)

        timeout = CRD_GONE_TIMEOUT if ref[0] == CRD_RESOURCE else TIMEOUT
        return wait_for(f"{ref[0]} {ref[1]} not terminating", probe, timeout=timeout, interval=POLL)[0]

    def _adopt(self, objects: list[dict[str, Any]]) -> None:
        """Note the release's cluster-scoped objects. Those that exist already and are not this
        release's (another module created them) are kept, as they are, to be put back at the end, and
        overwritten with this release's rendering: server-side apply never removes a field another
        manager set (a helm.sh/resource-policy: keep would stay with crds.keep false). From then on the
        release's Helm calls take them over: ``--take-ownership --force-conflicts`` (the fields stay
        shared with the managers that set them, so later upgrades that change them conflict too)."""
        for obj in objects:
            if obj["kind"] not in CLUSTER_KINDS:
                continue
            ref = (resource(obj), str(obj["metadata"]["name"]))
            self.cluster_scoped.add(ref)
            current = self._settled(ref)
            if current is not None and not owned_by(current, self.name, self.namespace):
                self.adopted.setdefault(ref, current)
                ownership = {RELEASE_NAME: self.name, RELEASE_NAMESPACE: self.namespace}
                self._write(ref, merged(obj, {"metadata": {"annotations": ownership}}))
                self.forced = True

    def _write(self, ref: Ref, obj: dict[str, Any]) -> None:
        """Create or replace the cluster-scoped object with ``obj`` (the apiserver's fields dropped):
        an adopted object as it was before the release took it over."""
        obj = copy.deepcopy(obj)
        obj.pop("status", None)
        for name in SERVER_FIELDS:
            obj["metadata"].pop(name, None)
        text = json.dumps(obj)
        if self._settled(ref) is None:
            self.admin.run("create", "-f", "-", input=text)
        else:
            try:
                self.admin.run("replace", "-f", "-", input=text)
            except KubectlError:
                if ref[0] == CRD_RESOURCE:  # never delete a CRD that others use: that deletes their objects
                    raise
                self.admin.run("delete", *ref, "--wait=true")  # e.g. a PriorityClass's value is immutable
                self.admin.run("create", "-f", "-", input=text)
        if ref[0] == CRD_RESOURCE:
            established(self.admin, ref[1])

    def close(self) -> None:
        """Uninstall (if still installed), delete what the release left cluster-wide, restore what it adopted."""
        try:
            self.config.uninstall(self.name, ignore_not_found=True)
        finally:
            leftovers = [r for r in sorted(self.cluster_scoped) if r not in self.adopted]
            leftovers += [(CRD_RESOURCE, crd) for crd in self.created_crds]
            crds = [name for kind, name in leftovers if kind == CRD_RESOURCE and self.admin.get(kind, name)]
            if crds:
                serving_lists(self.admin, *crds)
            for ref in leftovers:
                self.admin.run("delete", *ref, "--ignore-not-found", "--wait=false")
            wait_for(f"{len(leftovers)} cluster-scoped objects of release {self.name} to be gone",
                     lambda: all(self.admin.get(*ref) is None for ref in leftovers),
                     timeout=CRD_GONE_TIMEOUT if crds else TIMEOUT, interval=POLL)  # fmt: skip
            for ref, before in sorted(self.adopted.items()):
                self._write(ref, before)
            for ns in self.created_namespaces:
                self.admin.run("delete", "namespace", ns, "--ignore-not-found", "--wait=false")

    # -- around the release ---------------------------------------------------------------

    def provide_crds(self, *crds: dict[str, Any]) -> None:
        """Create the CRDs that do not exist yet (deleted with the release)."""
        for crd in crds:
            name = str(crd["metadata"]["name"])
            if self.admin.get(CRD_RESOURCE, name) is None:
                self.created_crds.append(name)
                self.admin.apply(crd)
            established(self.admin, name)

    def create_namespace(self, suffix: str) -> str:
        name = f"{self.namespace}-{suffix}"[:63].rstrip("-")
        self.created_namespaces.append(name)
        self.admin.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        return name

    def release_secrets(self) -> list[dict[str, Any]]:
        return self.admin.select("secrets", {"owner": "helm", "name": self.name})

    def remaining(self) -> list[str]:
        """What of this release is still in its namespace: its objects (by label), its pods and
        ReplicaSets, its release Secrets."""
        found = self.admin.select("all", {INSTANCE: self.name}) + self.admin.select(
            "serviceaccounts,configmaps,secrets", {INSTANCE: self.name}
        ) + self.release_secrets()  # fmt: skip
        return sorted(f"{o['kind']}/{o['metadata']['name']}" for o in found)


@pytest.fixture
def release(control_plane: ControlPlane, namespace: Kubectl, request: pytest.FixtureRequest) -> Iterator[Release]:
    """A release name of its own (from the test's name) in the test's namespace; uninstalled and
    cleaned up afterwards."""
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower().removeprefix("test_"))[:24].strip("-")
    name = f"{slug}-{secrets.token_hex(2)}"
    helm.validate_release_name(name)
    ns = str(namespace.namespace)
    config = helm.Config(kubeconfig_path=control_plane.kubeconfig, kube_context=CONTEXT, namespace=ns)
    rel = Release(name, ns, namespace, control_plane, config)
    try:
        yield rel
    finally:
        try:
            rel.close()
        finally:
            config.close()


@pytest.fixture(scope="module", autouse=True)
def _timings(request: pytest.FixtureRequest) -> Iterator[None]:
    """At the end of the module: how long Helm's install, upgrade and uninstall took."""
    yield
    reporter: Any = request.config.pluginmanager.get_plugin("terminalreporter")
    capture: Any = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or not TIMINGS:
        return
    parts = []
    for action in ("install", "upgrade", "rollback", "uninstall"):
        seconds = [s for _, a, s in TIMINGS if a == action]
        if seconds:
            parts.append(f"{action} x{len(seconds)} median {statistics.median(seconds):.2f}s max {max(seconds):.2f}s")
    with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
        reporter.write_line(f"\nhelm-python-sdk against the control plane: {'; '.join(parts)}")


# --------------------------------------------------------------------------------------------
# Shared checks
# --------------------------------------------------------------------------------------------


def assert_installed(rel: Release, objects: list[dict[str, Any]], values: dict[str, Any] | None, *,
                     chart: Path = CHART) -> dict[Key, dict[str, Any]]:  # fmt: skip
    """The release's manifest is what the chart renders offline, every object of it exists, and each
    carries the release's labels (cluster-scoped ones also Helm's ownership annotations)."""
    expected = keys(rel.render(values, chart=chart), rel.namespace)
    assert keys(objects, rel.namespace) == expected
    found = live(rel.admin, objects)
    assert set(found) == expected, f"missing on the apiserver: {sorted(expected - set(found))}"
    for k, obj in found.items():
        assert dig(obj, "metadata", "labels", INSTANCE) == rel.name, k
        assert dig(obj, "metadata", "labels", MANAGED_BY) == "Helm", k
        if k[0] in CLUSTER_KINDS:
            assert owned_by(obj, rel.name, rel.namespace), k
    status = rel.config.status(rel.name)
    assert status["status"] == "deployed"
    assert len(rel.release_secrets()) == status["revision"]
    return found


def assert_gone(rel: Release, objects: list[dict[str, Any]], *, but: frozenset[str] = frozenset()) -> None:
    """Everything of the release is deleted (but objects of the kinds in ``but``); the release is gone."""
    rest = [o for o in objects if o["kind"] not in but]
    wait_for(f"the objects of release {rel.name} to be deleted", lambda: not live(rel.admin, rest) and not
             rel.remaining(), timeout=TIMEOUT, interval=POLL,
             diagnose=lambda: f"still there: {sorted(live(rel.admin, rest))} {rel.remaining()}")  # fmt: skip
    with pytest.raises(helm.HelmNotFoundError):
        rel.config.status(rel.name)
    assert rel.name not in [r["name"] for r in rel.config.list(all_states=True)]


# --------------------------------------------------------------------------------------------
# Install
# --------------------------------------------------------------------------------------------


def without_nulls(values: Any) -> Any:
    """Values as Helm keeps them: a key whose value is null is deleted (catalog.topologyKey)."""
    if isinstance(values, dict):
        return {k: without_nulls(v) for k, v in values.items() if v is not None}
    return values


def test_install_with_default_values(control_plane: ControlPlane, release: Release) -> None:
    """``helm install`` with the chart's defaults: Helm checks kubeVersion against the apiserver's
    /version, applies every object (server-side), the CRDs are Established, the operator's Deployment
    is there (its pod stays Pending: no fake node takes it)."""
    assert control_plane.get("/version")["gitVersion"] == control_plane.bin.kubernetes_version == "v1.34.12"
    objects = release.install()
    found = assert_installed(release, objects, None)
    kinds = sorted({k for k, _, _ in found})
    assert kinds == sorted({"ClusterRole", "ClusterRoleBinding", "ConfigMap", "CustomResourceDefinition",
                            "Deployment", "Lease", "PodDisruptionBudget", "PriorityClass", "Role", "RoleBinding",
                            "Secret", "Service", "ServiceAccount", "ValidatingWebhookConfiguration"})  # fmt: skip
    for crd in CRDS:
        obj = established(release.admin, crd)
        assert dig(obj, "metadata", "annotations", KEEP_POLICY) == "keep"
        assert owned_by(obj, release.name, release.namespace)
        rendered = one(objects, "CustomResourceDefinition", crd)
        assert obj["spec"]["versions"] == rendered["spec"]["versions"]
    deployment = found[("Deployment", release.namespace, f"{release.fullname}-operator")]
    assert dig(deployment, "spec", "template", "spec", "serviceAccountName") == release.service_account
    assert dig(deployment, "spec", "replicas") == 2
    for level, value in (("low", 1000), ("normal", 10000), ("high", 100000)):
        assert dig(found[("PriorityClass", "", f"kubedgx-{level}")], "value") == value
    assert release.config.get_values(release.name) is None  # no user-supplied values
    assert release.config.get_values(release.name, all_values=True) == without_nulls(chart_values())
    (secret,) = release.release_secrets()
    assert secret["type"] == "helm.sh/release.v1"
    assert dig(secret, "metadata", "labels", "status") == "deployed"


def test_helm_refuses_a_chart_whose_kube_version_the_apiserver_does_not_meet(
    control_plane: ControlPlane, release: Release, tmp_path: Path
) -> None:
    """kubeVersion is checked against what the apiserver reports, not a built-in default."""
    chart = copy_chart(tmp_path, {"Chart.yaml": [('kubeVersion: ">=1.29.0-0"', 'kubeVersion: ">=1.35.0-0"')]})
    refusal = "requires kubeVersion: >=1.35.0-0 which is incompatible with Kubernetes "
    with pytest.raises(helm.HelmError, match=re.escape(refusal + control_plane.bin.kubernetes_version)):
        release.install({"crds": {"enabled": False}, **release.priority_classes()}, chart=chart)
    assert release.config.list(all_states=True) == []
    assert release.remaining() == []


@pytest.mark.parametrize("scenario", sorted(CI_VALUES))
def test_ci_scenario_installs_and_uninstalls(scenario: str, release: Release) -> None:
    """Each ci/*.yaml as ``helm install -f`` would take it, with the PriorityClasses named after the
    release. namespaced: two fresh namespaces stand in for ml and research. metrics, cert-manager:
    their kinds are not served here, which Helm refuses before it creates anything; with stand-in
    CRDs (no controller: no certificate is issued, no CA injected) the install succeeds."""
    values = merged(CI_VALUES[scenario], release.priority_classes())
    if scenario == "namespaced":
        values["watchNamespaces"] = [release.create_namespace("ml"), release.create_namespace("research")]
    elif scenario in FOREIGN_CRDS:
        missing = [c for c in FOREIGN_CRDS[scenario] if release.admin.get(CRD_RESOURCE, c["metadata"]["name"]) is None]
        if missing:
            kinds = "|".join(c["spec"]["names"]["kind"] for c in missing)
            with pytest.raises(helm.HelmReleaseError, match=rf'no matches for kind "({kinds})".*\n?.*ensure CRDs'):
                release.install(values)
            assert release.config.list(all_states=True) == []
            assert release.remaining() == []
        release.provide_crds(*FOREIGN_CRDS[scenario])
    elif scenario != "no-crds":
        pytest.fail(f"ci/{scenario}.yaml is new: say here what it needs from the cluster")

    objects = release.install(values)
    found = assert_installed(release, objects, values)
    ns, full = release.namespace, release.fullname
    if scenario == "no-crds":
        assert not {"CustomResourceDefinition", "PriorityClass"} & {o["kind"] for o in objects}
    elif scenario == "namespaced":
        for watched in values["watchNamespaces"]:
            assert ("Role", watched, f"{full}-operator") in found
            assert ("RoleBinding", watched, f"{full}-operator") in found
        cluster_rules = found[("ClusterRole", "", f"{full}-operator")]["rules"]
        assert "kubedgx.io" not in {g for r in cluster_rules for g in r["apiGroups"]}
    elif scenario == "metrics":
        monitor = found[("ServiceMonitor", ns, f"{full}-operator")]
        service = found[("Service", ns, f"{full}-metrics")]
        assert dig(monitor, "metadata", "labels", "release") == "prometheus"
        selector = dig(monitor, "spec", "selector", "matchLabels")
        assert selector.items() <= service["metadata"]["labels"].items()
    elif scenario == "cert-manager":
        webhook = found[("ValidatingWebhookConfiguration", "", f"{full}-webhook")]
        assert dig(webhook, "metadata", "annotations", "cert-manager.io/inject-ca-from") == f"{ns}/{full}-webhook"
        assert [w["name"] for w in webhook["webhooks"]] == ["dgxtrainingjobs.kubedgx.io", "dgxdatamounts.kubedgx.io"]
        assert all(w["failurePolicy"] == "Ignore" and "caBundle" not in w["clientConfig"] for w in webhook["webhooks"])
        assert ("Issuer", ns, f"{full}-selfsigned") in found
        assert dig(found[("Certificate", ns, f"{full}-webhook")], "spec", "secretName") == f"{full}-webhook-tls"

    release.uninstall()
    kept = frozenset({"CustomResourceDefinition"}) if dig(values, "crds", "keep") is not False else frozenset()
    assert_gone(release, objects, but=kept)


# --------------------------------------------------------------------------------------------
# Upgrade
# --------------------------------------------------------------------------------------------


L40S = {"family": "l40s", "memoryGiB": 48, "description": "NVIDIA L40S 48GB", "products": ["NVIDIA-L40S"],
        "shapes": [1, 2, 4, 8], "perGpu": {"cpu": 16, "memoryGi": 120, "shmGi": 8}}  # fmt: skip
GKE_ACCOUNT = "iam.gke.io/gcp-service-account"


def test_an_upgrade_changes_the_objects_and_a_rollback_restores_them(release: Release) -> None:
    """New values (pod label, ServiceAccount annotation, one more GPU family, metrics off) reach the
    objects in place; the metrics Service, no longer rendered, is deleted; rollback brings revision 1 back."""
    first = merged({"crds": {"enabled": False}}, release.priority_classes())
    release.install(first)
    operator = f"{release.fullname}-operator"
    before = release.admin.get("deployment", operator)
    assert before is not None

    changes = {
        "podLabels": {"team": "research"},
        "catalogExtraGpus": [L40S],
        "metrics": {"enabled": False},
        "serviceAccount": {"annotations": {GKE_ACCOUNT: "op@p.iam.gserviceaccount.com"}},
    }
    second = merged(first, changes)
    objects = release.upgrade(second)
    assert_installed(release, objects, second)
    assert [(r["revision"], r["status"]) for r in release.config.history(release.name)] == [
        (1, "superseded"), (2, "deployed")]  # fmt: skip
    assert release.config.get_values(release.name) == second

    after = release.admin.get("deployment", operator)
    assert dig(after, "metadata", "uid") == dig(before, "metadata", "uid"), "upgraded in place, not recreated"
    template = dig(after, "spec", "template", "metadata")
    assert template["labels"]["team"] == "research"
    assert template["annotations"]["checksum/catalog"] != dig(before, "spec", "template", "metadata", "annotations",
                                                              "checksum/catalog")  # fmt: skip
    env = {e["name"]: e.get("value") for e in dig(after, "spec", "template", "spec", "containers", 0, "env")}
    assert env["KUBEDGX_METRICS_PORT"] == "0"
    catalog = yaml.safe_load(dig(release.admin.get("configmap", f"{release.fullname}-catalog"), "data", "catalog.yaml"))
    assert catalog["gpus"][-1] == L40S
    account = release.admin.get("serviceaccount", release.service_account)
    assert dig(account, "metadata", "annotations", GKE_ACCOUNT) == "op@p.iam.gserviceaccount.com"
    wait_for("the metrics Service to be deleted", lambda: release.admin.get("service", f"{release.fullname}-metrics")
             is None, timeout=TIMEOUT, interval=POLL)  # fmt: skip
    wait_for("a new operator ReplicaSet", lambda: len(release.admin.select("replicasets", {INSTANCE: release.name}))
             == 2, timeout=TIMEOUT, interval=POLL)  # fmt: skip

    release.rollback(1)
    assert release.config.status(release.name)["revision"] == 3
    assert release.config.get_values(release.name) == first
    assert release.admin.get("service", f"{release.fullname}-metrics") is not None
    rolled = release.admin.get("deployment", operator)
    assert "team" not in dig(rolled, "spec", "template", "metadata", "labels")


def test_a_crd_schema_change_rolls_out_on_upgrade(release: Release, tmp_path: Path) -> None:
    """Upgrading from a chart whose DGXDataMount CRD differs (a printer column renamed, a description
    and a maxLength changed) to the real chart updates the CRD; the apiserver then serves, validates
    and prints by the real schema, and the object created under the old one is still there."""
    crd_file = "templates/crds/kubedgx.io_dgxdatamounts.yaml"
    old_chart = copy_chart(tmp_path, {crd_file: [
        ("    - name: Objects\n", "    - name: Listed\n"),
        ("      description: Objects listed.\n", "      description: Objects listed (old chart).\n"),
        ("              region:\n                maxLength: 64\n",
         "              region:\n                maxLength: 2048\n"),
    ]})  # fmt: skip
    # crds.keep: CRDs another module uses are never deleted here. No webhook: no replica would answer it, and
    # its failurePolicy Fail would refuse the writes this test makes (test_ha.py runs the replicas).
    values = merged(release.priority_classes(), {"webhook": {"enabled": False}})
    long_region = {"apiVersion": "kubedgx.io/v1alpha1", "kind": "DGXDataMount", "metadata": {"name": "eu"},
                   "spec": {"source": "s3://bucket/data", "region": "r" * 100}}  # fmt: skip

    release.install(values, chart=old_chart)
    crd = established(release.admin, MOUNTS)
    assert "Listed" in [c["name"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]]
    release.admin.apply(long_region)  # 100 characters: the old schema allows 2048

    objects = release.upgrade(values)
    rendered = one(objects, "CustomResourceDefinition", MOUNTS)["spec"]["versions"]
    upgraded = release.admin.get(CRD_RESOURCE, MOUNTS)
    assert upgraded is not None
    assert upgraded["spec"]["versions"] == rendered
    assert owned_by(upgraded, release.name, release.namespace)

    def refused() -> str | None:
        again = merged(long_region, {"metadata": {"name": "eu-again"}})
        answer = release.admin.run("create", "--dry-run=server", "-f", "-", input=json.dumps(again), check=False)
        return answer.stderr if answer.returncode != 0 else None

    message = wait_for("the apiserver to validate by the new schema", refused, timeout=TIMEOUT, interval=POLL)
    assert re.search(r"spec\.region: Too long: may not be (more than|longer than) 64", message), message
    header = wait_for("the new printer columns", lambda: (h := release.admin.run("get", "dgxdatamounts").stdout
                      .splitlines()[0].split()) and "OBJECTS" in h and h, timeout=TIMEOUT, interval=POLL)  # fmt: skip
    assert header == ["NAME", "PHASE", "DIRECTION", "SOURCE", "OBJECTS", "REASON", "AGE"]
    assert dig(release.admin.get("dgxdatamount", "eu"), "spec", "region") == "r" * 100  # stored objects stay
    release.admin.delete("dgxdatamount", "eu", wait=True)  # the CRDs may be another module's: leave them empty


# --------------------------------------------------------------------------------------------
# Uninstall
# --------------------------------------------------------------------------------------------


def test_uninstall_keeps_the_crds_by_default(release: Release) -> None:
    """crds.keep defaults to true: the CRDs stay (helm.sh/resource-policy: keep), nothing else does."""
    assert chart_values()["crds"]["keep"] is True
    objects = release.install(release.priority_classes())
    for crd in CRDS:
        established(release.admin, crd)
    answer = release.uninstall()
    assert answer["release"]["status"] == "uninstalled"
    for crd in CRDS:
        assert f"[CustomResourceDefinition] {crd}" in answer["info"]
    assert_gone(release, objects, but=frozenset({"CustomResourceDefinition"}))
    for crd in CRDS:
        obj = release.admin.get(CRD_RESOURCE, crd)
        assert obj is not None, f"{crd} was deleted"
        assert dig(obj, "metadata", "deletionTimestamp") is None
        assert dig(obj, "metadata", "annotations", KEEP_POLICY) == "keep"
        assert owned_by(obj, release.name, release.namespace), "left as the uninstalled release's"


def test_uninstall_removes_the_crds_when_keep_is_false(release: Release) -> None:
    """With crds.keep false the CRDs go with the release (and with them every job and mount). Where
    the CRDs exist already and hold objects of other tests, that would delete them (and hang for good
    on any that carries the finalizer of an operator no longer running): then there is nothing to test."""
    cluster = release.admin.in_namespace(None)

    def others() -> list[str]:
        return [
            f"{crd} {o['metadata']['namespace']}/{o['metadata']['name']} finalizers={dig(o, 'metadata', 'finalizers')}"
            for crd in CRDS
            if cluster.get(CRD_RESOURCE, crd)
            for o in cluster.get_json("get", crd, "--all-namespaces")["items"]
        ]

    try:  # objects of namespaces being deleted go by themselves, unless a finalizer holds them
        wait_for("other tests' jobs and mounts to be gone", lambda: not others(), timeout=20, interval=POLL)
    except WaitTimeoutError:
        pytest.skip(f"the CRDs hold objects of other tests, which crds.keep false would delete: {others()[:5]}")
    values = merged({"crds": {"keep": False}}, release.priority_classes())
    objects = release.install(values)
    for crd in CRDS:
        assert KEEP_POLICY not in (dig(established(release.admin, crd), "metadata", "annotations") or {})
    serving_lists(release.admin, *CRDS)  # see CRD_GONE_TIMEOUT
    answer = release.uninstall()
    assert answer["info"] == ""
    assert_gone(release, objects)
    wait_for("the CRDs to be deleted", lambda: all(release.admin.get(CRD_RESOURCE, c) is None for c in CRDS),
             timeout=CRD_GONE_TIMEOUT, interval=POLL)  # fmt: skip


# --------------------------------------------------------------------------------------------
# RBAC
# --------------------------------------------------------------------------------------------


def allowed(plane: ControlPlane, user: str, namespace: str, verb: str, group: str, resource_: str,
            name: str = "") -> bool:  # fmt: skip
    """The apiserver's RBAC authorizer's answer for a ServiceAccount (a SubjectAccessReview)."""
    res, _, sub = resource_.partition("/")
    account_ns = user.split(":")[2]
    body = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": user,
            "groups": ["system:serviceaccounts", f"system:serviceaccounts:{account_ns}", "system:authenticated"],
            "resourceAttributes": {"namespace": namespace, "verb": verb, "group": group, "resource": res,
                                   "subresource": sub, "name": name},
        },
    }  # fmt: skip
    status, answer = plane.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", body)
    assert status == 201, answer
    return bool(dig(answer, "status", "allowed"))


def requests(rules: list[dict[str, Any]]) -> list[tuple[str, str, str, str]]:
    """Every (verb, group, resource, name) the rules grant."""
    return [(verb, group, res, name) for rule in rules for group in rule["apiGroups"] for res in rule["resources"]
            for verb in rule["verbs"] for name in rule.get("resourceNames") or [""]]  # fmt: skip


@pytest.mark.parametrize("mode", ["cluster-wide", "namespaced"])
def test_rbac_is_accepted_and_grants_exactly_what_it_renders(mode: str, control_plane: ControlPlane,
                                                             release: Release) -> None:  # fmt: skip
    """The (Cluster)Roles and bindings are stored as rendered (the installer is system:masters, so RBAC's
    escalation check lets it grant anything), and the authorizer gives the operator's ServiceAccount
    each rendered permission where it applies, and not elsewhere."""
    values = merged({"crds": {"enabled": False}}, release.priority_classes())
    watched: list[str] = []
    if mode == "namespaced":
        watched = [release.create_namespace("ml"), release.create_namespace("research")]
        values["watchNamespaces"] = watched
    objects = release.install(values)
    found = assert_installed(release, objects, values)
    for obj in objects:
        if obj["kind"] in {"ClusterRole", "Role", "ClusterRoleBinding", "RoleBinding"}:
            stored = found[key(obj, release.namespace)]
            for part in ("rules", "roleRef", "subjects"):
                assert stored.get(part) == obj.get(part), f"{obj['kind']} {obj['metadata']['name']}: {part}"

    user = f"system:serviceaccount:{release.namespace}:{release.service_account}"
    full = release.fullname
    cluster_rules = requests(one(objects, "ClusterRole", f"{full}-operator")["rules"])
    for verb, group, res, name in cluster_rules:
        assert allowed(control_plane, user, "", verb, group, res, name), (verb, group, res, name)
    if mode == "cluster-wide":
        assert ("list", "kubedgx.io", "dgxtrainingjobs", "") in cluster_rules
        assert ("patch", "admissionregistration.k8s.io", "validatingwebhookconfigurations", f"{full}-webhook") in (
            cluster_rules)  # fmt: skip
        assert not allowed(control_plane, user, "", "patch", "admissionregistration.k8s.io",
                           "validatingwebhookconfigurations", "someone-elses")  # fmt: skip
    else:
        roles = [o for o in objects if o["kind"] == "Role" and not o["metadata"]["name"].endswith("-self")]
        assert sorted(r["metadata"]["namespace"] for r in roles) == sorted(watched)
        for verb, group, res, name in requests(roles[0]["rules"]):
            for ns in watched:
                assert allowed(control_plane, user, ns, verb, group, res, name), (ns, verb, group, res)
            assert not allowed(control_plane, user, release.namespace, verb, group, res, name), (verb, group, res)
    for ns in watched or [release.namespace]:
        assert not allowed(control_plane, user, ns, "delete", "", "secrets")
        assert not allowed(control_plane, user, ns, "create", "apps", "deployments")
        assert not allowed(control_plane, user, ns, "update", "kubedgx.io", "dgxtrainingjobs")
