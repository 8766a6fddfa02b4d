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
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest

from tests.cluster.controlplane import (
    CONTEXT,
    DEFAULT_POOLS,
    Binaries,
    ControlPlane,
    NodePool,
    StartError,
    UnavailableError,
    build,
)
from tests.e2e.kubectl import Kubectl

#: Keep the control plane's directory (certificates, logs, etcd) after the session.
KEEP_ENV = "KUBEDGX_CLUSTER_KEEP"

#: The build's outcome once the first test that needs it came up (see pytest_runtest_protocol).
_built: Binaries | UnavailableError | StartError | None = None


def _needs_cluster(item: pytest.Item) -> bool:
    names = getattr(item, "fixturenames", ())
    if "control_plane" in names:
        return True
    if "cluster" in names:  # the e2e suite, on this machine's control plane when no context is named
        from tests.e2e.cluster import verdict

        return verdict().local
    return False


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[object]:
    """Build (or reuse) the binaries right before the first test that needs them, outside that
    test's timeout (this wrapper runs before pytest-timeout's): a cold build takes minutes and
    belongs to no test. Not at collection: under pytest-xdist every worker would then wait for the
    build before running anything, while most tests need no Go binary at all. A build that .ci/run
    started in the background holds the cache's lock; this waits on it and then reuses what it
    built."""
    global _built
    if _built is None and _needs_cluster(item):
        try:
            _built = build(out=sys.stderr)
        except (UnavailableError, StartError) as exc:
            _built = exc
    return (yield)


def started_control_plane(
    tmp_path_factory: pytest.TempPathFactory,
    name: str = "control-plane",
    *,
    pools: Sequence[NodePool] = DEFAULT_POOLS,
    scheduler_config: Mapping[str, Any] | None = None,
) -> Iterator[ControlPlane]:
    """A control plane of the built binaries under a fresh directory, stopped after: the session's
    (``control_plane``), or a module's own (tests/cluster/test_resilience.py; test_sharing.py with its
    own nodes and scheduler configuration). Skips without Go; fails with the reason and the logs when
    the build or the start failed."""
    outcome: Binaries | UnavailableError | StartError
    if _built is not None:
        outcome = _built
    else:
        try:
            outcome = build(out=sys.stderr)
        except (UnavailableError, StartError) as exc:
            outcome = exc
    if isinstance(outcome, UnavailableError):
        pytest.skip(str(outcome))
    if isinstance(outcome, StartError):
        pytest.fail(f"the control plane could not be built: {outcome}", pytrace=False)
    binaries = outcome
    root = tmp_path_factory.mktemp(name)
    plane = ControlPlane(root, binaries, pools=pools, scheduler_config=scheduler_config)
    try:
        plane.start()
    except StartError as exc:
        pytest.fail(f"the control plane did not start: {exc}", pytrace=False)
    print(f"\ncontrol plane up in {plane.started_in:.1f}s: Kubernetes {binaries.kubernetes_version}, {root}",
          file=sys.stderr)  # fmt: skip
    try:
        yield plane
    finally:
        plane.slot.release()
        plane.stop()
        if os.environ.get(KEEP_ENV) == "1":
            print(f"kubedgx cluster: kept {root} ({KEEP_ENV}=1)", file=sys.stderr)


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    yield from started_control_plane(tmp_path_factory)


@pytest.fixture(scope="session")
def admin_kubectl(control_plane: ControlPlane) -> Kubectl:
    """kubectl (the one built with the control plane) as the cluster's admin."""
    return Kubectl(CONTEXT, binary=control_plane.kubectl_binary, kubeconfig=str(control_plane.kubeconfig))
