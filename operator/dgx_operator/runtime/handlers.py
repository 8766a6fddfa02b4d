"""kopf wiring, and nothing else: every decorator is a few lines that hand over to the one
reconcile path (:class:`dgx_operator.controllers.job.Controller`) or to the shared validator.

Every handler is ``async``: kopf runs plain functions in a thread pool, away from the event loop
that the controller's tasks live on.

Why event handlers rather than on.create/on.update/on.delete: kopf's change-detecting handlers
persist a diff base (and progress) in annotations, i.e. extra writes for every job, and a
level-triggered reconcile needs none of that. The controller manages the job's finalizer itself.
"""

from __future__ import annotations

import logging
import os
from typing import Any, cast

import kopf

from dgx_operator.api.crdgen import BUDGETS, DATA_MOUNTS, TRAINING_JOBS
from dgx_operator.api.trainingjob import KIND
from dgx_operator.api.vocabulary import JobPhase
from dgx_operator.controllers import ledger, metrics
from dgx_operator.controllers.budget import BudgetController
from dgx_operator.controllers.job import Controller, KueueSettings
from dgx_operator.controllers.loop import ReconcileLoop
from dgx_operator.controllers.metrics import Metrics
from dgx_operator.controllers.mount import MountController
from dgx_operator.kube import Kube, credentials, login_info
from dgx_operator.reconcile.pods import PodView
from dgx_operator.reconcile.queueing import GROUP as KUEUE
from dgx_operator.reconcile.queueing import Flavor, slim_workload
from dgx_operator.render.names import JOB_LABEL
from dgx_operator.runtime import priorities
from dgx_operator.runtime.leader import ElectionConfig, LeaderElector
from dgx_operator.runtime.settings import OperatorConfig, configure
from dgx_operator.validation.validator import Validator
from dgx_operator.webhook import admission

log = logging.getLogger(__name__)

JOB = TRAINING_JOBS.resource
MOUNT = DATA_MOUNTS.resource
BUDGET = BUDGETS.resource
OURS = {JOB_LABEL: kopf.PRESENT}


def post_event(body: Any, type_: str, reason: str, message: str) -> None:
    kopf.event(cast(kopf.Body, body), type=type_, reason=reason, message=message)


@kopf.on.startup()
async def startup(
    settings: kopf.OperatorSettings,
    memo: Any,
    pods_by_job: Any = None,
    services: Any = None,
    config_maps: Any = None,
    workloads_by_job: Any = None,
    resource_flavors: Any = None,
    **_: Any,
) -> None:
    config: OperatorConfig = memo.get("config") or OperatorConfig.from_env()
    memo.config = config
    configure(settings, config)
    # With leader election a replica starts as a stand-by: its leader gauge and phase gauges say so.
    memo.metrics = Metrics(leader=config.leader_election is None)
    kube = await Kube.connect(credentials(settings))
    kube.on_error = memo.metrics.api_error
    memo.kube = kube
    # PriorityClasses the cluster lacks are dropped, with a WARNING, so no worker is refused (priorities.py).
    config = memo.config = await priorities.checked(config, kube)
    if config.webhook is not None:
        memo.webhook = await admission.setup(config.webhook, kube, config.retry_base, config.namespaces)
        settings.admission.server = memo.webhook.server
    catalog = config.catalog()
    for note in catalog.pricing_notes():  # no price is never a price of 0: say where one is missing
        log.warning("%s", note)
    memo.metrics.prices(catalog)
    memo.validator = Validator(catalog, defaults=config.defaults())
    memo.controller = Controller(
        kube=kube,
        catalog=catalog,
        defaults=config.defaults(),
        pods_of=lambda ns, name: list(pods_by_job.get((ns, name), [])),
        has_service=lambda ns, name: (ns, name) in services,
        config_maps_of=lambda ns, name: list(config_maps.get((ns, name), [])),
        post_event=post_event,
        retry_base=config.retry_base,
        metrics=memo.metrics,
        progress_interval=config.progress_interval,
        status_interval=config.status_interval,
        usage_interval=config.usage_interval,
        cluster_limits=config.limits,
        limits_of=kube.get_limits,
        budgets_of=lambda namespace: ledger.read(kube, namespace),
    )
    if config.kueue:
        memo.controller.kueue = KueueSettings(manage_without_queue_name=config.kueue_manage_without_queue_name)
        if workloads_by_job is not None:
            memo.controller.workloads_of = lambda ns, name: list(workloads_by_job.get((ns, name), []))
        if resource_flavors is not None:
            memo.controller.flavors_of = lambda: {k: next(iter(v)) for k, v in resource_flavors.items() if v}
    memo.budgets = BudgetController(
        kube=kube,
        catalog=catalog,
        wake_jobs=memo.controller.wake_budget_held,
        retry_base=config.retry_base,
        metrics=memo.metrics,
    )
    memo.mounts = MountController(
        kube=kube,
        post_event=post_event,
        retry_base=config.retry_base,
        metrics=memo.metrics,
        ca_bundle=config.ca_bundle,
    )
    if config.metrics_port:
        try:
            memo.metrics_server = await metrics.serve(memo.metrics, config.metrics_port, config.bind_address)
        except OSError as exc:
            raise kopf.PermanentError(f"cannot serve metrics on port {config.metrics_port}: {exc}") from exc
    if config.leader_election is not None:
        # Every replica watches and serves admission; only the Lease's holder reconciles.
        await elect(memo, kube, config.leader_election)


async def elect(memo: Any, kube: Kube, election: ElectionConfig) -> None:
    """Start campaigning; the controllers wait (noting what is dirty) until this replica leads."""
    loops: list[ReconcileLoop] = [memo.controller, memo.mounts, memo.budgets]
    for loop in loops:
        loop.leading = False

    async def lead() -> None:
        memo.metrics.leading(True)
        for loop in loops:
            loop.lead()

    async def follow() -> None:
        memo.metrics.leading(False)
        for loop in loops:
            await loop.follow()

    memo.elector = LeaderElector(kube, election, on_lead=lead, on_follow=follow)
    memo.elector.start()


@kopf.on.cleanup()
async def cleanup(memo: Any, **_: Any) -> None:
    if "elector" in memo:
        await memo.elector.release()
    if "metrics_server" in memo:
        await memo.metrics_server.cleanup()
    if "webhook" in memo:
        await memo.webhook.close()
    if "controller" in memo:
        await memo.controller.stop()
    if "mounts" in memo:
        await memo.mounts.stop()
    if "budgets" in memo:
        await memo.budgets.stop()
    if "kube" in memo:
        await memo.kube.close()


@kopf.on.login()
def login(settings: kopf.OperatorSettings, **kwargs: Any) -> kopf.ConnectionInfo | None:
    """The same credentials the operator's own client uses (kube.login_info)."""
    return login_info(settings)


@kopf.on.probe(id="jobs")
async def probe_jobs(memo: Any, **_: Any) -> int:
    """Part of the liveness endpoint's report: jobs with a reconcile in flight."""
    controller: Controller | None = memo.get("controller")
    return len(controller.dirty) if controller is not None else 0


# -- indexes: the operator's view of children, kept current by kopf's watches ----------------


@kopf.index("pods", labels=OURS)
async def pods_by_job(namespace: Any, labels: Any, body: Any, **_: Any) -> Any:
    return {(namespace, labels[JOB_LABEL]): PodView.of(body)}


@kopf.index("services", labels=OURS)
async def services(name: Any, namespace: Any, **_: Any) -> Any:
    return {(namespace, name): True}


@kopf.index("configmaps", labels=OURS)
async def config_maps(name: Any, namespace: Any, labels: Any, meta: Any, **_: Any) -> Any:
    """By job: its trainer ConfigMaps are named by content, and a superseded one is deleted."""
    owner = next((o.get("uid") for o in meta.get("ownerReferences") or [] if o.get("controller")), None)
    return {(namespace, labels[JOB_LABEL]): (name, owner)}


@kopf.index(*JOB)
async def jobs_by_mount(name: Any, namespace: Any, spec: Any, **_: Any) -> Any:
    return {(namespace, ref.get("name")): name for ref in spec.get("dataMounts") or []}


# -- triggers: all of them end in the one reconcile ------------------------------------------


@kopf.on.event(*JOB)
async def job_event(name: Any, namespace: Any, type: Any, body: Any, memo: Any, **_: Any) -> None:
    if type == "DELETED":
        memo.controller.forget(namespace, name)
    else:
        memo.controller.trigger(namespace, name)
    if type == "DELETED" or (body.get("status") or {}).get("phase") in JobPhase.TERMINAL:
        # A mount whose deletion waits for this job may go now.
        for ref in (body.get("spec") or {}).get("dataMounts") or []:
            memo.mounts.trigger(namespace, ref.get("name"))


@kopf.on.event(*BUDGET)
async def budget_event(name: Any, namespace: Any, type: Any, memo: Any, **_: Any) -> None:
    if type == "DELETED":
        memo.budgets.forget(namespace, name)
    else:
        memo.budgets.trigger(namespace, name)


@kopf.on.event("pods", labels=OURS)
async def pod_event(namespace: Any, labels: Any, memo: Any, **_: Any) -> None:
    memo.controller.trigger(namespace, labels[JOB_LABEL])


@kopf.on.event(*MOUNT)
async def mount_event(name: Any, namespace: Any, type: Any, memo: Any, jobs_by_mount: Any = None, **_: Any) -> None:
    if type == "DELETED":
        memo.mounts.forget(namespace, name)
    else:
        memo.mounts.trigger(namespace, name)
    for job in set(jobs_by_mount.get((namespace, name), [])):
        memo.controller.trigger(namespace, job)


# -- Kueue (reconcile.queueing): watched unless KUBEDGX_KUEUE=0, which the chart sets when its
# kueue.enabled value is false and it grants no RBAC on Kueue's objects. Versionless selectors:
# kopf watches the version the cluster prefers, and nothing while Kueue is not installed. --------


def _job_owner(meta: Any) -> str | None:
    owner = next(
        (
            o
            for o in meta.get("ownerReferences") or []
            if o.get("controller") and o.get("kind") == KIND and str(o.get("apiVersion", "")).startswith("kubedgx.io/")
        ),
        None,
    )
    return str(owner["name"]) if owner is not None else None


def kueue_watched(environ: Any = os.environ) -> bool:
    """KUBEDGX_KUEUE, read at import (the watches are registered then) by the parser
    OperatorConfig.from_env uses: a value it refuses is refused here with the same ConfigError,
    rather than read as on."""
    from dgx_operator.runtime.settings import read_flag

    return read_flag("KUBEDGX_KUEUE", environ)


if kueue_watched():

    @kopf.index(KUEUE, "workloads")
    async def workloads_by_job(namespace: Any, meta: Any, body: Any, **_: Any) -> Any:
        job = _job_owner(meta)
        return {(namespace, job): slim_workload(body)} if job is not None else None

    @kopf.on.event(KUEUE, "workloads")
    async def workload_event(namespace: Any, meta: Any, memo: Any, **_: Any) -> None:
        job = _job_owner(meta)
        if job is not None and "controller" in memo:
            memo.controller.trigger(namespace, job)

    @kopf.index(KUEUE, "resourceflavors")
    async def resource_flavors(name: Any, body: Any, **_: Any) -> Any:
        return {name: Flavor.of(body)}
