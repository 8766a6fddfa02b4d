"""Flyte's real propeller against the tests' control plane, with the kubedgx connector.

What a Flyte deployment runs, minus flyteadmin and datacatalog (the Go module proxy serves neither):

- **propeller** v1.16.8, built from its Go modules by ``tests/cluster/build.sh flytepropeller``
  (tests/cluster/gomod/flytepropeller), as a local process with the cluster admin's kubeconfig. It
  creates its FlyteWorkflow CRD itself. Its configuration is the test environment's (blob store,
  event sink, timings) plus **docs/flyte.md's propeller block as written** (the ``tasks:`` and
  ``plugins.connector-service:`` an admin copies), with only the connector's endpoint replaced.
- **the connector**: ``pyflyte serve connector`` (tests/cluster/flyte_connector_server.py).
- **the blob store**: moto's S3 (tests/s3.py) for propeller, the pods and the connector.
- **admin's event API**: tests/cluster/flyte_admin.py's fake, which stores events by admin's rules
  (``event.type: admin``), so tests read what Flyte would show.

Workflows reach propeller as FlyteWorkflow objects (tests/cluster/flyte_workflows.py). Pods run
through the stand-in kubelet (tests/cluster/flyte_kubelet.py) on kwok nodes: the DGX workers on
the fake DGX nodes, propeller's own pods (plain ``@task``s) on an untainted CPU node.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.controlplane import CONTEXT, KWOK_MANAGED, KWOK_NODE_ANNOTATION, ControlPlane, stop_process_group
from tests.conftest import ROOT
from tests.e2e.kubectl import Kubectl, dig, wait_for
from tests.s3 import ACCESS_KEY, REGION, S3, SECRET_KEY
from tests.support.ports import free_port

BUILD_SH = ROOT / "tests" / "cluster" / "build.sh"
DOCS = ROOT / "docs" / "flyte.md"
#: The HTML comment that marks docs/flyte.md's propeller block (the next ```yaml fence).
DOCS_MARKER = "<!-- propeller-config:"
#: The HTML comment that marks docs/flyte.md's ClusterRole for the connector.
RBAC_MARKER = "<!-- connector-rbac:"
#: Where the connector's ServiceAccount lives in the tests.
CONNECTOR_NAMESPACE, CONNECTOR_ACCOUNT = "kubedgx-flyte", "kubedgx-flyte-connector"
#: The FlyteWorkflow CRD propeller creates (and the resource kubectl names).
FLYTEWORKFLOWS = "flyteworkflows.flyte.lyft.com"
#: Propeller's finalizer on every workflow it runs.
FINALIZER = "flyte.org/finalizer"
#: The untainted node propeller's own pods (plain @task) run on.
CPU_NODE = "flyte-cpu-0"
#: How long compiling propeller may take (cold: minutes).
BUILD_TIMEOUT = 1200
#: The connector's own lifetime (``--timeout``): it outlives a module, and stops by itself.
CONNECTOR_LIFETIME = 1800
#: FlyteWorkflow phases (``.status.phase``, flytepropeller/pkg/apis/flyteworkflow/v1alpha1/iface.go).
WF_PHASES = {0: "Ready", 1: "Running", 2: "Succeeding", 3: "Success", 4: "Failing", 5: "Failed", 6: "Aborted",
             7: "HandlingFailureNode", 8: "Aborting"}  # fmt: skip


def flyte_bin_dir() -> Path:
    """The flyte bin dir (flytepropeller, kubectl-flyte), built or reused; skips without Go."""
    if shutil.which("go") is None:
        pytest.skip(
            "no Go toolchain on PATH: propeller is built from its Go modules (tests/cluster/build.sh flytepropeller)"
        )
    done = subprocess.run(["bash", str(BUILD_SH), "flytepropeller"], capture_output=True, text=True,
                          timeout=BUILD_TIMEOUT, check=False)  # fmt: skip
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-40:])
        raise AssertionError(f"tests/cluster/build.sh flytepropeller exited {done.returncode}:\n{tail}")
    return Path(done.stdout.strip().splitlines()[-1])


def _docs_block(marker: str, text: str | None) -> dict[str, Any]:
    text = DOCS.read_text(encoding="utf-8") if text is None else text
    at = text.find(marker)
    if at < 0:
        raise AssertionError(f"docs/flyte.md has no {marker!r} block")
    match = re.search(r"```yaml\n(.*?)```", text[at:], re.S)
    if match is None:
        raise AssertionError(f"docs/flyte.md's {marker!r} marker is not followed by a ```yaml block")
    block = yaml.safe_load(match.group(1))
    if not isinstance(block, dict):
        raise AssertionError(f"docs/flyte.md's {marker!r} block is not a YAML mapping")
    return block


def docs_config(text: str | None = None) -> dict[str, Any]:
    """docs/flyte.md's propeller block (``tasks:`` and ``plugins:``), parsed."""
    return _docs_block(DOCS_MARKER, text)


def docs_rbac(text: str | None = None) -> dict[str, Any]:
    """docs/flyte.md's ClusterRole for the connector, parsed."""
    return _docs_block(RBAC_MARKER, text)


def connector_kubeconfig(control_plane: ControlPlane, kubectl: Kubectl, workdir: Path) -> Path:
    """A kubeconfig for the connector as a ServiceAccount bound (cluster-wide) to docs/flyte.md's
    ClusterRole and nothing else: what the docs tell admins to give it is what the tests run with."""
    role = docs_rbac()
    kubectl.apply(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": CONNECTOR_NAMESPACE}},
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": CONNECTOR_ACCOUNT, "namespace": CONNECTOR_NAMESPACE}},
        role,
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": CONNECTOR_ACCOUNT},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role["metadata"]["name"]},
         "subjects": [{"kind": "ServiceAccount", "name": CONNECTOR_ACCOUNT, "namespace": CONNECTOR_NAMESPACE}]},
    )  # fmt: skip
    token = kubectl.run("create", "token", CONNECTOR_ACCOUNT, "-n", CONNECTOR_NAMESPACE, "--duration=3h").stdout.strip()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CONTEXT, "cluster": {"server": control_plane.server,
                                                   "certificate-authority": str(control_plane.pki.ca_crt)}}],
        "users": [{"name": CONNECTOR_ACCOUNT, "user": {"token": token}}],
        "contexts": [{"name": CONTEXT, "context": {"cluster": CONTEXT, "user": CONNECTOR_ACCOUNT}}],
        "current-context": CONTEXT,
    }  # fmt: skip
    path = workdir / "connector.kubeconfig"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def flyte_keys(s3: S3) -> dict[str, str]:
    """flytekit's own blob-store settings: moto's endpoint and keys (what propeller's pods and the
    DGX workers get, the latter through the connector's KUBEDGX_FLYTE_WORKER_ENV_*)."""
    return {"FLYTE_AWS_ENDPOINT": s3.endpoint, "FLYTE_AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "FLYTE_AWS_SECRET_ACCESS_KEY": SECRET_KEY}  # fmt: skip


def blob_env(s3: S3) -> dict[str, str]:
    """The blob-store settings of a process here (the connector, a stand-in kubelet's pods): flytekit's,
    and no instance-metadata probe."""
    return flyte_keys(s3) | {"AWS_EC2_METADATA_DISABLED": "true"}


def propeller_config(
    *, kubeconfig: Path, admin_endpoint: str, connector_endpoint: str, s3: S3, bucket: str, prof_port: int
) -> dict[str, Any]:
    """The whole configuration: the test environment, then the docs' block with the test's endpoint."""
    docs = docs_config()
    docs["plugins"]["connector-service"]["defaultConnector"]["endpoint"] = connector_endpoint
    pod_env = flyte_keys(s3) | {"FLYTE_SDK_RICH_TRACEBACKS": "0"}
    config: dict[str, Any] = {
        "propeller": {
            "kube-config": str(kubeconfig),
            "create-flyteworkflow-crd": True,
            "enable-admin-launcher": False,
            "limit-namespace": "all",
            "workers": 4,
            "workflow-reeval-duration": "2s",
            "downstream-eval-duration": "2s",
            "max-workflow-retries": 3,
            "metadata-prefix": "metadata/propeller",
            "rawoutput-prefix": f"s3://{bucket}/raw",
            "prof-port": prof_port,
            "cluster-id": "kubedgx-test",
            "leader-election": {"enabled": False},
        },
        "catalog-cache": {"type": "noop"},
        "event": {"type": "admin", "rate": 500, "capacity": 1000},
        "admin": {"endpoint": f"dns:///{admin_endpoint}", "insecure": True},
        "storage": {
            "type": "minio",
            "container": bucket,
            "connection": {
                "endpoint": s3.endpoint,
                "auth-type": "accesskey",
                "access-key": ACCESS_KEY,
                "secret-key": SECRET_KEY,
                "region": REGION,
                "disable-ssl": True,
            },
            "limits": {"maxDownloadMBs": 10},
        },
        "logger": {"level": 4, "show-source": True},
        **{k: v for k, v in docs.items() if k != "plugins"},
        "plugins": {
            **docs["plugins"],
            "k8s": {
                "default-env-vars": [{k: v} for k, v in pod_env.items()],
                "default-cpus": "100m",
                "default-memory": "128Mi",
            },
        },
    }
    return config


class Propeller:
    """The propeller process: its log, readiness, and stop."""

    def __init__(self, binary: Path, config_path: Path, log_path: Path) -> None:
        self.binary, self.config_path, self.log_path = binary, config_path, log_path
        self.process: subprocess.Popen[bytes] | None = None
        self.started_in = 0.0

    def tail(self, lines: int = 60) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def validate(self) -> None:
        """``config validate --strict``: the controller itself loads its config leniently and would
        ignore a misspelt key."""
        done = subprocess.run([str(self.binary), "config", "--file", str(self.config_path), "validate", "--strict"],
                              capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
        if done.returncode != 0:
            raise AssertionError(f"propeller refused its configuration:\n{(done.stdout + done.stderr)[-3000:]}")

    def start(self, k: Kubectl) -> None:
        t0 = time.monotonic()
        env = {k_: v for k_, v in os.environ.items() if not k_.startswith(("AWS_", "FLYTE_", "KUBECONFIG"))}
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen([str(self.binary), "--config", str(self.config_path)], stdout=log,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                            start_new_session=True)  # fmt: skip

        def crd_established() -> bool:
            self.check_alive()
            crd = k.get("crd", FLYTEWORKFLOWS)
            return any(c.get("type") == "Established" and c.get("status") == "True"
                       for c in dig(crd or {}, "status", "conditions") or [])  # fmt: skip

        wait_for("propeller to create the FlyteWorkflow CRD", crd_established, timeout=120, interval=0.3,
                 diagnose=self.tail)  # fmt: skip
        self.started_in = time.monotonic() - t0

    def check_alive(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise AssertionError(f"propeller exited {self.process.returncode}:\n{self.tail()}")

    def stop(self) -> None:
        if self.process is not None:
            stop_process_group(self.process, timeout=15)


def cpu_node(name: str = CPU_NODE) -> dict[str, Any]:
    """An untainted kwok node for propeller's own pods (every fake DGX node carries the GPU taint)."""
    capacity = {"cpu": "16", "memory": "64Gi", "pods": "110", "ephemeral-storage": "1Ti"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "type": "kwok"},
            "annotations": {KWOK_NODE_ANNOTATION: KWOK_MANAGED},
        },
        "spec": {"taints": []},
        "status": {"capacity": capacity, "allocatable": capacity},
    }


@dataclass
class FlyteBackend:
    """Everything a Flyte execution needs here: bucket, fake admin, connector, propeller."""

    bin_dir: Path
    s3: S3
    bucket: str
    admin: Any  # tests.cluster.flyte_admin.FakeAdmin
    connector: Any  # tests.cluster.flyte_connector_server.Connector
    propeller: Propeller
    workdir: Path

    @property
    def kubectl_flyte(self) -> Path:
        return self.bin_dir / "kubectl-flyte"

    def blob_env(self) -> dict[str, str]:
        """The blob-store settings flytekit reads (the pods', the connector's)."""
        return blob_env(self.s3)

    def diagnose(self) -> str:
        return (f"--- propeller\n{self.propeller.tail(80)}\n--- connector\n{self.connector.tail(40)}\n"
                f"--- events\n{self.admin.dump()}")  # fmt: skip


@contextmanager
def flyte_backend(
    control_plane: ControlPlane,
    kubectl: Kubectl,
    s3: S3,
    workdir: Path,
    *,
    connector_env: dict[str, str] | None = None,
) -> Iterator[FlyteBackend]:
    """Start the four (and the CPU node), yield them, stop them. ``connector_env`` adds to the
    connector's environment (its blob-store credentials are there unless overridden)."""
    from tests.cluster.flyte_admin import FakeAdmin
    from tests.cluster.flyte_connector_server import serve

    bin_dir = flyte_bin_dir()
    bucket = s3.bucket("flyte")
    control_plane.add_nodes([cpu_node()])
    with ExitStack() as stack:
        # The node goes with the backend: kwok calls any pod on it Running, so a later module's pods
        # (another worker's runner, say) scheduled there would look started without running.
        stack.callback(kubectl.run, "delete", "node", CPU_NODE, "--wait=false", "--ignore-not-found", check=False)
        admin = stack.enter_context(FakeAdmin())
        # The connector's own blob-store access, and the workers' (set in every worker by the connector).
        env = blob_env(s3) | {f"KUBEDGX_FLYTE_WORKER_ENV_{k}": v for k, v in flyte_keys(s3).items()}
        env["KUBEDGX_FLYTE_DEFAULT_INSTANCE"] = "dgxh100.80g.8.norm"
        # Least privilege, as the docs grant it: a missing permission fails a scenario (or shows as a
        # refusal in the connector's log, which test_flyte_propeller.py checks).
        env["KUBEDGX_FLYTE_KUBECONFIG"] = str(connector_kubeconfig(control_plane, kubectl, workdir))
        env |= connector_env or {}
        connector = stack.enter_context(serve(control_plane, workdir, lifetime=CONNECTOR_LIFETIME, env=env))
        config = propeller_config(kubeconfig=control_plane.kubeconfig, admin_endpoint=admin.endpoint,
                                  connector_endpoint=f"127.0.0.1:{connector.port}", s3=s3, bucket=bucket,
                                  prof_port=free_port())  # fmt: skip
        config_path = workdir / "propeller.yaml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        propeller = Propeller(bin_dir / "flytepropeller", config_path, workdir / "propeller.log")
        propeller.validate()
        stack.callback(propeller.stop)
        propeller.start(kubectl)
        print(f"propeller {propeller.binary} started in {propeller.started_in:.1f}s")
        yield FlyteBackend(bin_dir, s3, bucket, admin, connector, propeller, workdir)


def workflow_phase(k: Kubectl, name: str) -> str | None:
    """The FlyteWorkflow's phase by name (None once it is gone)."""
    obj = k.get(FLYTEWORKFLOWS, name)
    if obj is None:
        return None
    return WF_PHASES.get(int(dig(obj, "status", "phase") or 0), str(dig(obj, "status", "phase")))


def strip_finalizers(k: Kubectl) -> None:
    """Release leftover workflows of a namespace whose propeller is gone (its finalizer would hold them)."""
    for obj in k.select(FLYTEWORKFLOWS):
        if FINALIZER in (obj["metadata"].get("finalizers") or []):
            k.run("patch", FLYTEWORKFLOWS, obj["metadata"]["name"], "--type", "merge", "-p",
                  '{"metadata": {"finalizers": null}}', check=False)  # fmt: skip
