"""kubedgx on the real control plane: the chart's objects applied (all but the operator's
Deployment, whose pod no fake node would run), and the operator itself as a local process that
authenticates as the chart's ServiceAccount with a token from the TokenRequest API, configured from
the rendered Deployment's environment and arguments. So every call it makes goes through the
apiserver's RBAC with exactly the rules the chart grants.

What differs from the Deployment, and why: no webhook port (the webhook's own tests route the
apiserver to it), no metrics or health servers (ports 0), the built-in catalog file written from the
chart's ConfigMap, and the log in a file the tests read.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import itertools
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID

from dgx_operator.webhook.admission import WEBHOOKS, webhook_configuration
from dgx_operator.webhook.config import WebhookConfig
from tests.chart.conftest import NAMESPACE, RELEASE, Rendered, find, one, render
from tests.cluster.controlplane import ControlPlane, _cert, _key, _name, _write_key, stop_process_group
from tests.e2e.kubectl import JOBS, MOUNTS, Kubectl, dig, wait_for
from tests.support.ports import free_port

#: The field manager of everything the tests apply for the chart.
MANAGER = "kubedgx-cluster-tests"
#: The console script the operator image runs (``kubedgx operator``), next to this interpreter.
KUBEDGX = shutil.which("kubedgx", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))


def install(kubectl: Kubectl, values: Mapping[str, Any] | None = None, *, release: str = RELEASE,
            namespace: str = NAMESPACE) -> list[Rendered]:  # fmt: skip
    """Apply the chart's objects (server-side, as one field manager) but its Deployment; wait until
    both CRDs are Established. Idempotent: other test modules may have installed them already.
    Returns every rendered object, the Deployment included (the operator's configuration)."""
    rendered = render(dict(values or {}), name=release, namespace=namespace)
    # Not the Deployment (no fake node runs its pods), nor what only its pods use: the webhook
    # configuration (failurePolicy Fail with no replica to answer would refuse every write of the
    # other modules; test_webhook.py and test_ha.py route the apiserver to the webhook themselves).
    objects = [r for r in rendered if r.kind not in ("Deployment", "ValidatingWebhookConfiguration")]
    kubectl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    text = json.dumps({"apiVersion": "v1", "kind": "List", "items": [r.obj for r in objects]})
    kubectl.run("apply", "--server-side", "--force-conflicts", f"--field-manager={MANAGER}", "-f", "-", input=text)
    for crd in (JOBS, MOUNTS):
        wait_for(
            f"CRD {crd} Established",
            lambda crd=crd: any(  # type: ignore[misc]
                c.get("type") == "Established" and c.get("status") == "True"
                for c in dig(kubectl.get("customresourcedefinition", crd), "status", "conditions", default=[]) or []
            ),
            timeout=60,
            interval=0.3,
        )
    return rendered


def service_account(objects: list[Rendered]) -> tuple[str, str]:
    """(namespace, name) of the operator's ServiceAccount in the rendered chart."""
    (sa,) = find(objects, "ServiceAccount")
    return str(sa["metadata"]["namespace"]), str(sa["metadata"]["name"])


def token_kubeconfig(plane: ControlPlane, kubectl: Kubectl, path: Path, account: tuple[str, str]) -> Path:
    """A kubeconfig whose only credential is a bound token of the ServiceAccount ``account``
    (namespace, name), from the TokenRequest API."""
    namespace, name = account
    token = kubectl.in_namespace(namespace).run("create", "token", name, "--duration=2h").stdout.strip()
    assert token.count(".") == 2, "a JWT"
    context = f"{name}@{plane.server}"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "cluster", "cluster": {"server": plane.server, "certificate-authority": str(plane.pki.ca_crt)}}
        ],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": context, "context": {"cluster": "cluster", "user": name}}],
        "current-context": context,
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path


@dataclass
class Operator:
    """``kubedgx operator`` running as a local process; its log goes to ``log_path``."""

    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def forbidden(self) -> list[str]:
        """Log lines that report a call RBAC refused ("... is forbidden: User ... cannot <verb>"), which
        the chart's rules must never cause. Other 403s are not RBAC's: a namespace being deleted
        refuses new objects with 403 NamespaceTerminating, whoever asks."""
        return [line for line in self.log().splitlines() if re.search(r"forbidden: User .* cannot ", line)]

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 20) -> None:
        stop_process_group(self.process, timeout)


def operator_environment(objects: list[Rendered], kubeconfig: Path, workdir: Path) -> tuple[dict[str, str], list[str]]:
    """The rendered Deployment's environment and arguments, made local (see the module docstring)."""
    deployment = one(objects, "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    catalog = workdir / "catalog.yaml"
    (catalog_map,) = [c for c in find(objects, "ConfigMap") if "catalog.yaml" in c.get("data", {})]
    catalog.write_text(catalog_map["data"]["catalog.yaml"], encoding="utf-8")
    env = {k: v for k, v in env.items() if not k.startswith("KUBEDGX_WEBHOOK_")}
    env |= {"KUBEDGX_CATALOG": str(catalog), "KUBEDGX_METRICS_PORT": "0", "KUBEDGX_HEALTH_PORT": "0"}
    base = {k: v for k, v in os.environ.items() if not k.startswith("KUBEDGX_")}
    base |= env | {"KUBECONFIG": str(kubeconfig), "PYTHONUNBUFFERED": "1"}
    args = [a for a in container.get("args", []) if a not in ("--log-format", "json")]
    return base, args


def start_operator(objects: list[Rendered], kubeconfig: Path, workdir: Path,
                   extra_args: tuple[str, ...] = (), *, verbose: bool = True) -> Operator:  # fmt: skip
    """Start the operator and wait until it has started its watches (stopped again if it does not).

    ``verbose``: debug logging, which the tests read (their failures and the watch-stream line
    this waits for). Without it (as the chart runs it: benchmarks/operator_scale.py measures its
    memory) the wait is for /readyz on a health port of its own, answered once kopf has run the
    startup handlers that open the watches."""
    assert KUBEDGX is not None, "the kubedgx console script is not installed (pip install -e .)"
    workdir.mkdir(parents=True, exist_ok=True)
    env, args = operator_environment(objects, kubeconfig, workdir)
    health: int | None = None
    if not verbose:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            health = sock.getsockname()[1]
        env["KUBEDGX_HEALTH_PORT"] = str(health)
    log_path = workdir / "operator.log"
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [KUBEDGX, *args, *(["--verbose"] if verbose else []), *extra_args],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    op = Operator(process, log_path)
    port = _webhook_port(extra_args)
    try:
        wait_for(
            "the operator to start watching" + (f" and serve its webhook on port {port}" if port else ""),
            lambda: (
                (not op.running and _raise(f"the operator exited {process.returncode}:\n{op.tail()}"))
                or (
                    (
                        _ready(health)
                        if health is not None
                        else "Starting the watch-stream for dgxtrainingjobs" in op.log()
                    )
                    and (port is None or _accepts(port))
                )
            ),
            timeout=60,
            interval=0.3,
        )
    except BaseException:
        op.stop()
        raise
    return op


@contextlib.contextmanager
def run_operator(plane: ControlPlane, owner: str, objects: list[Rendered], kubeconfig: Path, workdir: Path,
                 extra_args: tuple[str, ...] = ()) -> Iterator[Operator]:  # fmt: skip
    """The operator for one test module: it takes the control plane's operator slot (stopping any
    other operator first) and gives it back on exit."""
    op = plane.slot.take(owner, lambda: start_operator(objects, kubeconfig, workdir, extra_args))
    try:
        yield op
    finally:
        plane.slot.release(owner)


def _ready(port: int) -> bool:
    """The operator's /readyz answers 200."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as response:
            return bool(response.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def _webhook_port(args: tuple[str, ...]) -> int | None:
    """The --webhook-port of an operator's flags, if it serves admission."""
    for flag, value in itertools.pairwise(args):
        if flag == "--webhook-port":
            return int(value)
    return None


def _accepts(port: int) -> bool:
    """Something listens on 127.0.0.1:``port``: kopf starts its admission server beside the watch
    streams, not before them, and the apiserver refuses every object of a webhook's rules (failure
    policy Fail) while the port is closed: the e2e tests' first apply after the operator came back
    was refused so."""
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


def _raise(message: str) -> bool:
    raise AssertionError(message)


@contextlib.contextmanager
def chart_operator(plane: ControlPlane, kubectl: Kubectl, owner: str, chart: list[Rendered], workdir: Path,
                   extra_args: tuple[str, ...] = ()) -> Iterator[Operator]:  # fmt: skip
    """A test module's operator as the chart's ServiceAccount (a TokenRequest token), in the
    control plane's operator slot; on a clean exit, fails if RBAC refused any of its calls."""
    kubeconfig = token_kubeconfig(plane, kubectl, workdir / "operator.kubeconfig", service_account(chart))
    with run_operator(plane, owner, chart, kubeconfig, workdir, extra_args) as op:
        yield op
        refused = op.forbidden()
        assert refused == [], "the chart's RBAC refused the operator:\n" + "\n".join(refused[:20])


# -- the webhook, reached by the apiserver through a URL (kwok's pods have no routable IP) -------


def serving_certificate(directory: Path) -> dict[str, Path]:
    """A CA and a serving certificate for https://127.0.0.1 (an IP SAN: the apiserver checks it):
    files "ca", "crt", "key"."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = _key()
    ca = _cert(_name("kubedgx-webhook-test-ca"), ca_key, None)
    key = _key()
    crt = _cert(_name("127.0.0.1"), key, (ca, ca_key), usage=ExtendedKeyUsageOID.SERVER_AUTH, sans=["127.0.0.1"])
    files = {"ca": directory / "ca.crt", "crt": directory / "tls.crt", "key": directory / "tls.key"}
    files["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files["crt"].write_bytes(crt.public_bytes(serialization.Encoding.PEM))
    _write_key(files["key"], key)
    return files


def webhook_args(files: Mapping[str, Path], port: int) -> tuple[str, ...]:
    """The operator's flags for certificate mode (the chart's cert-manager mode) on ``port``."""
    return ("--webhook-port", str(port), "--webhook-cert", str(files["crt"]), "--webhook-key", str(files["key"]))


def url_webhook_configuration(name: str, ca: bytes, port: int, selector: Mapping[str, str]) -> dict[str, Any]:
    """The operator's own ValidatingWebhookConfiguration (admission.webhook_configuration: rules,
    failure policy, match conditions) with URL clientConfigs to 127.0.0.1:``port``, limited to
    namespaces labelled ``selector``."""
    hook = WebhookConfig(port=port, service="unused", namespace="unused", configuration=name)
    config = copy.deepcopy(webhook_configuration(hook, ca))
    paths = {hook_name: path for hook_name, _resource, path in WEBHOOKS}
    for webhook in config["webhooks"]:
        webhook["clientConfig"] = {
            "url": f"https://127.0.0.1:{port}{paths[webhook['name']]}",
            "caBundle": base64.b64encode(ca).decode("ascii"),
        }
        webhook["namespaceSelector"] = {"matchLabels": dict(selector)}
    return config


# -- the e2e suite on this machine's control plane ---------------------------------------------

#: The e2e suite's webhook configuration; it covers the namespaces the e2e tests create (labelled so).
E2E_WEBHOOK = "kubedgx-e2e-webhook"
E2E_NAMESPACE_LABEL = {"kubedgx.io/e2e": "true"}
E2E_OWNER = "tests/e2e"


def local_e2e_cluster(plane: ControlPlane, kubectl: Kubectl, workdir: Path, *,
                      values: Mapping[str, Any] | None = None, runs_containers: bool = False) -> Any:  # fmt: skip
    """tests/e2e's Cluster on this control plane: the chart's objects (rendered with ``values``),
    the operator (certificate mode, reached by the apiserver through a URL) in the cluster's
    operator slot, and a webhook configuration for the e2e namespaces. ``runs_containers``: the
    nodes are real (tests/nodes), not kwok's. Returns a Cluster, or what the cluster lacks (a str)."""
    from tests.e2e.cluster import find_cluster

    chart = install(kubectl, values)
    files = serving_certificate(workdir / "pki")
    port = free_port()
    kubeconfig = token_kubeconfig(plane, kubectl, workdir / "operator.kubeconfig", service_account(chart))

    def ensure_operator() -> None:
        if plane.slot.holds(E2E_OWNER) is None:
            plane.slot.take(E2E_OWNER, lambda: start_operator(chart, kubeconfig, workdir / "operator",
                                                              webhook_args(files, port)))  # fmt: skip

    ensure_operator()
    kubectl.apply(url_webhook_configuration(E2E_WEBHOOK, files["ca"].read_bytes(), port, E2E_NAMESPACE_LABEL))
    return find_cluster(kubectl, runs_containers=runs_containers, ensure_operator=ensure_operator)
