"""The only module that talks to the API server.

Every call states its intent for the answers that are not errors in a level-triggered
controller: 404 on delete means "already gone", 409 on create means "exists" *only* when the
existing object's controller owner is this job (anything else is a foreign object the job must not
adopt), 409 on a status patch means "someone wrote in between: plan again". 429 and 5xx are
transient and raised as :class:`TransientError` for the caller's backoff.

The calls go out over aiohttp with the credentials kopf's login finds (:func:`credentials`), the
same its watches use, and answers are read as plain JSON. Not through kubernetes_asyncio: its
package imports every generated model class on import (some 40 MB of the operator's memory, a
fifth of its peak at 1,000 jobs), its models reject objects lacking fields they insist on, and the
operator never used them.
"""

from __future__ import annotations

import base64
import json
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, NoReturn

import aiohttp

from dgx_operator.api import GROUP, VERSION
from dgx_operator.api.crdgen import BUDGETS, DATA_MOUNTS, LIMITS, TRAINING_JOBS
from dgx_operator.api.limits import LIMITS_NAME

if TYPE_CHECKING:
    import kopf

JOBS = TRAINING_JOBS.plural
MOUNTS = DATA_MOUNTS.plural
LIMIT_OBJECTS = LIMITS.plural
BUDGET_OBJECTS = BUDGETS.plural
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
JSON = "application/json"
WEBHOOK_CONFIGURATIONS = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
#: Where a pod finds its ServiceAccount's credentials (the kubelet mounts them).
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"

log = logging.getLogger(__name__)


class ApiError(Exception):
    """The API server answered a call with an error. ``status`` is the HTTP code, ``reason`` its
    phrase, ``body`` the answer as sent (a ``Status`` object in JSON: :func:`status_of` reads it),
    ``headers`` the answer's headers (``Retry-After``). The attributes are those of
    kubernetes_asyncio's exception of the same name, so the code that classifies answers reads
    them alike."""

    def __init__(
        self,
        status: int = 0,
        reason: str | None = None,
        body: bytes | str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(status, reason)
        self.status = status
        self.reason = reason
        self.body = body
        self.headers = headers

    def __str__(self) -> str:
        text = f"({self.status})\nReason: {self.reason}\n"
        if self.body:
            body = self.body.decode("utf-8", "replace") if isinstance(self.body, bytes) else self.body
            text += f"HTTP response body: {body}\n"
        return text


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


def status_of(exc: ApiError) -> tuple[str, str]:
    """(Status.reason, Status.message) from an ApiError's body, or ("", the HTTP reason)."""
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


def refusal(exc: ApiError) -> Refusal | None:
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


def _transient(exc: ApiError, what: str) -> TransientError:
    retry = None
    if exc.headers and exc.headers.get("Retry-After"):
        try:
            retry = float(exc.headers["Retry-After"])
        except ValueError:
            retry = None
    return TransientError(f"{what}: HTTP {exc.status} {exc.reason}", retry)


def _retryable(exc: ApiError) -> bool:
    return exc.status == 429 or exc.status == 409 or exc.status >= 500


def in_cluster_login(
    settings: kopf.OperatorSettings, environ: Mapping[str, str] | None = None, directory: str = SERVICE_ACCOUNT_DIR
) -> kopf.ConnectionInfo | None:
    """The pod's ServiceAccount at the apiserver address the pod is given, as client-go's
    InClusterConfig reads it: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT. kopf's own login
    goes to https://kubernetes.default.svc whatever they say, so where they point elsewhere (an
    apiserver reached without kube-proxy, as on the real test nodes) its watches failed while the
    operator's other calls worked. None where this is no pod (no variables or no token): the
    kubeconfig then."""
    import kopf

    env = os.environ if environ is None else environ
    host, port = env.get("KUBERNETES_SERVICE_HOST", ""), env.get("KUBERNETES_SERVICE_PORT", "")
    token_path = os.path.join(directory, "token")
    if not host or not port or not os.path.exists(token_path):
        return None
    with open(token_path, encoding="utf-8") as f:
        token = f.read().strip()
    namespace = None
    if os.path.exists(os.path.join(directory, "namespace")):
        with open(os.path.join(directory, "namespace"), encoding="utf-8") as f:
            namespace = f.read().strip() or None
    ca_path = os.path.join(directory, "ca.crt")
    server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
    return kopf.ConnectionInfo(
        server=server,
        ca_path=ca_path if os.path.exists(ca_path) else None,
        token=token or None,
        default_namespace=namespace,
        trust_env=settings.networking.trust_env,
        priority=20,  # kopf's own service-account login's priority (PRIORITY_OF_SERVICE_ACCOUNT)
    )


def login_info(settings: kopf.OperatorSettings) -> kopf.ConnectionInfo | None:
    """In-cluster: the ServiceAccount at KUBERNETES_SERVICE_HOST/PORT (:func:`in_cluster_login`);
    else kopf's service-account login, else the kubeconfig (tests, local runs); None without any.
    The runtime's kopf login handler and :func:`credentials` both ask this, so kopf's watches and
    the operator's own calls always go out as the same user to the same server."""
    import kopf

    return (
        in_cluster_login(settings)
        or kopf.login_with_service_account(settings=settings)
        or kopf.login_with_kubeconfig(settings=settings)
    )


def credentials(settings: kopf.OperatorSettings | None = None) -> kopf.ConnectionInfo:
    """Who the operator is and where its API server is, found as its kopf login finds them
    (:func:`login_info`): the pod's ServiceAccount, else kopf's service-account login, else the
    kubeconfig (KUBECONFIG, else ~/.kube/config; tokens, client
    certificates, CA). A kubeconfig whose user runs an ``exec`` plugin or an ``auth-provider``
    (EKS, GKE) gets its token from kubernetes_asyncio's loader where that is installed (`kubedgx
    check-install` from a laptop); the operator's own process never imports it (cli.main)."""
    import kopf

    info = login_info(settings or kopf.OperatorSettings())
    if info is None:
        raise kopf.LoginError(
            "no credentials for the API server: not in a pod, and no kubeconfig "
            "(set KUBECONFIG or write ~/.kube/config)"
        )
    if not (info.token or info.username or info.certificate_path or info.certificate_data):
        return _plugin_credentials(info)
    return info


def _plugin_credentials(info: kopf.ConnectionInfo) -> kopf.ConnectionInfo:
    """The kubeconfig's credentials as kubernetes_asyncio's loader produces them (it runs ``exec``
    plugins and ``auth-provider`` refreshes, which kopf's minimal parser does not), or ``info`` as it
    is where that library is not importable."""
    import asyncio

    import kopf

    try:
        from kubernetes_asyncio import client, config
    except ImportError:
        return info

    async def load() -> Any:
        configuration = client.Configuration()
        path = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or None
        await config.load_kube_config(config_file=path, client_configuration=configuration)
        return configuration

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        configuration = asyncio.run(load())
    else:  # called from a coroutine: the loader is async, so run it on a thread of its own
        import concurrent.futures

        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            configuration = pool.submit(asyncio.run, load()).result()
    authorization = (configuration.api_key or {}).get("authorization") or (configuration.api_key or {}).get(
        "BearerToken"
    )
    token = authorization.split(" ", 1)[1] if authorization and " " in authorization else authorization
    return kopf.ConnectionInfo(
        server=configuration.host,
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        token=token or None,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
        default_namespace=info.default_namespace,
    )


class Http:
    """The API server over one aiohttp session: JSON in, bytes out, an error answer raised as
    :class:`ApiError`. A ServiceAccount token is read again from its file when the kubelet
    rotates it (the file's mtime changes), as client-go does."""

    def __init__(self, info: kopf.ConnectionInfo, token_file: str | None = None, limit: int = 100) -> None:
        self.server = str(info.server).rstrip("/")
        self.headers = dict(info.as_http_headers())
        self.token_file = token_file
        self._token_mtime = os.stat(token_file).st_mtime if token_file and os.path.exists(token_file) else None
        ssl = info.as_ssl_context() if self.server.startswith("https:") else False
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=limit, ssl=ssl),
            proxy=info.proxy_url,
            trust_env=info.trust_env,
            timeout=aiohttp.ClientTimeout(),  # none by default; a call that must not hang says so
        )

    def _authorization(self) -> dict[str, str]:
        if self.token_file is not None:
            mtime: float | None
            try:
                mtime = os.stat(self.token_file).st_mtime
            except OSError:
                mtime = self._token_mtime
            if mtime != self._token_mtime:
                with open(self.token_file, encoding="utf-8") as f:
                    self.headers["Authorization"] = f"Bearer {f.read().strip()}"
                self._token_mtime = mtime
        return self.headers

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str | int] | None = None,
        body: Any = None,
        content_type: str = JSON,
        accept: str = JSON,
        timeout: float | None = None,
    ) -> bytes:
        """One call; its answer's bytes, or ApiError with the answer when it is not a 2xx."""
        headers = {**self._authorization(), "Accept": accept}
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body).encode("utf-8")
        async with self.session.request(
            method,
            self.server + path,
            params={k: str(v) for k, v in (query or {}).items()},
            data=data,
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=timeout) if timeout is not None else None,
        ) as response:
            answer = await response.read()
            if not 200 <= response.status <= 299:
                raise ApiError(response.status, response.reason, answer, dict(response.headers))
            return answer

    async def close(self) -> None:
        await self.session.close()


def _core(namespace: str, plural: str, name: str | None = None) -> str:
    base = f"/api/v1/namespaces/{namespace}/{plural}"
    return f"{base}/{name}" if name else base


def _custom(group: str, version: str, namespace: str | None, plural: str, name: str | None = None) -> str:
    base = f"/apis/{group}/{version}" + (f"/namespaces/{namespace}" if namespace else "") + f"/{plural}"
    return f"{base}/{name}" if name else base


#: The core kinds the operator creates as children, by kind: their plural in the core API.
CHILD_PLURALS = {"Pod": "pods", "Service": "services", "ConfigMap": "configmaps"}


@dataclass
class Kube:
    """A thin async facade over the Kubernetes API for the operator's few calls."""

    http: Http
    #: Told (verb, HTTP code) of every call that failed; not of the answers a call expects
    #: (404 on reads and deletes, 409 on creating a child): the operator's API error metric.
    on_error: Callable[[str, int], None] | None = None

    def _raise(self, verb: str, exc: ApiError, what: str) -> NoReturn:
        """Record a failed call; raise it as TransientError when retrying may help, else as is."""
        if self.on_error is not None:
            self.on_error(verb, exc.status)
        if _retryable(exc):
            raise _transient(exc, what) from exc
        raise exc

    @classmethod
    async def connect(cls, info: kopf.ConnectionInfo | None = None) -> Kube:
        """A client with ``info``'s credentials, else with those :func:`credentials` finds."""
        info = info or credentials()
        token_file = os.path.join(SERVICE_ACCOUNT_DIR, "token")
        in_pod = info.token is not None and os.path.exists(token_file) and info.ca_path is not None
        in_pod = in_pod and os.path.dirname(str(info.ca_path)) == SERVICE_ACCOUNT_DIR
        return cls(Http(info, token_file if in_pod else None))

    async def close(self) -> None:
        await self.http.close()

    async def _json(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = JSON,
        query: Mapping[str, str | int] | None = None,
    ) -> dict[str, Any]:
        """One call whose answer is read as plain JSON; errors raise ApiError."""
        data = await self.http.request(method, path, body=body, content_type=content_type, query=query)
        found: Any = json.loads(data) if data else {}
        return found if isinstance(found, dict) else {}

    # -- reads ---------------------------------------------------------------------------------

    async def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._get(JOBS, namespace, name)

    async def get_mount(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._get(MOUNTS, namespace, name)

    async def get_limits(self, namespace: str) -> dict[str, Any] | None:
        """The namespace's guard rails (the DGXLimits named default), or None when it has none. A
        cluster without the DGXLimits CRD answers 404 too: no limits."""
        return await self._get(LIMIT_OBJECTS, namespace, LIMITS_NAME)

    async def list_jobs(self, namespace: str) -> list[dict[str, Any]]:
        try:
            found = await self._json("GET", _custom(GROUP, VERSION, namespace, JOBS))
        except ApiError as exc:
            self._raise("list", exc, f"list {JOBS} in {namespace}")
        return list(found.get("items") or [])

    async def list_budgets(self, namespace: str) -> list[dict[str, Any]]:
        """The namespace's DGXBudgets (none on a cluster without the CRD: it answers 404)."""
        try:
            found = await self._json("GET", _custom(GROUP, VERSION, namespace, BUDGET_OBJECTS))
        except ApiError as exc:
            if exc.status == 404:
                return []
            self._raise("list", exc, f"list {BUDGET_OBJECTS} in {namespace}")
        return list(found.get("items") or [])

    async def get_budget(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._get(BUDGET_OBJECTS, namespace, name)

    async def patch_budget_status(
        self, namespace: str, name: str, resource_version: str | None, status: Mapping[str, Any]
    ) -> dict[str, Any]:
        """A budget's whole status (its ledger), guarded by the resourceVersion it was computed from: two
        writers (two jobs reserving, the budget's own pass) cannot both take the last room; the loser
        gets 409 and plans again with the fresh budget."""
        return await self.patch_job_status(namespace, name, resource_version, status, plural=BUDGET_OBJECTS)

    async def get_secret_data(self, namespace: str, name: str) -> dict[str, bytes] | None:
        """A Secret's decoded data, or None when it does not exist."""
        try:
            secret = await self._json("GET", _core(namespace, "secrets", name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            self._raise("get", exc, f"get secret {namespace}/{name}")
        return {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}

    async def pod_log_tail(
        self, namespace: str, name: str, container: str, *, lines: int, limit_bytes: int, timeout: float = 5.0
    ) -> str | None:
        """The last ``lines`` lines (at most ``limit_bytes``) a container printed, or None when they
        cannot be read now (the pod or container is gone or not started, the kubelet does not
        answer within ``timeout`` seconds, RBAC): a reader of logs is best-effort and never fails,
        nor holds up for long, a reconcile. The apiserver fetches logs from the node's kubelet,
        which a node that is unreachable (or a kwok node, which has none) may never answer."""
        try:
            data = await self.http.request(
                "GET",
                _core(namespace, "pods", name) + "/log",
                query={"container": container, "tailLines": lines, "limitBytes": limit_bytes},
                accept="*/*",
                timeout=timeout,
            )
        except ApiError as exc:
            log.debug("log of %s/%s (%s): %s %s", namespace, name, container, exc.status, exc.reason)
            return None
        except (TimeoutError, aiohttp.ClientError) as exc:
            log.debug("log of %s/%s (%s): %s", namespace, name, container, exc)
            return None
        return data.decode("utf-8", "replace")

    async def api_resources(self, group: str, version: str) -> list[dict[str, Any]]:
        """The resources an API group version serves (discovery); ApiError when it is not served."""
        found = await self._json("GET", f"/apis/{group}/{version}")
        return [r for r in found.get("resources") or [] if isinstance(r, dict)]

    async def dry_run_create_job(self, namespace: str, job: Mapping[str, Any]) -> None:
        """Would the apiserver create this DGXTrainingJob (schema, CEL rules, the webhook)? Returns
        when it would; its refusal raises ApiError (`kubedgx check-install`)."""
        await self.http.request(
            "POST", _custom(GROUP, VERSION, namespace, JOBS), body=dict(job), query={"dryRun": "All"}
        )

    async def _get(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        """One of our custom objects, or None when it does not exist."""
        try:
            obj = await self._json("GET", _custom(GROUP, VERSION, namespace, plural, name))
        except ApiError as exc:
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
        plural = CHILD_PLURALS[kind]
        try:
            await self.http.request("POST", _core(namespace, plural), body=dict(obj))
            return "created"
        except ApiError as exc:
            if exc.status != 409:
                self._raise("create", exc, f"create {kind} {namespace}/{name}")
        try:
            existing = await self._json("GET", _core(namespace, plural, name))
        except ApiError as exc:
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
        raised as the ApiError it is, for :func:`refusal` to classify. 409 means the name is
        taken, which the apiserver checks last: the object passed everything else."""
        kind, namespace = obj["kind"], obj["metadata"]["namespace"]
        try:
            await self.http.request(
                "POST", _core(namespace, CHILD_PLURALS[kind]), body=dict(obj), query={"dryRun": "All"}
            )
        except ApiError as exc:
            # Only the failures of the call itself count as API errors; a refusal is its answer.
            if self.on_error is not None and exc.status != 409 and refusal(exc) is None:
                self.on_error("create", exc.status)
            raise

    async def patch_pod_labels(self, namespace: str, name: str, labels: Mapping[str, str | None]) -> bool:
        """Merge ``labels`` into a pod's (None removes one); False if the pod is gone. Allowed on a
        pod being deleted: metadata stays writable until the object is removed."""
        call = self.http.request(
            "PATCH",
            _core(namespace, "pods", name),
            body={"metadata": {"labels": dict(labels)}},
            content_type=MERGE_PATCH,
        )
        return await self._unless_gone(call, "patch", f"patch Pod {namespace}/{name}")

    async def delete_config_map(self, namespace: str, name: str) -> bool:
        """Delete a ConfigMap (a superseded trainer config); False if it was already gone."""
        call = self.http.request("DELETE", _core(namespace, "configmaps", name))
        return await self._unless_gone(call, "delete", f"delete ConfigMap {namespace}/{name}")

    async def delete_pod(self, namespace: str, name: str) -> bool:
        """Delete a pod; False if it was already gone."""
        call = self.http.request("DELETE", _core(namespace, "pods", name))
        return await self._unless_gone(call, "delete", f"delete Pod {namespace}/{name}")

    async def _unless_gone(self, call: Awaitable[Any], verb: str, what: str) -> bool:
        """A write to an object that may have gone meanwhile: False on 404, errors as _raise says."""
        try:
            await call
        except ApiError as exc:
            if exc.status == 404:
                return False
            self._raise(verb, exc, what)
        return True

    async def delete_job(self, namespace: str, name: str) -> None:
        try:
            await self.http.request(
                "DELETE", _custom(GROUP, VERSION, namespace, JOBS, name), query={"propagationPolicy": "Background"}
            )
        except ApiError as exc:
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
            patched = await self._json(
                "PATCH", _custom(GROUP, VERSION, namespace, plural, name), {"metadata": meta}, content_type=MERGE_PATCH
            )
        except ApiError as exc:
            if exc.status == 404:
                return {}
            self._raise("patch", exc, f"patch finalizers of {plural} {namespace}/{name}")
        return patched

    # -- leader election (leader.py) -------------------------------------------------------------

    @staticmethod
    def _lease_path(namespace: str, name: str | None = None) -> str:
        base = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        return f"{base}/{name}" if name else base

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await self._json("GET", self._lease_path(namespace, name))
        except ApiError as exc:
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
        except ApiError as exc:
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
        except ApiError as exc:
            if exc.status in (404, 409):
                return None
            self._raise("update", exc, f"update lease {namespace}/{name}")

    # -- the self-signed webhook's certificate Secret and configuration (admission.py) -----------

    async def get_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await self._json("GET", f"/api/v1/namespaces/{namespace}/secrets/{name}")
        except ApiError as exc:
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
        except ApiError as exc:
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
        except ApiError as exc:
            if exc.status == 409:
                return False
            self._raise("create", exc, f"create secret {namespace}/{name}")
        return True

    async def create_webhook_configuration(self, body: Mapping[str, Any]) -> None:
        """Create the ValidatingWebhookConfiguration (run without the chart, which renders it)."""
        try:
            await self._json("POST", WEBHOOK_CONFIGURATIONS, dict(body))
        except ApiError as exc:
            if self.on_error is not None:
                self.on_error("create", exc.status)
            raise

    async def get_webhook_configuration(self, name: str) -> dict[str, Any] | None:
        try:
            return await self._json("GET", f"{WEBHOOK_CONFIGURATIONS}/{name}")
        except ApiError as exc:
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
        except ApiError as exc:
            if exc.status in (409, 422):
                return False
            self._raise("patch", exc, f"patch validatingwebhookconfiguration {name}")
        return True

    # -- Kueue (reconcile.queueing) ---------------------------------------------------------------

    async def served_version(self, group: str, known: tuple[str, ...]) -> str | None:
        """The version of ``group`` to speak: the server's preferred one if we know it, else the first
        of ``known`` it serves; None when the group is not served (Kueue not installed)."""
        try:
            found = await self._json("GET", f"/apis/{group}")
        except ApiError as exc:
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
            obj = await self._json("GET", _custom(group, version, None, plural, name))
        except ApiError as exc:
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
            await self.http.request("POST", _custom(group, version, namespace, "workloads"), body=dict(obj))
        except ApiError as exc:
            if exc.status == 409:
                return
            self._raise("create", exc, f"create Workload {namespace}/{obj['metadata']['name']}")

    async def delete_workload(self, api_version: str, namespace: str, name: str, uid: str) -> None:
        """Delete a Workload, that one only (uid precondition); gone already is fine."""
        group, version = api_version.split("/")
        try:
            await self.http.request(
                "DELETE",
                _custom(group, version, namespace, "workloads", name),
                body={"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}},
            )
        except ApiError as exc:
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
        path = _custom(group, version, namespace, "workloads", name) + ("/status" if status else "")
        try:
            await self.http.request("PATCH", path, body=body, content_type=MERGE_PATCH)
        except ApiError as exc:
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
            patched = await self._json(
                "PATCH", _custom(GROUP, VERSION, namespace, plural, name) + "/status", body, content_type=MERGE_PATCH
            )
        except ApiError as exc:
            self._raise("patch", exc, f"patch status of {plural} {namespace}/{name}")
        return patched
