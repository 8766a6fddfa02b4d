"""The operator's kopf login in a pod: the ServiceAccount at the address the pod is given
(KUBERNETES_SERVICE_HOST/PORT), as client-go and the operator's own client read it. kopf's own
service-account login always dials https://kubernetes.default.svc; on the real test nodes, whose
pods reach the apiserver without kube-proxy, the chart's operator crash-looped on it."""

from __future__ import annotations

from pathlib import Path

import kopf
import pytest

from dgx_operator.kube import in_cluster_login
from dgx_operator.runtime.handlers import login


def service_account(tmp_path: Path, *, namespace: bool = True, ca: bool = True) -> Path:
    (tmp_path / "token").write_text("tok-123\n")
    if namespace:
        (tmp_path / "namespace").write_text("kubedgx-system")
    if ca:
        (tmp_path / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    return tmp_path


@pytest.mark.parametrize(
    ("host", "port", "server"),
    [
        ("10.200.0.1", "6443", "https://10.200.0.1:6443"),
        ("10.96.0.1", "443", "https://10.96.0.1:443"),
        ("fd00:10:96::1", "443", "https://[fd00:10:96::1]:443"),
        ("api.internal.example", "8443", "https://api.internal.example:8443"),
    ],
)
def test_the_pods_apiserver_address_and_service_account(tmp_path: Path, host: str, port: str, server: str) -> None:
    directory = service_account(tmp_path)
    env = {"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port}
    info = in_cluster_login(kopf.OperatorSettings(), env, str(directory))
    assert info is not None
    assert info.server == server
    assert info.token == "tok-123"
    assert info.default_namespace == "kubedgx-system"
    assert info.ca_path == str(directory / "ca.crt")


def test_without_a_ca_or_namespace_file(tmp_path: Path) -> None:
    directory = service_account(tmp_path, namespace=False, ca=False)
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    info = in_cluster_login(kopf.OperatorSettings(), env, str(directory))
    assert info is not None
    assert (info.ca_path, info.default_namespace) == (None, None)


@pytest.mark.parametrize(
    "env",
    [{}, {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, {"KUBERNETES_SERVICE_PORT": "443"}],
)
def test_not_a_pod_without_the_variables(tmp_path: Path, env: dict[str, str]) -> None:
    assert in_cluster_login(kopf.OperatorSettings(), env, str(service_account(tmp_path))) is None


def test_not_a_pod_without_a_token(tmp_path: Path) -> None:
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    assert in_cluster_login(kopf.OperatorSettings(), env, str(tmp_path)) is None


def test_outside_a_pod_the_login_is_the_kubeconfigs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:7443'}}]\n"
        "users: [{name: u, user: {token: abc}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    info = login(settings=kopf.OperatorSettings(), logger=None)
    assert info is not None
    assert info.server == "https://127.0.0.1:7443"
