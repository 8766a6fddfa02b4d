"""The only module that talks to the API server.

Every call states its intent for the answers that are not errors in a level-triggered
controller: 404 on delete means "already gone", 409 on create means "exists" *only* when the
existing object's controller owner is this job (anything else is a foreign object the job must not
adopt), 409 on a status patch means "someone wrote in between: plan again". 429 and 5xx are
transient and raised as :class:`TransientError` for the caller's backoff.
"""

from __future__ import annotations

import base64
import json
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, NoReturn

import aiohttp
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from dgx_operator.api import GROUP, VERSION
from dgx_operator.api.crdgen import DATA_MOUNTS, TRAINING_JOBS

JOBS = TRAINING_JOBS.plural
MOUNTS = DATA_MOUNTS.plural
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
WEBHOOK_CONFIGURATIONS = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"

log = logging.getLogger(__name__)


class TransientError(Exception):
    """Retry later: throttled (429), a server error (5xx), or a conflicting write (409)."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ForeignObjectError(Exception):
    """A child's name is taken by an object this job does not control."""

    def __init__(self, description: str) -> None:
        super().__init__(description)
        self.description = description


CreateOutcome = Literal["created", "exists", "blocked"]


@dataclass(frozen=True)
class Refusal:
    """The apiserver said no to a write, for a reason waiting will not change (``permanent``), one
    that is the cluster's to lift (``quota``: a ResourceQuota that an admin or the end of other jobs
    frees), or one that lifts by itself in moments (``passing``: see PASSING_REFUSALS; retried like
    a 5xx). ``message`` is the apiserver's own sentence (Status.message), never the HTTP dump with
    its headers."""

    kind: Literal["permanent", "quota", "passing"]
    code: int
    reason: str
    message: str

    def __str__(self) -> str:
        return self.message


def status_of(exc: ApiException) -> tuple[str, str]:
    """(Status.reason, Status.message) from an ApiException's body, or ("", the HTTP reason)."""
    body: Any = exc.body
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    try:
        status: Any = json.loads(body) if isinstance(body, str) and body else {}
    except ValueError:
        status = {}
    if not isinstance(status, dict):
        status = {}
    reason = status.get("reason")
    message = status.get("message")
    return (
        reason if isinstance(reason, str) else "",
        message if isinstance(message, str) and message else str(exc.reason or f"HTTP {exc.status}"),
    )


#: 403s that lift by themselves: a ResourceQuota whose usage the quota controller has not computed
#: yet, and a ServiceAccount not created yet (the default one appears moments after its namespace).
PASSING_REFUSALS = ("status unknown for quota", "error looking up service account")


def refusal(exc: ApiException) -> Refusal | None:
    """Classify a refused create; None when it is not a refusal of the object but retrying may help
    (429, 5xx, 409, 404, a namespace being deleted, and a 403 from RBAC, which is the operator's
    installation to fix, not the job's).

    Permanent: 400 and 422 (the object is invalid, or an admission webhook denied it), and the
    remaining 403s, which admission plugins answer (PodSecurity, Priority's "no PriorityClass with
    name", LimitRanger's per-container maximum...). Quota: a 403 whose message says a ResourceQuota
    is exceeded: other jobs ending frees it."""
    reason, message = status_of(exc)
    if exc.status == 403:
        if "NamespaceTerminating" in str(exc.body or "") or " cannot create resource " in message:
            return None
        if any(passing in message for passing in PASSING_REFUSALS):
            return Refusal("passing", exc.status, reason, message)
        if "exceeded quota" in message:
            return Refusal("quota", exc.status, reason, message)
        return Refusal("permanent", exc.status, reason, message)
    if exc.status in (400, 422):
        return Refusal("permanent", exc.status, reason, message)
    return None


def _transient(exc: ApiException, what: str) -> TransientError:
    retry = None
    if exc.headers and exc.headers.get("Retry-After"):
        try:
            retry = float(exc.headers["Retry-After"])
        except ValueError:
            retry = None
    return TransientError(f"{what}: HTTP {exc.status} {exc.reason}", retry)


async def _unparsed(call: Awaitable[Any]) -> None:
    """Await a create or delete whose answer is not needed, without turning it into a client model:
    the model refuses objects lacking fields it insists on (a pod status without imageID, say),
    and would raise after the write happened. Errors still raise ApiException, as usual."""
    response = await call
    try:
        if not 200 <= response.status <= 299:
            exc = ApiException(status=response.status, reason=response.reason)
            exc.headers = response.headers
            exc.body = await response.read()
            raise exc
    finally:
        response.release()


def _retryable(exc: ApiException) -> bool:
    return exc.status == 429 or exc.status == 409 or exc.status >= 500


@dataclass
class Kube:
    """A thin async facade over the Kubernetes API for the operator's few calls."""

    api: client.ApiClient
    #: Told (verb, HTTP code) of every call that failed; not of the answers a call expects
    #: (404 on reads and deletes, 409 on creating a child): the operator's API error metric.
    on_error: Callable[[str, int], None] | None = None

    def _raise(self, verb: str, exc: ApiException, what: str) -> NoReturn:
        """Record a failed call; raise it as TransientError when retrying may help, else as is."""
        if self.on_error is not None:
            self.on_error(verb, exc.status)
        if _retryable(exc):
            raise _transient(exc, what) from exc
        raise exc

    @classmethod
    async def connect(cls) -> Kube:
        """In-cluster credentials when running in a pod, else the kubeconfig (KUBECONFIG)."""
        if os.environ.get("KUBERNETES_SERVICE_HOST") and os.path.exists(
            "/var/run/secrets/kubernetes.io/serviceaccount/token"
        ):
            config.load_incluster_config()  # type: ignore[no-untyped-call]
            return cls(client.ApiClient())
        configuration = client.Configuration()
        # The library reads KUBECONFIG when it is imported; read it now, as kopf's login does.
        path = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or None
        await config.load_kube_config(config_file=path, client_configuration=configuration)
        return cls(client.ApiClient(configuration))

    async def close(self) -> None:
        await self.api.close()

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    # -- reads ---------------------------------------------------------------------------------

    async def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._get(JOBS, namespace, name)

    async def get_mount(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._get(MOUNTS, namespace, name)

    async def list_jobs(self, namespace: str) -> list[dict[str, Any]]:
        try:
            found: dict[str, Any] = await self.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, JOBS)
        except ApiException as exc:
            self._raise("list", exc, f"list {JOBS} in {namespace}")
        return list(found.get("items") or [])

    async def get_secret_data(self, namespace: str, name: str) -> dict[str, bytes] | None:
        """A Secret's decoded data, or None when it does not exist."""
        try:
            secret = await self.core.read_namespaced_secret(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            self._raise("get", exc, f"get secret {namespace}/{name}")
        return {k: base64.b64decode(v) for k, v in (secret.data or {}).items()}

    async def pod_log_tail(
        self, namespace: str, name: str, container: str, *, lines: int, limit_bytes: int, timeout: float = 5.0
    ) -> str | None:
        """The last ``lines`` lines (at most ``limit_bytes``) a container printed, or None when they
        cannot be read now (the pod or container is gone or not started, the kubelet does not
        answer within ``timeout`` seconds, RBAC): a reader of logs is best-effort and never fails,
        nor holds up for long, a reconcile. The apiserver fetches logs from the node's kubelet,
        which a node that is unreachable (or a kwok node, which has none) may never answer."""
        try:
            text = await self.core.read_namespaced_pod_log(
                name,
                namespace,
                container=container,
                tail_lines=lines,
                limit_bytes=limit_bytes,
                _request_timeout=timeout,
            )
        except ApiException as exc:
            log.debug("log of %s/%s (%s): %s %s", namespace, name, container, exc.status, exc.reason)
            return None
        except (TimeoutError, aiohttp.ClientError) as exc:
            log.debug("log of %s/%s (%s): %s", namespace, name, container, exc)
            return None
        return text if isinstance(text, str) else None

    async def _get(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        """One of our custom objects, or None when it does not exist."""
        try:
            obj: dict[str, Any] = await self.custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, plural, name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            self._raise("get", exc, f"get {plural} {namespace}/{name}")
        return obj

    # -- writes --------------------------------------------------------------------------------

    async def create(self, obj: Mapping[str, Any], owner_uid: str) -> CreateOutcome:
        """Create a child. An existing one is fine only if this job controls it; one left by a
        deleted job of the same name is "blocked" (it goes away with its owner)."""
        kind, meta = obj["kind"], obj["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        create: Any
        read: Any
        create, read = {
            "Pod": (self.core.create_namespaced_pod, self.core.read_namespaced_pod),
            "Service": (self.core.create_namespaced_service, self.core.read_namespaced_service),
            "ConfigMap": (self.core.create_namespaced_config_map, self.core.read_namespaced_config_map),
        }[kind]
        try:
            await _unparsed(create(namespace, dict(obj), _preload_content=False))
            return "created"
        except ApiException as exc:
            if exc.status != 409:
                self._raise("create", exc, f"create {kind} {namespace}/{name}")
        try:
            existing = self.api.sanitize_for_serialization(await read(name, namespace))
        except ApiException as exc:
            if exc.status == 404:  # deleted in between: try again on the next pass
                raise TransientError(f"create {kind} {namespace}/{name}: existed, then vanished") from exc
            self._raise("get", exc, f"get {kind} {namespace}/{name}")
        owners = existing.get("metadata", {}).get("ownerReferences") or []
        controller = next((o for o in owners if o.get("controller")), None)
        if controller is not None and controller.get("uid") == owner_uid:
            return "exists"
        ours = obj["metadata"]["ownerReferences"][0]
        if controller is not None and controller.get("kind") == ours["kind"] and controller.get("name") == ours["name"]:
            return "blocked"
        holder = f"{controller.get('kind')} {controller.get('name')}" if controller else "no controller"
        raise ForeignObjectError(
            f"{kind} {namespace}/{name} already exists and is controlled by {holder}, not this job; "
            "delete it or rename the job"
        )

    async def dry_run_create(self, obj: Mapping[str, Any]) -> None:
        """Ask whether the apiserver would create a child (``dryRun=All``: validation and every
        admission plugin and webhook run, nothing is stored). Returns when it would; a refusal is
        raised as the ApiException it is, for :func:`refusal` to classify. 409 means the name is
        taken, which the apiserver checks last: the object passed everything else."""
        kind, namespace = obj["kind"], obj["metadata"]["namespace"]
        create: Any = {
            "Pod": self.core.create_namespaced_pod,
            "Service": self.core.create_namespaced_service,
            "ConfigMap": self.core.create_namespaced_config_map,
        }[kind]
        try:
            await _unparsed(create(namespace, dict(obj), dry_run="All", _preload_content=False))
        except ApiException as exc:
            # Only the failures of the call itself count as API errors; a refusal is its answer.
            if self.on_error is not None and exc.status != 409 and refusal(exc) is None:
                self.on_error("create", exc.status)
            raise

    async def patch_pod_labels(self, namespace: str, name: str, labels: Mapping[str, str | None]) -> bool:
        """Merge ``labels`` into a pod's (None removes one); False if the pod is gone. Allowed on a
        pod being deleted: metadata stays writable until the object is removed."""
        call = self.core.patch_namespaced_pod(
            name,
            namespace,
            {"metadata": {"labels": dict(labels)}},
            _content_type=MERGE_PATCH,  # type: ignore[call-arg]
            _preload_content=False,
        )
        return await self._unless_gone(call, "patch", f"patch Pod {namespace}/{name}")

    async def delete_config_map(self, namespace: str, name: str) -> bool:
        """Delete a ConfigMap (a superseded trainer config); False if it was already gone."""
        call = self.core.delete_namespaced_config_map(name, namespace, _preload_content=False)
        return await self._unless_gone(call, "delete", f"delete ConfigMap {namespace}/{name}")

    async def delete_pod(self, namespace: str, name: str) -> bool:
        """Delete a pod; False if it was already gone."""
        call = self.core.delete_namespaced_pod(name, namespace, _preload_content=False)
        return await self._unless_gone(call, "delete", f"delete Pod {namespace}/{name}")

    async def _unless_gone(self, call: Awaitable[Any], verb: str, what: str) -> bool:
        """A write to an object that may have gone meanwhile: False on 404, errors as _raise says."""
        try:
            await _unparsed(call)
        except ApiException as exc:
            if exc.status == 404:
                return False
            self._raise(verb, exc, what)
        return True

    async def delete_job(self, namespace: str, name: str) -> None:
        try:
            await self.custom.delete_namespaced_custom_object(
                GROUP, VERSION, namespace, JOBS, name, propagation_policy="Background"
            )
        except ApiException as exc:
            if exc.status == 404:
                return
            self._raise("delete", exc, f"delete {JOBS} {namespace}/{name}")

    async def set_finalizers(
        self, namespace: str, name: str, resource_version: str | None, finalizers: list[str], plural: str = JOBS
    ) -> dict[str, Any]:
        """Replace the object's finalizer list, guarded by resourceVersion (409: plan again)."""
        meta: dict[str, Any] = {"finalizers": finalizers}
        if resource_version:
            meta["resourceVersion"] = resource_version
        try:
            patched: dict[str, Any] = await self.custom.patch_namespaced_custom_object(
                GROUP,
                VERSION,
                namespace,
                plural,
                name,
                {"metadata": meta},
                _content_type=MERGE_PATCH,  # type: ignore[call-arg]
            )
        except ApiException as exc:
            if exc.status == 404:
                return {}
            self._raise("patch", exc, f"patch finalizers of {plural} {namespace}/{name}")
        return patched

    # -- raw JSON calls (no client models: they reject fields they do not know) -----------------

    async def _json(
        self, method: str, path: str, body: Any = None, *, content_type: str = "application/json"
    ) -> dict[str, Any]:
        """One call whose answer is read as plain JSON; errors raise ApiException, as the models' do."""
        response = await self.api.call_api(
            path,
            method,
            header_params={"Accept": "application/json", "Content-Type": content_type},
            body=body,
            auth_settings=["BearerToken"],
            _preload_content=False,
        )
        try:
            data = await response.read()
            if not 200 <= response.status <= 299:
                exc = ApiException(status=response.status, reason=response.reason)
                exc.headers = response.headers
                exc.body = data
                raise exc
        finally:
            response.release()
        found: dict[str, Any] = json.loads(data) if data else {}
        return found

    # -- leader election (leader.py) -------------------------------------------------------------

    @staticmethod
    def _lease_path(namespace: str, name: str | None = None) -> str:
        base = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        return f"{base}/{name}" if name else base

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await self._json("GET", self._lease_path(namespace, name))
        except ApiException as exc:
            if exc.status == 404:
                return None
            self._raise("get", exc, f"get lease {namespace}/{name}")

    async def create_lease(self, namespace: str, name: str, spec: Mapping[str, Any]) -> dict[str, Any] | None:
        """The created Lease, or None when another candidate created it first."""
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name, "namespace": namespace},
            "spec": dict(spec),
        }
        try:
            return await self._json("POST", self._lease_path(namespace), body)
        except ApiException as exc:
            if exc.status == 409:
                return None
            self._raise("create", exc, f"create lease {namespace}/{name}")

    async def replace_lease(
        self, namespace: str, name: str, spec: Mapping[str, Any], resource_version: str
    ) -> dict[str, Any] | None:
        """The Lease as written, or None when it changed since it was read (409)."""
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": resource_version},
            "spec": dict(spec),
        }
        try:
            return await self._json("PUT", self._lease_path(namespace, name), body)
        except ApiException as exc:
            if exc.status in (404, 409):
                return None
            self._raise("update", exc, f"update lease {namespace}/{name}")

    # -- the self-signed webhook's certificate Secret and configuration (admission.py) -----------

    async def get_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await self._json("GET", f"/api/v1/namespaces/{namespace}/secrets/{name}")
        except ApiException as exc:
            if exc.status == 404:
                return None
            self._raise("get", exc, f"get secret {namespace}/{name}")

    async def update_secret_data(
        self, namespace: str, name: str, data: Mapping[str, bytes], resource_version: str
    ) -> dict[str, Any] | None:
        """Write the Secret's data, only if it is still the version read; None on a conflict (another
        replica wrote first: read it again)."""
        patch = {
            "metadata": {"resourceVersion": resource_version},
            "data": {k: base64.b64encode(v).decode("ascii") for k, v in data.items()},
        }
        try:
            return await self._json(
                "PATCH", f"/api/v1/namespaces/{namespace}/secrets/{name}", patch, content_type=MERGE_PATCH
            )
        except ApiException as exc:
            if exc.status == 409:
                return None
            self._raise("patch", exc, f"patch secret {namespace}/{name}")

    async def create_secret(self, namespace: str, name: str, data: Mapping[str, bytes]) -> bool:
        """Create an Opaque Secret; False when it exists already (another replica made it first)."""
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": {"name": name, "namespace": namespace, "labels": {"app.kubernetes.io/managed-by": "kubedgx"}},
            "data": {k: base64.b64encode(v).decode("ascii") for k, v in data.items()},
        }
        try:
            await self._json("POST", f"/api/v1/namespaces/{namespace}/secrets", body)
        except ApiException as exc:
            if exc.status == 409:
                return False
            self._raise("create", exc, f"create secret {namespace}/{name}")
        return True

    async def create_webhook_configuration(self, body: Mapping[str, Any]) -> None:
        """Create the ValidatingWebhookConfiguration (run without the chart, which renders it)."""
        try:
            await self._json("POST", WEBHOOK_CONFIGURATIONS, dict(body))
        except ApiException as exc:
            if self.on_error is not None:
                self.on_error("create", exc.status)
            raise

    async def get_webhook_configuration(self, name: str) -> dict[str, Any] | None:
        try:
            return await self._json("GET", f"{WEBHOOK_CONFIGURATIONS}/{name}")
        except ApiException as exc:
            if exc.status == 404:
                return None
            self._raise("get", exc, f"get validatingwebhookconfiguration {name}")

    async def patch_webhook_ca(self, name: str, ca_bundles: Mapping[int, bytes], resource_version: str) -> bool:
        """Set ``clientConfig.caBundle`` of the webhooks at these indexes of one configuration, and
        nothing else (the chart owns the rest): a JSON patch whose first operation tests the
        resourceVersion the indexes were read at. False when the configuration changed since
        (409, or the test failed: 422): read it again."""
        patch: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/resourceVersion", "value": resource_version}]
        patch += [
            {"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": base64.b64encode(ca).decode("ascii")}
            for i, ca in sorted(ca_bundles.items())
        ]
        try:
            await self._json("PATCH", f"{WEBHOOK_CONFIGURATIONS}/{name}", patch, content_type=JSON_PATCH)
        except ApiException as exc:
            if exc.status in (409, 422):
                return False
            self._raise("patch", exc, f"patch validatingwebhookconfiguration {name}")
        return True

    # -- Kueue (reconcile.queueing) ---------------------------------------------------------------

    async def served_version(self, group: str, known: tuple[str, ...]) -> str | None:
        """The version of ``group`` to speak: the server's preferred one if we know it, else the first
        of ``known`` it serves; None when the group is not served (Kueue not installed)."""
        try:
            found: Any = await self.api.call_api(
                f"/apis/{group}",
                "GET",
                response_types_map={200: "object"},
                auth_settings=["BearerToken"],
                _return_http_data_only=True,
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            self._raise("get", exc, f"discover API group {group}")
        served = [str(v.get("version")) for v in (found or {}).get("versions") or []]
        preferred = ((found or {}).get("preferredVersion") or {}).get("version")
        if preferred in known:
            return str(preferred)
        return next((v for v in known if v in served), None)

    async def priority_value(self, group: str, version: str, plural: str, name: str) -> int | None:
        """The ``value`` of a cluster-scoped priority class (WorkloadPriorityClass or PriorityClass);
        None when it does not exist."""
        try:
            obj: dict[str, Any] = await self.custom.get_cluster_custom_object(group, version, plural, name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            self._raise("get", exc, f"get {plural} {name}")
        value = obj.get("value")
        return int(value) if isinstance(value, int) else 0

    async def create_workload(self, obj: Mapping[str, Any]) -> None:
        """Create a job's Workload; one already there (the cache lags) is fine."""
        group, version = obj["apiVersion"].split("/")
        namespace = obj["metadata"]["namespace"]
        try:
            await self.custom.create_namespaced_custom_object(group, version, namespace, "workloads", dict(obj))
        except ApiException as exc:
            if exc.status == 409:
                return
            self._raise("create", exc, f"create Workload {namespace}/{obj['metadata']['name']}")

    async def delete_workload(self, api_version: str, namespace: str, name: str, uid: str) -> None:
        """Delete a Workload, that one only (uid precondition); gone already is fine."""
        group, version = api_version.split("/")
        try:
            await self.custom.delete_namespaced_custom_object(
                group,
                version,
                namespace,
                "workloads",
                name,
                body=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid)),
            )
        except ApiException as exc:
            if exc.status in (404, 409):  # gone, or another object now holds the name
                return
            self._raise("delete", exc, f"delete Workload {namespace}/{name}")

    async def patch_workload(
        self, api_version: str, namespace: str, name: str, resource_version: str, patch: Mapping[str, Any],
        *, status: bool = False,
    ) -> None:  # fmt: skip
        """Merge-patch a Workload (or its status), guarded by the resourceVersion it was planned
        from: Kueue writes it too, and a status patch replaces the conditions list whole."""
        group, version = api_version.split("/")
        body = {**patch, "metadata": {**dict(patch.get("metadata") or {}), "resourceVersion": resource_version}}
        call = (
            self.custom.patch_namespaced_custom_object_status if status else self.custom.patch_namespaced_custom_object
        )
        try:
            await call(group, version, namespace, "workloads", name, body, _content_type=MERGE_PATCH)  # type: ignore[call-arg]
        except ApiException as exc:
            if exc.status == 404:
                return
            self._raise("patch", exc, f"patch {'status of ' if status else ''}Workload {namespace}/{name}")

    async def patch_mount_status(
        self, namespace: str, name: str, resource_version: str | None, status: Mapping[str, Any]
    ) -> dict[str, Any]:
        return await self.patch_job_status(namespace, name, resource_version, status, plural=MOUNTS)

    async def patch_job_status(
        self,
        namespace: str,
        name: str,
        resource_version: str | None,
        status: Mapping[str, Any],
        plural: str = JOBS,
    ) -> dict[str, Any]:
        """Merge-patch the status, guarded by the resourceVersion the plan was made from: a spec
        edit or another writer in between makes it 409, and the job is planned again."""
        body: dict[str, Any] = {"status": dict(status)}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        try:
            # kubernetes_asyncio would pick json-patch for a dict body; CRDs take merge patches.
            patched: dict[str, Any] = await self.custom.patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                namespace,
                plural,
                name,
                body,
                _content_type=MERGE_PATCH,  # type: ignore[call-arg]
            )
        except ApiException as exc:
            self._raise("patch", exc, f"patch status of {plural} {namespace}/{name}")
        return patched
