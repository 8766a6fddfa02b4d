"""The cluster under test: whether to use it at all, what it must have, and per-test namespaces.

Whether the cluster tests run, and where (every step is local until the last, which asks the API
server):

0. ``KUBEDGX_E2E_CONTEXT=local``, or no context at all (neither that variable nor a current context
   in kubectl's config)                                 -> run on this machine's own control plane
                                                           (tests/cluster: built from Go modules,
                                                           kwok's fake DGX nodes, the operator as a
                                                           local process); skip where there is no Go
1. no kubectl on PATH                                   -> skip
2. (a context is named or current: the cluster behind it)
3. the context is not a test context (``kind-*`` or one listed in ``KUBEDGX_E2E_CONTEXTS``)
                                                        -> skip, never contacted; with
                                                           KUBEDGX_E2E=1 the run is REFUSED
4. the API server does not answer /readyz within 3 s    -> skip (never more than 5 s spent)
5. KUBEDGX_E2E is not 1                                 -> skip (a reachable kind cluster is not
                                                           consent to run these tests on it)
6. run.

With ``KUBEDGX_E2E=1`` (what ``bash tests/e2e/run.sh`` sets) every one of those skips is an error
instead: whoever asked for the e2e tests must not get a green run that tested nothing. The tests
of ``test_manifests.py`` need no cluster and always run.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from dgx_operator.catalog import Instance
from tests.e2e.fakegpu import GPU_RESOURCE, instance
from tests.e2e.jobs import INSTANCE, NAMESPACE_TIMEOUT, describe
from tests.e2e.kubectl import JOBS, MOUNTS, Kubectl, KubectlError, dig, kubectl_binary, wait_for
from tests.support.wait import WaitTimeoutError

E2E_ENV = "KUBEDGX_E2E"
#: KUBEDGX_E2E_CONTEXT's value for this machine's own control plane.
LOCAL = "local"
CONTEXT_ENV = "KUBEDGX_E2E_CONTEXT"
CONTEXTS_ENV = "KUBEDGX_E2E_CONTEXTS"
KEEP_ENV = "KUBEDGX_E2E_KEEP_NAMESPACES"
PROBE_SECONDS = 3
NO_FINALIZERS = '{"metadata": {"finalizers": null}}'


def wanted() -> bool:
    return os.environ.get(E2E_ENV) == "1"


def listed_contexts() -> set[str]:
    return {c for c in re.split(r"[,\s]+", os.environ.get(CONTEXTS_ENV, "")) if c}


def is_test_context(context: str) -> bool:
    """The safety net: only throwaway clusters. kind names its contexts kind-<cluster>."""
    return context.startswith("kind-") or context in listed_contexts()


@dataclass(frozen=True)
class Verdict:
    run: bool
    reason: str = ""
    context: str | None = None
    refuse: bool = False
    #: Run on this machine's own control plane (tests/cluster).
    local: bool = False


def _current_context(binary: str) -> str | None:
    try:
        proc = subprocess.run(
            [binary, "config", "current-context"], capture_output=True, text=True, timeout=5, check=False
        )
    except subprocess.TimeoutExpired:
        return None
    return (proc.stdout.strip() or None) if proc.returncode == 0 else None


def _api_answers(binary: str, context: str) -> str | None:
    """None when the API server answers /readyz; else why not."""
    try:
        proc = subprocess.run(
            [binary, "--context", context, f"--request-timeout={PROBE_SECONDS}s", "get", "--raw", "/readyz"],
            capture_output=True,
            text=True,
            timeout=PROBE_SECONDS + 2,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return "no answer"
    if proc.returncode == 0:
        return None
    lines = (proc.stderr or proc.stdout).strip().splitlines()
    return lines[-1] if lines else f"kubectl exited {proc.returncode}"


@cache
def verdict() -> Verdict:
    """Decided once per session; see the module docstring."""
    named = os.environ.get(CONTEXT_ENV)
    if named == LOCAL:
        return Verdict(True, local=True)
    binary = kubectl_binary()
    context = named or (_current_context(binary) if binary else None)
    if not context:
        return Verdict(True, local=True)
    if binary is None:
        return Verdict(False, "no Kubernetes cluster to test against: kubectl is not on PATH")
    if not is_test_context(context):
        rule = f"only kind-* contexts or those listed in {CONTEXTS_ENV} are test clusters"
        if wanted():
            return Verdict(
                False,
                f"REFUSED: {E2E_ENV}=1 but context {context!r} is not a test context ({rule}). The e2e tests "
                "create and delete namespaces, jobs and pods, so they run only on throwaway clusters: point "
                f"{CONTEXT_ENV} at a kind cluster, or list the context in {CONTEXTS_ENV} if it is one",
                context,
                refuse=True,
            )
        return Verdict(
            False,
            f"context {context!r} is not a test context ({rule}); not contacted ({CONTEXT_ENV}={LOCAL} runs the "
            "e2e tests on this machine's own control plane)",
            context,
        )
    problem = _api_answers(binary, context)
    if problem is not None:
        return Verdict(
            False,
            f"the API server of context {context!r} is not reachable (waited up to {PROBE_SECONDS} s): {problem}",
            context,
        )
    if not wanted():
        return Verdict(
            False,
            f"context {context!r} answers, but {E2E_ENV} is not 1: set {E2E_ENV}=1 to run the e2e tests against it "
            f"(bash tests/e2e/run.sh does), or {CONTEXT_ENV}={LOCAL} for this machine's own control plane",
            context,
        )
    return Verdict(True, context=context)


@dataclass(frozen=True)
class Cluster:
    """The cluster under test, as the session found it."""

    kubectl: Kubectl
    instance: Instance
    #: Nodes that pass for ``instance`` (labels, allocatable GPUs, schedulable).
    gpu_nodes: tuple[str, ...]
    #: ValidatingWebhookConfigurations with a webhook for kubedgx.io.
    webhooks: tuple[str, ...] = field(default=())
    #: Whether the nodes run containers (kind's kubelets do; kwok's fake nodes only play pod states).
    runs_containers: bool = True
    #: On this machine's control plane: makes sure the e2e suite's operator holds the cluster's one
    #: operator slot (a cluster-suite module may have taken it); None elsewhere (the chart's runs).
    ensure_operator: Callable[[], None] | None = None


def _tolerated(taint: dict[str, Any], inst: Instance) -> bool:
    """Whether the workers of ``inst`` tolerate ``taint`` (PreferNoSchedule never keeps them off)."""
    if taint.get("effect") == "PreferNoSchedule":
        return True
    for tol in inst.tolerations:
        if tol.get("effect") not in (None, "", taint.get("effect")):
            continue
        if tol.get("operator") == "Exists" and tol.get("key") in (None, "", taint.get("key")):
            return True
        if tol.get("key") == taint.get("key") and str(tol.get("value") or "") == str(taint.get("value") or ""):
            return True
    return False


def _gpu_nodes(k: Kubectl, inst: Instance) -> tuple[str, ...]:
    found = []
    for node in k.select("nodes"):
        labels = dig(node, "metadata", "labels", default={}) or {}
        allocatable = str(dig(node, "status", "allocatable", GPU_RESOURCE, default="0"))
        taints = dig(node, "spec", "taints", default=[]) or []
        if (
            labels.get(inst.labels.product) in inst.products
            and labels.get(inst.labels.count) == str(inst.gpus)
            and all(labels.get(key) == value for key, value in inst.node_selector.items())
            and allocatable.isdigit()
            and int(allocatable) >= inst.gpus
            and not dig(node, "spec", "unschedulable")
            and all(_tolerated(t, inst) for t in taints)
        ):
            found.append(str(dig(node, "metadata", "name")))
    return tuple(sorted(found))


def _kubedgx_webhooks(k: Kubectl) -> tuple[str, ...]:
    names = []
    for config in k.select("validatingwebhookconfigurations"):
        for hook in config.get("webhooks") or []:
            if any("kubedgx.io" in (rule.get("apiGroups") or []) for rule in hook.get("rules") or []):
                names.append(f"{dig(config, 'metadata', 'name')}/{hook.get('name')}")
    return tuple(names)


def find_cluster(context: str | Kubectl, **extra: Any) -> Cluster | str:
    """The cluster under test, or what it lacks (kubedgx not installed, no fake GPU nodes)."""
    k = context if isinstance(context, Kubectl) else Kubectl(context)
    context = k.context
    for crd in (JOBS, MOUNTS):
        if k.get("customresourcedefinition", crd) is None:
            return f"kubedgx is not installed on {context}: no CRD {crd} (bash tests/e2e/run.sh installs the chart)"
    inst = instance(INSTANCE)
    nodes = _gpu_nodes(k, inst)
    if not nodes:
        return (
            f"no node of {context} passes for a {inst.name} node (labels from `python -m tests.e2e.fakegpu labels "
            f"{inst.name}`, allocatable {GPU_RESOURCE} >= {inst.gpus}); run.sh fakes them, see tests/e2e/README.md"
        )
    return Cluster(kubectl=k, instance=inst, gpu_nodes=nodes, webhooks=_kubedgx_webhooks(k), **extra)


def namespace_name(test_name: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", test_name.lower().removeprefix("test_")).strip("-")[:40].strip("-")
    return f"e2e-{slug}-{secrets.token_hex(3)}"


#: What a test's namespace must have lost before the next test starts: whatever acts beyond the
#: namespace while it exists. Pods hold nodes and GPUs; kubedgx's kinds are watched by the one
#: operator (a budget or limit counts for the namespace's jobs, a mount for its store); Kueue's
#: Workloads hold their ClusterQueue's quota (a Workload left in a terminating namespace kept a later
#: test's Workload from being admitted). Kinds the control plane does not serve are left out.
LEFTOVERS = ("pods", JOBS, MOUNTS, "dgxbudgets.kubedgx.io", "dgxlimits.kubedgx.io", "workloads.kueue.x-k8s.io")


def _served(kn: Kubectl, kinds: tuple[str, ...]) -> tuple[str, ...]:
    """``kinds`` less those the apiserver does not serve (a module without kubedgx's or Kueue's CRDs):
    one request when all are served, one per kind otherwise."""
    both = kn.run("get", ",".join(kinds), "-o", "name", "--ignore-not-found", check=False)
    if both.returncode == 0 or "doesn't have a resource type" not in both.stderr:
        return kinds
    unserved = "doesn't have a resource type"
    return tuple(kind for kind in kinds if unserved not in kn.run("get", kind, "-o", "name", check=False).stderr)


def delete_namespace(k: Kubectl, name: str, *, timeout: float = NAMESPACE_TIMEOUT) -> None:
    """Delete the test's objects that act beyond its namespace (:data:`LEFTOVERS`), then the
    namespace, and wait until none of them is left in it: the jobs' finalizers released by the
    operator, their pods stopped (their GPUs free for the next test), Kueue's quota given back. If that
    does not happen, strip kubedgx's finalizers so the cluster is usable, and fail: the operator did
    not do its job.

    The namespace object itself is not waited for: the namespace controller starts on a deleted
    namespace only 5 s after the deletion (a fixed grace for HA apiservers) and looks again after half
    its pods' grace period, so a test's namespace outlives its content by 5 to 16 s, which was most
    of a cluster test's teardown. Deleting the objects first (as their user would) has the operator
    release them at once, in the state each test left them. That a namespace holding a running job
    and a mount does go away is tests/e2e/test_cleanup.py's."""
    kn = k.in_namespace(name)
    served = _served(kn, LEFTOVERS)
    kinds = ",".join(served)
    owned = ",".join(kind for kind in served if kind != "pods") or "pods"
    kn.run("delete", owned, "--all", "--wait=false", "--ignore-not-found", check=False)
    k.run("delete", "namespace", name, "--wait=false", "--ignore-not-found")

    def emptied() -> bool:
        done = kn.run("get", kinds, "-o", "name", "--ignore-not-found", check=False)
        return done.returncode == 0 and not done.stdout.strip()

    try:
        wait_for(f"namespace {name} emptied of {kinds}", emptied, timeout=timeout, interval=0.3,
                 diagnose=lambda: describe(kn))  # fmt: skip
    except WaitTimeoutError as exc:
        stuck = []
        for kind in served:
            if kind == "pods":
                continue
            try:
                objects = kn.select(kind)
            except KubectlError:
                continue
            for obj in objects:
                if dig(obj, "metadata", "finalizers"):
                    obj_name = dig(obj, "metadata", "name")
                    stuck.append(f"{kind}/{obj_name} {dig(obj, 'metadata', 'finalizers')}")
                    kn.run("patch", kind, obj_name, "--type", "merge", "-p", NO_FINALIZERS, check=False)
        raise AssertionError(
            f"namespace {name} still held some of {kinds} after {timeout:.0f}s; objects holding finalizers "
            f"(now stripped so the cluster stays usable): {stuck or 'none'}\n{exc}"
        ) from None
