"""The control plane as session fixtures, shared by the cluster suite (tests/cluster) and the e2e
suite when it runs on this machine (tests/e2e, ``KUBEDGX_E2E_CONTEXT`` unset or ``local``): one
control plane per test session, started the first time a test asks for it.

Registered for the whole tree by tests/conftest.py. Where this machine has no Go toolchain the
tests that need it skip with that reason; where it has one, a failed build or start is an error of
every test that needs the cluster, with the reason and the components' logs.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

from tests.cluster.controlplane import CONTEXT, ControlPlane, StartError, UnavailableError, build
from tests.e2e.kubectl import Kubectl

#: Keep the control plane's directory (certificates, logs, etcd) after the session.
KEEP_ENV = "KUBEDGX_CLUSTER_KEEP"


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    try:
        binaries = build(out=sys.stderr)
    except UnavailableError as exc:
        pytest.skip(str(exc))
    except StartError as exc:
        pytest.fail(f"the control plane could not be built: {exc}", pytrace=False)
    root = tmp_path_factory.mktemp("control-plane")
    plane = ControlPlane(root, binaries)
    try:
        plane.start()
    except StartError as exc:
        pytest.fail(f"the control plane did not start: {exc}", pytrace=False)
    print(f"\ncontrol plane up in {plane.started_in:.1f}s: Kubernetes {binaries.kubernetes_version}, {root}",
          file=sys.stderr)  # fmt: skip
    yield plane
    plane.slot.release()
    plane.stop()
    if os.environ.get(KEEP_ENV) == "1":
        print(f"kubedgx cluster: kept {root} ({KEEP_ENV}=1)", file=sys.stderr)


@pytest.fixture(scope="session")
def admin_kubectl(control_plane: ControlPlane) -> Kubectl:
    """kubectl (the one built with the control plane) as the cluster's admin."""
    return Kubectl(CONTEXT, binary=control_plane.kubectl_binary, kubeconfig=str(control_plane.kubeconfig))
