"""`kubedgx check-install`: is this installation usable, seen from inside the cluster as a user's
`kubectl apply` is? The Helm chart's test hook (`helm test <release>`) runs it as its own
ServiceAccount, which may only create DGXTrainingJobs in the namespace checked; every create is a
server-side dry run, so nothing is stored and nothing runs.

Each check prints one line, ``ok`` or ``FAIL`` and what it saw:

1. the apiserver serves both kinds (the CRDs are installed and Established);
2. the installed instance catalog loads (the chart's ConfigMap, mounted into the test pod);
3. a valid DGXTrainingJob on an instance type of that catalog is accepted: the CRD's schema and CEL
   rules, then the validating webhook, called by the apiserver through the chart's Service and
   TLS, which itself dry-runs the job's worker (PriorityClasses, Pod Security of the namespace);
4. (with a webhook) a job whose instance type the catalog lacks is refused by the webhook by name,
   so a webhook that was never called (failurePolicy Ignore, a namespace it does not select)
   does not pass for one that works.

Right after an install the replicas may still be starting: a failure the apiserver reports as a 5xx
(a webhook it could not call) is tried again until ``--timeout`` runs out.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TextIO

from dgx_operator.api import API_VERSION, GROUP, VERSION
from dgx_operator.api.common import JOB_KIND
from dgx_operator.catalog import Catalog, CatalogError

#: The validating webhook's name for DGXTrainingJobs (the chart's and admission.webhook_configuration's).
WEBHOOK = "dgxtrainingjobs.kubedgx.io"
#: A well-formed instance type (the CRD's pattern accepts it) of a GPU family no catalog has.
UNKNOWN_INSTANCE = "dgxinstallcheck.1g.1.norm"
RETRY_PAUSE = 2.0


@dataclass(frozen=True)
class Outcome:
    ok: bool
    what: str
    detail: str = ""

    def line(self) -> str:
        return f"{'ok  ' if self.ok else 'FAIL'}  {self.what}" + (f": {self.detail}" if self.detail else "")


def probe_job(name: str, instance: str) -> dict[str, Any]:
    """The smallest job every installation must accept: one worker that would run `true`."""
    return {
        "apiVersion": API_VERSION,
        "kind": JOB_KIND,
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "kubedgx-check-install"}},
        "spec": {"instance": instance, "command": ["true"], "maxDuration": "1m"},
    }


async def run_checks(namespace: str, catalog_path: str | None, *, webhook: bool, timeout: float, out: TextIO) -> int:
    """The checks above, one line each on ``out``; 0 when all passed, 1 otherwise."""
    import aiohttp

    from dgx_operator.kube import JOBS, MOUNTS, ApiError, Kube, status_of

    outcomes: list[Outcome] = []

    def report(outcome: Outcome) -> Outcome:
        outcomes.append(outcome)
        print(outcome.line(), file=out, flush=True)
        return outcome

    print(f"kubedgx check-install: namespace {namespace}, catalog {catalog_path or '(built-in)'}", file=out)
    try:
        kube = await Kube.connect()
    except Exception as exc:  # no kubeconfig and no service account: nothing can be checked
        print(f"FAIL  cannot configure a client of the cluster: {type(exc).__name__}: {exc}", file=out)
        return 2
    try:
        served = f"the apiserver serves {JOBS} and {MOUNTS} ({GROUP}/{VERSION})"
        try:
            resources = await kube.api_resources(GROUP, VERSION)
            names = {str(r.get("name")) for r in resources}
            missing = sorted({JOBS, MOUNTS} - names)
            report(Outcome(not missing, served, f"{', '.join(missing)} missing: install the CRDs" if missing else ""))
        except ApiError as exc:
            report(Outcome(False, served, f"HTTP {exc.status}: {status_of(exc)[1]} (are the CRDs installed?)"))
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            report(Outcome(False, served, _explain(exc)))

        instance: str | None = None
        try:
            catalog = Catalog.load(catalog_path)
            instance = probe_instance(catalog)
            report(Outcome(True, f"the catalog loads: {len(catalog.instances)} instance types"))
        except (OSError, CatalogError, ValueError) as exc:
            report(Outcome(False, "the catalog loads", str(exc)))

        async def create(job: dict[str, Any]) -> None:
            await kube.dry_run_create_job(namespace, job)

        suffix = secrets.token_hex(3)
        if instance is not None:
            what = f"a DGXTrainingJob on {instance} is accepted (server-side dry run: schema, CEL rules, webhook)"
            error = await _retrying(lambda: create(probe_job(f"kubedgx-check-{suffix}", instance)), timeout)
            report(Outcome(error is None, what, _explain(error) if error is not None else ""))
        if webhook:
            what = f"the validating webhook {WEBHOOK} refuses instance type {UNKNOWN_INSTANCE} (not in the catalog)"
            error = await _retrying(lambda: create(probe_job(f"kubedgx-check-bad-{suffix}", UNKNOWN_INSTANCE)), timeout)
            if error is None:
                report(Outcome(False, what, "accepted: the webhook was not called (failurePolicy Ignore? namespace?)"))
            else:
                message = status_of(error)[1] if isinstance(error, ApiError) else str(error)
                denied = f'admission webhook "{WEBHOOK}" denied the request' in message
                report(Outcome(denied, what, message if denied else _explain(error)))
    finally:
        await kube.close()
    failed = [o for o in outcomes if not o.ok]
    print(f"{len(outcomes) - len(failed)} of {len(outcomes)} checks passed", file=out)
    return 1 if failed else 0


def probe_instance(catalog: Catalog) -> str:
    """The smallest on-demand whole-GPU instance type of the catalog (any other when it has no norm pool;
    a MIG slice only when it has nothing else: a slice needs nodes sliced for it)."""
    if not catalog.instances:
        raise ValueError("it has no instance types")
    whole = [i for i in catalog.instances.values() if i.mig is None] or list(catalog.instances.values())
    norm = [i for i in whole if i.capacity == "norm"] or whole
    return min(norm, key=lambda i: (i.gpus, i.name)).name


def _explain(error: BaseException) -> str:
    from dgx_operator.kube import ApiError, status_of

    if isinstance(error, ApiError):
        return f"HTTP {error.status}: {status_of(error)[1]}"
    return f"{type(error).__name__}: {error}"


async def _retrying(call: Callable[[], Awaitable[None]], timeout: float) -> BaseException | None:
    """None when ``call`` succeeded; the error it ended with. A 5xx (the apiserver could not call the
    webhook, an apiserver starting) or a lost connection is tried again until ``timeout``."""
    import aiohttp

    from dgx_operator.kube import ApiError

    deadline = time.monotonic() + timeout
    while True:
        try:
            await call()
            return None
        except ApiError as exc:
            if exc.status < 500 or time.monotonic() >= deadline:
                return exc
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            if time.monotonic() >= deadline:
                return exc
        await asyncio.sleep(RETRY_PAUSE)


def own_namespace() -> str | None:
    """The namespace of the pod this runs in, if it runs in one."""
    try:
        with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace", encoding="utf-8") as handle:
            return handle.read().strip() or None
    except OSError:
        return None
