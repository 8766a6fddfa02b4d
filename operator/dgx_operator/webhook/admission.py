"""The validating webhook's logic: the same checks as `kubedgx validate`, plus the ones that need
the cluster (referenced DGXDataMounts) or the previous object (immutable fields of a running job);
and how its server is set up in each mode of :class:`~dgx_operator.webhook.config.WebhookConfig`.

Self-signed mode: the replicas share one CA and serving certificate, kept in a Secret, and set its
CA as the caBundle of the chart's ValidatingWebhookConfiguration (:mod:`dgx_operator.webhook.certificates`,
which says why). kopf's ``settings.admission.managed`` is not used: it writes the URL its server
reports (not a Service reference), names webhooks ``<handler id>.<name>`` (two DNS segments for
"kubedgx", which the API server refuses: webhook names need three), takes failurePolicy from the
decorators rather than from the configuration, admits every operation, and strips its webhooks from
the configuration when the operator exits, so an old replica ending a rolling update would leave the
cluster without validation.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
import aiohttp.web
import kopf
from pydantic import ValidationError

from dgx_api.schema import Problem, join_path
from dgx_operator.api import GROUP, VERSION, DGXDataMount, DGXTrainingJob
from dgx_operator.api.crdgen import DATA_MOUNTS, TRAINING_JOBS
from dgx_operator.api.limits import KIND as LIMITS_KIND
from dgx_operator.api.limits import KUEUE_PRIORITY_LABEL, LIMITS_NAME, DGXLimits
from dgx_operator.catalog import Catalog, UnknownInstanceError
from dgx_operator.kube import ApiError, Kube, Refusal, TransientError, refusal, status_of
from dgx_operator.render import (
    BuildContext,
    BuildError,
    JobIdentity,
    headless_service,
    resolve,
    trainer_config_map,
    worker_pod,
)
from dgx_operator.validation.durability import reference_warnings
from dgx_operator.validation.limits import Effective, effective, new_problems, parse_limits, pinned
from dgx_operator.validation.validator import Validator, immutable_changes, object_label, reference_problems
from dgx_operator.webhook import budget_warnings
from dgx_operator.webhook.certificates import CertificateKeeper, PublishError, SelfSigned, self_signed
from dgx_operator.webhook.config import WebhookConfig

__all__ = ["SelfSigned", "self_signed"]  # re-exported: tests and tools make pairs through this module

log = logging.getLogger("kubedgx")

#: kopf serves each validating handler at ``/<its id>``: these ids are the webhook paths (stable:
#: the chart's ValidatingWebhookConfiguration names them).
JOB_WEBHOOK = f"validate-{TRAINING_JOBS.singular}"
MOUNT_WEBHOOK = f"validate-{DATA_MOUNTS.singular}"
#: (webhook name, resource, path) of each webhook in the configuration.
WEBHOOKS = (
    (f"{TRAINING_JOBS.plural}.{GROUP}", TRAINING_JOBS.plural, f"/{JOB_WEBHOOK}"),
    (f"{DATA_MOUNTS.plural}.{GROUP}", DATA_MOUNTS.plural, f"/{MOUNT_WEBHOOK}"),
)
MANAGED_BY = {"app.kubernetes.io/managed-by": "kubedgx-operator"}


def _label_of(obj: str) -> str:
    """CEL: the value of the Kueue priority-class label of ``obj`` ('' without one)."""
    labels = f"{obj}.metadata.labels"
    return f"((has({labels}) && '{KUEUE_PRIORITY_LABEL}' in {labels}) ? {labels}['{KUEUE_PRIORITY_LABEL}'] : '')"


#: Which requests reach the webhook at all; the apiserver evaluates these before calling it. Not an
#: object that is being deleted, and of updates only those that change the spec, or the Kueue
#: priority-class label (a guard rail, DGXLimits' kueuePriorityClasses, checks it: without it a label
#: added after creation would bypass that limit). So while the webhook cannot be reached (failurePolicy
#: Fail), deleting a job and the operator's removal of its finalizer, an update of metadata only, still
#: go through: proven on the real apiserver (tests/cluster/test_webhook.py), where without them a job
#: stayed Terminating. Status writes go to the status subresource, which no rule names. The chart's
#: configuration (cert-manager mode) carries the same list; a chart test compares them.
MATCH_CONDITIONS = (
    {"name": "not-being-deleted", "expression": "!has(object.metadata.deletionTimestamp)"},
    {
        "name": "spec-or-priority-class-changed",
        "expression": "request.operation != 'UPDATE' || !has(object.spec) || !has(oldObject.spec) "
        "|| object.spec != oldObject.spec "
        f"|| {_label_of('object')} != {_label_of('oldObject')}",
    },
)
#: Attempts at reading (or writing) the certificate Secret at startup before the operator gives up.
PUBLISH_ATTEMPTS = 5


#: The largest AdmissionReview body the webhook reads (aiohttp, under kopf's server, refuses more
#: than 1 MiB by default, and with failurePolicy Fail a refused review is a refused write). The
#: apiserver accepts request bodies of up to 3 MiB and runs admission before etcd (whose default
#: --max-request-bytes, 1.5 MiB, bounds what is stored); an UPDATE review carries the object and
#: the old object. So: two objects of the largest request the apiserver takes, plus 1 MiB for the
#: review's envelope and JSON's escaping. A larger body is answered 413, which the apiserver treats
#: as an unreachable webhook (failurePolicy); no such object could be stored anyway.
MAX_REVIEW_BYTES = 2 * 3 * 2**20 + 2**20
#: How long a review waits for the DGXDataMounts a job references (looked up concurrently): well
#: under the configuration's timeoutSeconds (10), so that a slow API server gets our answer (refused,
#: retry) rather than the apiserver's timeout, which failurePolicy turns into something else.
MOUNT_LOOKUP_TIMEOUT_S = 4.0
#: How long a review waits for the apiserver's dry-run of a job's children (sent at once, after the
#: mount lookups): with MOUNT_LOOKUP_TIMEOUT_S, still under the configuration's timeoutSeconds (10).
DRY_RUN_TIMEOUT_S = 3.0
#: The timeoutSeconds the two budgets above are sized for (the apiserver's default).
BUDGETED_TIMEOUT_S = 10


def budgets(timeout_seconds: int | None) -> tuple[float, float]:
    """(mount lookups, dry-runs) for a configuration whose timeoutSeconds is this: the budgets above
    for 10 s or more, shrunk in proportion for less, so that the apiserver still gets our answer
    (webhook.timeoutSeconds is a chart value) rather than its own timeout."""
    scale = min(1.0, (timeout_seconds or BUDGETED_TIMEOUT_S) / BUDGETED_TIMEOUT_S)
    return MOUNT_LOOKUP_TIMEOUT_S * scale, DRY_RUN_TIMEOUT_S * scale


#: Not the job's fault: retrying the same write may succeed (a dependency of the webhook failed).
RETRY_CODE = 503


async def review(
    memo: kopf.Memo,
    body: dict[str, Any],
    old: dict[str, Any] | None,
    operation: str | None,
    warnings: list[str] | None = None,
) -> None:
    """Raise kopf.AdmissionError listing every problem, one per line: 422 when the object is invalid,
    RETRY_CODE when it could not be checked. Never another exception: kopf would answer that with an
    opaque internal error (code 500, the exception's text), which tells the user nothing to do."""
    try:
        problems, unchecked = await _review(memo, body, old, operation, warnings if warnings is not None else [])
        lines = [*map(str, problems), *unchecked]
    except Exception as exc:
        log.exception("webhook: %s of %s failed", operation, object_label(body))
        message = (
            f"{object_label(body)}: the kubedgx webhook failed while checking it ({type(exc).__name__}: "
            f"{_one_line(exc)}); retry, and if this persists, the operator's log has the details"
        )
        raise kopf.AdmissionError(message, code=RETRY_CODE) from exc
    if lines:
        # A definite problem is not cured by retrying: then the refusal is "invalid", listing both.
        raise kopf.AdmissionError("\n".join(lines), code=422 if problems else RETRY_CODE)


async def _review(
    memo: kopf.Memo, body: dict[str, Any], old: dict[str, Any] | None, operation: str | None, warnings: list[str]
) -> tuple[list[Problem], list[str]]:
    """(problems, what could not be checked) of one review."""
    if operation == "DELETE":
        return [], []
    if (
        operation == "UPDATE"
        and old is not None
        and (old.get("spec") == body.get("spec") or (body.get("metadata") or {}).get("deletionTimestamp"))
    ):
        # Metadata-only writes (the operator's own finalizer removal, labels) and writes to a
        # deleting object are never refused: a spec that became invalid later (the catalog
        # dropped its instance, a mount changed) must not pin the job forever. Except a change of
        # the Kueue priority-class label, which a guard rail limits (and only for that limit).
        if (body.get("metadata") or {}).get("deletionTimestamp") or not _priority_class_changed(old, body):
            return [], []
        return await _label_limits(memo, body, old)
    # Shared by every request: created at startup (handlers.startup); built here only for callers
    # without one, such as tests.
    validator: Validator = memo.get("validator") or Validator(memo.config.catalog(), defaults=memo.config.defaults())
    # The status is not checked: users cannot write it (with the status subresource the apiserver
    # drops it from a CREATE, keeps the stored one on an UPDATE, and validates the operator's
    # writes to /status itself), so a status stored under an older schema must not block a spec.
    new, previous = _without_status(body), _without_status(old) if old is not None else None
    outcome = validator.validate(new, old=previous if operation == "UPDATE" else None)
    problems = list(outcome.problems)
    unchecked: list[str] = []
    if outcome.ok and body.get("kind") == TRAINING_JOBS.kind:
        if operation == "UPDATE" and old is not None:
            # Only a status the operator wrote makes fields immutable; one of another shape says
            # nothing about running workers.
            status = old.get("status")
            problems += immutable_changes({**old, "status": status if isinstance(status, dict) else {}}, body)
        job = DGXTrainingJob.model_validate(new)
        found: list[tuple[dict[str, Any], int]] = [(new, 0)]
        hook = getattr(memo.get("config"), "webhook", None)
        lookup_s, dry_run_s = budgets(hook.timeout_seconds if isinstance(hook, WebhookConfig) else None)
        earlier = _previous_job(previous) if operation == "UPDATE" else None
        spend: Spend | None = None
        guard_rails: Effective | None = None
        if operation != "UPDATE" or _spec_changed(old, body, operation) or _priority_class_changed(old, body):
            # Looked up alongside the mounts, within the same budget. Not for Kueue's suspend flips:
            # they change nothing a limit is about.
            # The budgets too, for the warning of a run that cannot fit one: only when the spec changed
            # (a relabelling changes no run's worst case).
            listing = "kube" in memo and _spec_changed(old, body, operation)
            limits, mounts, spend = await asyncio.gather(
                _limits(memo, job, lookup_s),
                _mounts(memo.kube, job, lookup_s) if "kube" in memo else _no_mounts(),
                _spend(memo.kube, job, lookup_s) if listing else _no_spend(),
            )
            namespace_limits, cannot_check = limits
            if cannot_check is not None:
                unchecked.append(cannot_check)
            else:
                guard_rails = _effective(memo, job, namespace_limits)
                refused, defaults = new_problems(job, earlier, guard_rails, validator.catalog)
                problems += refused
                if _spec_changed(old, body, operation):
                    warnings += defaults
        else:
            mounts = await _mounts(memo.kube, job, lookup_s) if "kube" in memo else []
        if "kube" in memo:
            for index, (mount, cannot) in enumerate(mounts):
                unreadable = _unreadable(index, mount) if mount is not None else None
                if cannot is not None:
                    unchecked.append(cannot)
                elif unreadable is not None:
                    warnings.append(unreadable)
                elif mount is not None:
                    found.append((mount, 1))
        if not unchecked:
            problems += [p for key, p in reference_problems(validator.catalog, found) if key == 0]
        if not problems and not unchecked and _spec_changed(old, body, operation):
            # Only with every referenced mount read (an absent one is not guessed at): the mounts
            # decide whether the checkpoints outlive the pod. Still admitted: a warning, not a refusal.
            warnings += [str(w) for key, w in reference_warnings(validator.catalog, found) if key == 0]
        if not problems and not unchecked and _dry_runs(memo):
            specs = {m["metadata"]["name"]: DGXDataMount.model_validate(m).spec for m, key in found if key == 1}
            ctx = BuildContext(catalog=validator.catalog, defaults=memo.config.defaults(), data_mounts=specs)
            denied, notes = await dry_run(memo.kube, job, ctx, earlier, dry_run_s)
            problems += denied
            warnings += notes
        if not problems and not unchecked and spend is not None:
            # Only for a job that is admitted: a refused one has no run to wait.
            default = pinned(job, guard_rails).max_duration if guard_rails is not None else None
            warnings += _budget_warnings(job, body, spend, validator.catalog, default)
    return problems, unchecked


# -- guard rails (DGXLimits) -----------------------------------------------------------------------


def _priority_class(obj: dict[str, Any] | None) -> str | None:
    labels = ((obj or {}).get("metadata") or {}).get("labels")
    return labels.get(KUEUE_PRIORITY_LABEL) if isinstance(labels, dict) else None


def _priority_class_changed(old: dict[str, Any] | None, new: dict[str, Any]) -> bool:
    return old is not None and _priority_class(old) != _priority_class(new)


async def _no_mounts() -> list[tuple[dict[str, Any] | None, str | None]]:
    return []


async def _limits(
    memo: kopf.Memo, job: DGXTrainingJob, timeout: float | None = None
) -> tuple[DGXLimits | None, str | None]:
    """(the namespace's DGXLimits or None, None), or (None, why it could not be read). Read with the
    operator's own client within ``timeout`` (default MOUNT_LOOKUP_TIMEOUT_S). A DGXLimits that cannot
    be looked up, or that this kubedgx cannot read, refuses the job for now (retry), as an unreadable
    DGXDataMount does, rather than letting it through unchecked: a guard rail that lets go silently
    is none."""
    if "kube" not in memo:
        return None, None
    namespace = job.metadata.namespace or "default"
    what = f"{LIMITS_KIND} {namespace}/{LIMITS_NAME}"
    limit = MOUNT_LOOKUP_TIMEOUT_S if timeout is None else timeout
    bound = asyncio.timeout(limit)
    try:
        async with bound:
            body = await memo.kube.get_limits(namespace)
    except Exception as exc:  # whatever failed, the limits are unknown: the job cannot be checked
        reason = f"the API server did not answer within {limit:g}s" if bound.expired() else _lookup_failure(exc)
        return None, f"spec: cannot check against {what} (the namespace's guard rails): {reason}; retry"
    if body is None:
        return None, None
    found, why = parse_limits(_without_status(body))
    if found is None:
        return None, (
            f"spec: cannot check against {what} (the namespace's guard rails): {why}; until an admin does, jobs "
            f"in {namespace} cannot be created or changed"
        )
    return found, None


def _effective(memo: kopf.Memo, job: DGXTrainingJob, namespace: DGXLimits | None) -> Effective:
    """The guard rails of the job's namespace: the chart's limits and its DGXLimits, combined."""
    cluster = getattr(memo.get("config"), "limits", None)
    return effective(cluster, namespace, job.metadata.namespace or "default")


def _guard_rails(
    memo: kopf.Memo, job: DGXTrainingJob, earlier: DGXTrainingJob | None, namespace: DGXLimits | None, catalog: Catalog
) -> tuple[list[Problem], list[str]]:
    """(refusals, defaults that apply) of the chart's and the namespace's limits (validation.limits); on
    an update, only the refusals the stored job did not have already."""
    return new_problems(job, earlier, _effective(memo, job, namespace), catalog)


async def _label_limits(memo: kopf.Memo, body: dict[str, Any], old: dict[str, Any]) -> tuple[list[Problem], list[str]]:
    """An update that changes only the Kueue priority-class label: checked against that limit alone
    (what else the stored job breaks was checked when it was made, under the limits of then)."""
    try:
        job = DGXTrainingJob.model_validate(_without_status(body))
        earlier = DGXTrainingJob.model_validate(_without_status(old))
    except ValidationError:
        return [], []  # a stored spec this kubedgx cannot read: never pinned by a label change
    namespace, cannot = await _limits(memo, job)
    if cannot is not None:
        return [], [cannot]
    catalog = memo["validator"].catalog if "validator" in memo else memo.config.catalog()
    problems, _ = _guard_rails(memo, job, earlier, namespace, catalog)
    return [p for p in problems if p.path.startswith("metadata.")], []


# -- budgets (DGXBudget): a warning when the run cannot fit ----------------------------------------


def now() -> datetime:
    """The webhook's clock, for the budgets' periods (a test sets another)."""
    return datetime.now(UTC)


#: (the namespace's DGXBudgets and, when one may hold, its jobs; or None), or (None, why they could not be listed).
Spend = tuple[tuple[list[dict[str, Any]], list[dict[str, Any]]] | None, str | None]


async def _no_spend() -> Spend:
    return None, None


async def _spend(kube: Kube, job: DGXTrainingJob, timeout: float) -> Spend:
    """The namespace's DGXBudgets and, only when one of them may hold a job, its DGXTrainingJobs (the
    common namespace, without budgets, costs one listing), all within ``timeout``: the mounts' and the
    guard rails' budget, which this runs alongside. Whatever fails, the answer is a warning, never a
    refusal (budget_warnings: the budget only decides when the job starts, and it may be raised)."""
    namespace = job.metadata.namespace or "default"
    bound = asyncio.timeout(timeout)
    try:
        async with bound:
            found = await kube.list_budgets(namespace)
            if not any(budget_warnings.may_hold(b) for b in found):
                return None, None
            jobs = await kube.list_jobs(namespace)
    except Exception as exc:  # whatever failed, the budgets are unknown: admitted without that check
        reason = f"the API server did not answer within {timeout:g}s" if bound.expired() else _lookup_failure(exc)
        log.warning("webhook: DGXBudgets of %s: %s", namespace, reason)
        return None, (
            f"spec: cannot check whether this job fits the DGXBudgets of namespace {namespace}: {reason}; admitted "
            "without that check"
        )
    return (found, jobs), None


def _budget_warnings(
    job: DGXTrainingJob, body: dict[str, Any], spend: Spend, catalog: Catalog, default: str | None
) -> list[str]:
    """The warnings of :func:`budget_warnings.warnings` for what :func:`_spend` listed, or the one saying
    they could not be listed. A failure of the judgement itself (a ledger no test foresaw) is logged and
    warned about too: what is only advice must never refuse a job nor fail the review."""
    listed, cannot_list = spend
    if cannot_list is not None:
        return [cannot_list]
    if listed is None:
        return []
    namespace = job.metadata.namespace or "default"
    try:
        return budget_warnings.warnings(*listed, body, catalog, default, now())
    except Exception as exc:
        log.exception("webhook: judging %s against the DGXBudgets of %s failed", object_label(body), namespace)
        return [
            f"spec: cannot check whether this job fits the DGXBudgets of namespace {namespace}: "
            f"{type(exc).__name__}: {_one_line(exc)}; admitted without that check"
        ]


def _spec_changed(old: dict[str, Any] | None, new: dict[str, Any], operation: str | None) -> bool:
    """Whether an update changed what the user asked for: Kueue flipping spec.suspend and the
    operator's finalizer writes update the object too, and a warning the user already saw at
    create would otherwise come back to Kueue and the operator (their logs) on every one."""
    if operation != "UPDATE" or old is None:
        return True

    def asked(obj: dict[str, Any]) -> Any:
        spec = obj.get("spec")
        return {k: v for k, v in spec.items() if k != "suspend"} if isinstance(spec, dict) else spec

    return bool(asked(old) != asked(new))


async def _mounts(
    kube: Kube, job: DGXTrainingJob, timeout: float | None = None
) -> list[tuple[dict[str, Any] | None, str | None]]:
    """Per spec.dataMounts entry: (the stored mount without its status, or None when absent; None,
    or why it could not be looked up), all looked up at once within ``timeout`` (default
    MOUNT_LOOKUP_TIMEOUT_S)."""
    namespace = job.metadata.namespace or "default"
    limit = MOUNT_LOOKUP_TIMEOUT_S if timeout is None else timeout

    async def lookup(index: int, name: str) -> tuple[dict[str, Any] | None, str | None]:
        bound = asyncio.timeout(limit)
        try:
            async with bound:
                mount = await kube.get_mount(namespace, name)
        except Exception as exc:  # whatever failed, the mount is unknown: the job cannot be checked
            reason = f"the API server did not answer within {limit:g}s" if bound.expired() else _lookup_failure(exc)
            return (
                None,
                f"spec.dataMounts[{index}]: cannot check against DGXDataMount {namespace}/{name}: {reason}; retry",
            )
        return (_without_status(mount) if mount is not None else None), None

    return list(await asyncio.gather(*(lookup(i, ref.name) for i, ref in enumerate(job.spec.data_mounts))))


def _unreadable(index: int, mount: dict[str, Any]) -> str | None:
    """Why this kubedgx cannot read a stored mount (written under an older schema, say), or None.
    Such a mount is treated as an absent one: the job is not checked against it and waits for it
    (the operator reports it), rather than every edit of the job (suspending it, too) being refused
    for another object's sake."""
    try:
        DGXDataMount.model_validate(mount)
    except ValidationError as exc:
        first = exc.errors()[0]
        path = ""
        for part in first["loc"]:
            path = join_path(path, part)
        meta = mount.get("metadata") or {}
        return (
            f"spec.dataMounts[{index}]: DGXDataMount {meta.get('namespace')}/{meta.get('name')} cannot be "
            "read by this kubedgx "
            f"({path}: {first['msg']}), so the job was not checked against it and waits for it; "
            "re-apply the mount with a valid spec"
        )
    return None


# -- the children, dry-run -------------------------------------------------------------------------


def _dry_runs(memo: kopf.Memo) -> bool:
    """A served webhook dry-runs children unless configured not to; a review without one (tests,
    callers of :func:`review` with no WebhookConfig) or without a cluster client does not."""
    config = memo.get("config")
    hook = getattr(config, "webhook", None)
    return "kube" in memo and isinstance(hook, WebhookConfig) and hook.dry_run


def _previous_job(previous: dict[str, Any] | None) -> DGXTrainingJob | None:
    """The stored job an UPDATE replaces, when this kubedgx can read it."""
    if previous is None:
        return None
    try:
        return DGXTrainingJob.model_validate(previous)
    except ValidationError:
        return None


def children(job: DGXTrainingJob, ctx: BuildContext) -> list[tuple[str, dict[str, Any]]]:
    """(what to call it, the object) of each child the operator creates first: the trainer ConfigMap,
    the Service and worker 0, rendered by the operator's own builders, without ownerReferences (a
    job being created has no uid yet, and the apiserver checks that an owner exists). Worker 0 only
    when every DGXDataMount it references was found: without one it cannot be rendered, and the
    job waits for the mount anyway."""
    ident = JobIdentity.of(job)
    r = resolve(job.spec, ctx.catalog)
    out: list[tuple[str, dict[str, Any]]] = []
    config = trainer_config_map(ident, job.spec)
    if config is not None:
        out.append((f"ConfigMap {config['metadata']['name']}", config))
    service = headless_service(ident, r, ctx.defaults.master_port)
    out.append((f"Service {service['metadata']['name']}", service))
    if all(ref.name in ctx.data_mounts for ref in job.spec.data_mounts):
        pod = worker_pod(ident, job.spec, 0, r, ctx)
        out.append((f"worker pod {pod['metadata']['name']}", pod))
    for _, obj in out:
        obj["metadata"].pop("ownerReferences", None)
    return out


#: The answer to one dry-run: passed (None), the apiserver's refusal, or why it could not be asked.
Answer = Refusal | str | None


async def _ask(kube: Kube, obj: dict[str, Any]) -> Answer:
    try:
        await kube.dry_run_create(obj)
    except ApiError as exc:
        if exc.status == 409:  # the name is taken: checked after validation and admission, which passed
            return None
        found = refusal(exc)
        return found if found is not None else f"HTTP {exc.status}: {status_of(exc)[1]}"
    except Exception as exc:  # whatever else failed, the child is not checked: admitted without it
        return _lookup_failure(exc)
    return None


def _waits(found: Refusal) -> bool:
    """Refusals the cluster lifts without a change of the spec, which must not stop `kubectl apply`:
    any of ResourceQuota's (exceeded, or not yet computed for a new quota: "status unknown for
    quota"), and a ServiceAccount not created yet (applied after the job, or a namespace's
    "default" in the moment after the namespace was made)."""
    return found.kind in ("quota", "passing")


async def dry_run(
    kube: Kube,
    job: DGXTrainingJob,
    ctx: BuildContext,
    previous: DGXTrainingJob | None = None,
    timeout: float | None = None,
) -> tuple[list[Problem], list[str]]:
    """(problems, warnings): each child of :func:`children` created with ``dryRun=All``, all at once
    and within ``timeout`` (default DRY_RUN_TIMEOUT_S). A permanent refusal is a problem at ``spec``
    quoting the apiserver; on an UPDATE, only if the stored spec's same child is not refused as well:
    then the cause is the cluster's (a namespace labelled for PodSecurity later, a PriorityClass deleted), and refusing
    would pin the job, suspending it too. Everything else admits the job with a warning: quota, an
    answer that retrying may change (5xx, 429, RBAC's 403 of the operator), no answer in time."""
    problems: list[Problem] = []
    warnings: list[str] = []
    limit = DRY_RUN_TIMEOUT_S if timeout is None else timeout
    bound = asyncio.timeout(limit)
    try:
        async with bound:
            built = children(job, ctx)
            answers = await asyncio.gather(*(_ask(kube, obj) for _, obj in built))
            refused = [i for i, a in enumerate(answers) if isinstance(a, Refusal) and not _waits(a)]
            before: dict[str, Answer] = {}
            if refused and previous is not None:
                try:
                    old = dict(children(previous, ctx))
                except (BuildError, UnknownInstanceError):  # the stored spec cannot be built now: no excuse
                    old = {}
                labels = [built[i][0] for i in refused if built[i][0] in old]
                before = dict(zip(labels, await asyncio.gather(*(_ask(kube, old[k]) for k in labels)), strict=True))
    except TimeoutError:
        if not bound.expired():
            raise
        name = f"{job.metadata.namespace}/{job.metadata.name}"
        log.warning("webhook: dry-run of the children of %s: no answer within %gs", name, limit)
        return [], [
            f"spec: the apiserver did not answer the dry-run of the job's children within {limit:g}s; "
            "admitted without that check"
        ]
    for (label, _), answer in zip(built, answers, strict=True):
        if answer is None:
            continue
        if isinstance(answer, str):
            log.warning("webhook: could not dry-run %s: %s", label, answer)
            warnings.append(f"spec: could not dry-run {label} ({answer}); admitted without that check")
        elif _waits(answer):
            warnings.append(
                f"spec: the apiserver would not create {label} now: {answer.message}; admitted, since the "
                "cluster lifts this without a change of the spec (quota freed, the ServiceAccount created)"
            )
        elif isinstance(before.get(label), Refusal):
            warnings.append(
                f"spec: the apiserver would refuse {label}: {answer.message} (it refuses the job's previous "
                "spec too, so this change is not refused for it)"
            )
        else:
            problems.append(Problem("spec", f"the apiserver would refuse {label}: {answer.message}"))
    return problems, warnings


def _without_status(obj: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in obj.items() if key != "status"}


def _lookup_failure(exc: Exception) -> str:
    if isinstance(exc, TimeoutError):  # the client's own timeout
        return "the request to the API server timed out"
    if isinstance(exc, ApiError):  # not retryable by kube.py's rules (403: the RBAC lacks get)
        return f"the API server answered HTTP {exc.status} {exc.reason}"
    return _one_line(exc)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# -- serving -----------------------------------------------------------------------------------


def webhook_configuration(hook: WebhookConfig, ca_bundle: bytes, namespaces: Sequence[str] = ()) -> dict[str, Any]:
    """The ValidatingWebhookConfiguration the chart renders (charts/kubedgx/templates/webhook.yaml;
    a chart test compares the two): each kind's CREATE and UPDATE to its path on the Service, port
    443 (the Service maps it to the webhook port), only in the watched ``namespaces`` when given.
    The operator writes it whole only when it is missing and it was run without the chart."""
    webhooks: list[dict[str, Any]] = []
    for name, resource, path in WEBHOOKS:
        webhook: dict[str, Any] = {
            "name": name,
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": hook.failure_policy,
            "matchPolicy": "Equivalent",
            "timeoutSeconds": hook.timeout_seconds,
            "clientConfig": {
                "service": {"name": hook.service, "namespace": hook.namespace, "path": path, "port": 443},
                "caBundle": base64.b64encode(ca_bundle).decode("ascii"),
            },
            "matchConditions": [dict(c) for c in MATCH_CONDITIONS],
            "rules": [
                {
                    "apiGroups": [GROUP],
                    "apiVersions": [VERSION],
                    "operations": ["CREATE", "UPDATE"],
                    "resources": [resource],
                    "scope": "Namespaced",
                }
            ],
        }
        if namespaces:
            webhook["namespaceSelector"] = {
                "matchExpressions": [
                    {"key": "kubernetes.io/metadata.name", "operator": "In", "values": list(namespaces)}
                ]
            }
        webhooks.append(webhook)
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": hook.configuration, "labels": dict(MANAGED_BY)},
        "webhooks": webhooks,
    }


class WebhookServer(kopf.WebhookServer):
    """kopf's server (every mode: TLS from files, self-signed, insecure) reading review bodies of up
    to MAX_REVIEW_BYTES. kopf builds its aiohttp Application with the default limit inside
    ``__call__`` and offers no option; each request it serves passes through ``_serve``, where a
    clone of the request (aiohttp's public way to change it) carries the larger limit."""

    @staticmethod
    async def _serve(fn: kopf.WebhookFn, request: aiohttp.web.Request) -> aiohttp.web.Response:
        return await kopf.WebhookServer._serve(fn, request.clone(client_max_size=MAX_REVIEW_BYTES))


@dataclass
class ListeningServer:
    """kopf's server, telling ``on_listening`` each time it listens (again): the replica's readiness
    waits for it, so that no endpoint is advertised before its socket accepts."""

    server: WebhookServer
    on_listening: Callable[[], None]

    async def __call__(self, fn: kopf.WebhookFn) -> AsyncIterator[kopf.WebhookClientConfig]:
        async with self.server:
            async for client_config in self.server(fn):
                self.on_listening()
                yield client_config


@dataclass
class WebhookSetup:
    """The server to put in ``settings.admission.server``, and what to stop when the operator stops."""

    server: Callable[[kopf.WebhookFn], AsyncIterator[kopf.WebhookClientConfig]]
    listening: asyncio.Event
    directory: str | None = None
    keeper: CertificateKeeper | None = None
    task: asyncio.Task[None] | None = None

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)


async def setup(
    hook: WebhookConfig, kube: Kube, retry_base: float = 1.0, namespaces: Sequence[str] = ()
) -> WebhookSetup:
    """The webhook server for the configured mode (:class:`WebhookServer`, looked up when called:
    tests replace it). Self-signed: the shared pair is read (or made) before the server starts, and
    kept current by a task until :meth:`WebhookSetup.close`."""
    listening = asyncio.Event()
    if hook.mode != "self-signed":
        insecure = hook.mode == "insecure"
        server = WebhookServer(
            addr=hook.host,
            port=hook.port,
            certfile=None if insecure else hook.certfile,
            pkeyfile=None if insecure else hook.pkeyfile,
            insecure=insecure,
        )
        return WebhookSetup(ListeningServer(server, listening.set), listening)
    # Settings require both in this mode.
    assert hook.namespace is not None
    assert hook.secret is not None
    # kopf loads the pair from files (and restarts its server when they change): a private directory.
    directory = tempfile.mkdtemp(prefix="kubedgx-webhook-")
    keeper = CertificateKeeper(
        kube=kube,
        namespace=hook.namespace,
        secret=hook.secret,
        dns_names=hook.dns_names,
        configuration=hook.configuration,
        webhooks=tuple(name for name, _, _ in WEBHOOKS),
        body=lambda ca: webhook_configuration(hook, ca, namespaces),
        directory=directory,
    )
    try:
        pair = await _first_pair(keeper, retry_base)
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    server = WebhookServer(
        addr=hook.host,
        port=hook.port,
        host=hook.dns_names[0],
        certfile=keeper.certfile,
        pkeyfile=keeper.keyfile,
        cadata=pair.ca,
    )

    setup = WebhookSetup(ListeningServer(server, listening.set), listening, directory, keeper)
    setup.task = asyncio.get_running_loop().create_task(_publish_and_keep(keeper), name="webhook certificate")
    return setup


async def _first_pair(keeper: CertificateKeeper, retry_base: float) -> SelfSigned:
    """The pair to serve from the start; transient failures are retried a few times, then raised
    (kopf then stops the operator, whose log says why: without the Secret's pair this replica would
    serve a certificate the apiserver does not trust)."""
    for attempt in range(PUBLISH_ATTEMPTS):
        try:
            return await keeper.ensure()
        except PublishError as exc:
            raise kopf.PermanentError(str(exc)) from exc
        except (TransientError, aiohttp.ClientError, TimeoutError) as exc:
            if attempt + 1 == PUBLISH_ATTEMPTS:
                raise
            delay = retry_base * 2.0**attempt
            log.warning("webhook: Secret %s/%s: %s; retrying in %.1fs", keeper.namespace, keeper.secret, exc, delay)
            await asyncio.sleep(delay)
    raise AssertionError("unreachable")


async def _publish_and_keep(keeper: CertificateKeeper) -> None:
    await keeper.publish()
    await keeper.keep()
