"""The operator's own settings: what the Helm chart passes (flags or KUBEDGX_* variables), and
how they become kopf settings. Kept apart from handlers.py so that file stays wiring only.

Every setting is an environment variable (what the chart sets) and a flag of `kubedgx operator`
(flags win: `kubedgx operator` writes the flags given over the environment it parses). One
parser, :meth:`OperatorConfig.from_env`, checks them all and raises :class:`ConfigError` naming
the variable of the first bad value. docs/operator.md ("Running the operator") lists them.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, cast

import kopf

from dgx_datasync import trust
from dgx_operator.catalog import Catalog
from dgx_operator.leader import ElectionConfig, default_identity
from dgx_operator.render.names import JOB_LABEL
from dgx_operator.render.resolved import DEFAULT_TRAINER_IMAGE, Defaults

PREFIX = "kubedgx.io"

DEFAULT_METRICS_PORT = 8080
DEFAULT_HEALTH_PORT = 8081
DEFAULT_WEBHOOK_CONFIGURATION = "kubedgx"
#: The apiserver's default and the chart's: how long it waits for the webhook's answer.
DEFAULT_WEBHOOK_TIMEOUT_SECONDS = 10
#: The Lease the replicas elect their leader on, unless KUBEDGX_LEADER_ELECTION_ID names another.
DEFAULT_LEADER_ELECTION_ID = "kubedgx-operator"
#: The PriorityClasses the chart creates; KUBEDGX_PRIORITY_CLASSES replaces them ("" = none).
DEFAULT_PRIORITY_CLASSES: Mapping[str, str] = {"low": "kubedgx-low", "normal": "kubedgx-normal", "high": "kubedgx-high"}
PRIORITIES = ("low", "normal", "high")
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
FAILURE_POLICIES = ("Fail", "Ignore")
#: The core/v1 kinds of child the operator watches (kopf indexes in handlers.py): only those that
#: carry JOB_LABEL, selected by the API server (see :func:`configure`).
CHILD_RESOURCES = ("pods", "services", "configmaps")
#: Objects per page of kopf's initial LIST of every watched resource (limit/continue).
DEFAULT_LIST_CHUNK_SIZE = 500
#: Seconds a kopf per-object worker lingers after its last event (kopf's default: 5). While it
#: lingers it holds that event's whole body; in a burst of thousands of new pods those bodies were
#: tens of MB (docs/benchmarks.md). A new event simply starts a new worker.
WORKER_IDLE_TIMEOUT = 0.5
#: Where a pod finds its own namespace (the self-signed webhook's default KUBEDGX_WEBHOOK_NAMESPACE).
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
#: A duration as Kubernetes components take them (15s, 1m30s, 500ms), or plain seconds.
_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)(ms|s|m|h))+|\d+(?:\.\d+)?")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")

WebhookMode = Literal["certificate", "self-signed", "insecure"]
FailurePolicy = Literal["Fail", "Ignore"]
PullPolicy = Literal["Always", "IfNotPresent", "Never"]


class ConfigError(ValueError):
    """A bad setting. The message starts with the variable's name; `kubedgx operator` prints it and exits 2."""

    def __init__(self, variable: str, problem: str) -> None:
        super().__init__(f"{variable}: {problem}")
        self.variable = variable


@dataclass(frozen=True)
class WebhookConfig:
    """Where the validating webhook listens and how it gets TLS:

    * ``certificate``: ``certfile``/``pkeyfile`` mounted from a Secret (cert-manager's); the chart
      creates the ValidatingWebhookConfiguration and cert-manager injects its caBundle;
    * ``self-signed``: the replicas share a CA and serving certificate for the Service's DNS names,
      kept in the Secret ``secret`` (made by the first replica to find it empty), and set its CA as
      the caBundle of the chart's ValidatingWebhookConfiguration ``configuration``
      (:mod:`dgx_operator.webhookcert`);
    * ``insecure``: plain HTTP, for tests and a TLS-terminating proxy.

    The default mode follows the arguments: files given -> certificate, else insecure (tests)."""

    port: int = 9443
    host: str = "0.0.0.0"
    certfile: str | None = None
    pkeyfile: str | None = None
    insecure: bool = False
    self_signed: bool = False
    service: str | None = None
    namespace: str | None = None
    configuration: str = DEFAULT_WEBHOOK_CONFIGURATION
    failure_policy: FailurePolicy = "Fail"
    #: The Secret that holds the self-signed pair (self-signed mode); default ``<service>-tls``.
    secret: str | None = None
    #: The configuration's timeoutSeconds: the review's own deadlines (mount lookups, dry-runs) are
    #: fitted inside it, so the apiserver gets our answer rather than its timeout.
    timeout_seconds: int = DEFAULT_WEBHOOK_TIMEOUT_SECONDS
    #: Dry-run a job's children (worker 0, its Service and ConfigMap) against the apiserver at
    #: admission, so that `kubectl apply` refuses a job whose pods PodSecurity or a missing
    #: PriorityClass would refuse (admission.py); KUBEDGX_WEBHOOK_DRY_RUN=0 turns it off.
    dry_run: bool = True

    @property
    def mode(self) -> WebhookMode:
        if self.self_signed:
            return "self-signed"
        if self.certfile and self.pkeyfile and not self.insecure:
            return "certificate"
        return "insecure"

    @property
    def dns_names(self) -> tuple[str, ...]:
        """The names the API server uses for the Service (what a serving certificate must cover)."""
        if not self.service or not self.namespace:
            return ()
        base = f"{self.service}.{self.namespace}.svc"
        return base, f"{base}.cluster.local"


@dataclass(frozen=True)
class OperatorConfig:
    """Everything `kubedgx operator` is configured with. Built from the environment (and flags) by
    :meth:`from_env`; tests build it directly, where the servers default to off (no fixed ports)."""

    catalog_path: str | None = None
    trainer_image: str = DEFAULT_TRAINER_IMAGE
    datasync_image: str | None = None
    cache_root: str = Defaults.cache_root
    priority_classes: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_PRIORITY_CLASSES))
    image_pull_policy: PullPolicy = "IfNotPresent"
    #: Namespaces to watch; empty: every namespace (clusterwide).
    namespaces: tuple[str, ...] = ()
    #: Prometheus /metrics on 0.0.0.0:<port>; 0: no metrics server (the metrics are still kept).
    metrics_port: int = 0
    #: kopf's liveness endpoint on 0.0.0.0:<port>/healthz (used by the CLI); 0: none.
    health_port: int = 0
    #: Seconds; an integer, since the API server rejects timeoutSeconds=300.0 with 400.
    watch_timeout: int = 300
    request_timeout: float = 30.0
    #: kopf's initial LISTs ask for pages of this many objects, so that neither the API server nor
    #: the operator builds one response of every object at once; 0: one unpaged LIST.
    list_chunk_size: int = DEFAULT_LIST_CHUNK_SIZE
    webhook: WebhookConfig | None = None
    event_component: str = "kubedgx-operator"
    #: kopf's delays between retries of failed API calls, and the first delay of the
    #: controller's own per-job backoff (doubling up to 60 s). Tests shorten both.
    error_backoffs: tuple[float, ...] = (1, 2, 4, 8, 15, 30)
    retry_base: float = 1.0
    #: Kueue's job integration for DGXTrainingJob (reconcile.queueing): a job with the
    #: kueue.x-k8s.io/queue-name label gets a Workload and runs only once Kueue admits it.
    #: KUBEDGX_KUEUE, on unless set to 0; off here so that tests opt in.
    kueue: bool = False
    #: Manage jobs without the label too (they go to the LocalQueue "default"), as Kueue's
    #: manageJobsWithoutQueueName does for its built-in kinds.
    kueue_manage_without_queue_name: bool = False
    #: The address the health, metrics and webhook servers listen on (KUBEDGX_BIND_ADDRESS).
    bind_address: str = "0.0.0.0"
    #: Several replicas, one of which (the holder of this Lease) reconciles; None: this process
    #: reconciles (one replica, or a local run). See :mod:`dgx_operator.leader`.
    leader_election: ElectionConfig | None = None
    #: Seconds between SIGTERM and the end of serving: the replica reports not ready and hands its
    #: leadership over at once, but goes on answering admission reviews while the endpoint's removal
    #: reaches the apiserver (a rolling update then refuses no write).
    shutdown_delay: float = 0.0
    #: Seconds between the checkpoint sidecars' scans (KUBEDGX_CHECKPOINT_SYNC_INTERVAL): how long
    #: a complete checkpoint may wait on the node before it starts uploading.
    checkpoint_sync_interval: float = 30.0
    #: PEM of the private CAs that sign object stores' certificates (KUBEDGX_CA_BUNDLE names the file,
    #: read once at startup): added to the default trust of the operator's own listings and passed to
    #: every data sync container (dgx_datasync.trust). Certificates only; None: the defaults alone.
    ca_bundle: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> OperatorConfig:
        """The configuration the KUBEDGX_* variables describe (unset or empty: the default).
        Raises :class:`ConfigError` for the first bad value."""
        env = _Env(os.environ if environ is None else environ)
        return cls(
            catalog_path=env.text("KUBEDGX_CATALOG"),
            trainer_image=env.image("KUBEDGX_TRAINER_IMAGE") or DEFAULT_TRAINER_IMAGE,
            datasync_image=env.image("KUBEDGX_DATASYNC_IMAGE"),
            cache_root=env.absolute_path("KUBEDGX_CACHE_ROOT") or Defaults.cache_root,
            priority_classes=env.priority_classes("KUBEDGX_PRIORITY_CLASSES"),
            image_pull_policy=cast(PullPolicy, env.choice("KUBEDGX_IMAGE_PULL_POLICY", PULL_POLICIES, "IfNotPresent")),
            namespaces=env.namespaces("KUBEDGX_WATCH_NAMESPACES"),
            metrics_port=env.port("KUBEDGX_METRICS_PORT", DEFAULT_METRICS_PORT),
            health_port=env.port("KUBEDGX_HEALTH_PORT", DEFAULT_HEALTH_PORT),
            webhook=env.webhook(),
            kueue=env.flag("KUBEDGX_KUEUE", default=True),
            kueue_manage_without_queue_name=env.flag("KUBEDGX_KUEUE_MANAGE_JOBS_WITHOUT_QUEUE_NAME"),
            bind_address=env.address("KUBEDGX_BIND_ADDRESS") or "0.0.0.0",
            leader_election=env.leader_election(),
            shutdown_delay=env.duration("KUBEDGX_SHUTDOWN_DELAY", 0.0),
            checkpoint_sync_interval=env.duration("KUBEDGX_CHECKPOINT_SYNC_INTERVAL", 30.0, positive=True),
            ca_bundle=env.ca_bundle("KUBEDGX_CA_BUNDLE"),
        )

    def catalog(self) -> Catalog:
        return Catalog.load(self.catalog_path)

    def defaults(self) -> Defaults:
        return Defaults(
            trainer_image=self.trainer_image,
            datasync_image=self.datasync_image,
            cache_root=self.cache_root,
            priority_classes=dict(self.priority_classes),
            image_pull_policy=self.image_pull_policy,
            ca_bundle_pem=self.ca_bundle,
            checkpoint_sync_interval=self.checkpoint_sync_interval,
        )


class _Env:
    """Typed reads of the environment; each raises ConfigError naming its variable."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.environ = environ

    def text(self, name: str) -> str | None:
        value = (self.environ.get(name) or "").strip()
        return value or None

    def image(self, name: str) -> str | None:
        value = self.text(name)
        if value is not None and any(c.isspace() for c in value):
            raise ConfigError(name, f"an image reference has no spaces, got {value!r}")
        return value

    def absolute_path(self, name: str) -> str | None:
        value = self.text(name)
        if value is not None and not value.startswith("/"):
            raise ConfigError(name, f"must be an absolute path, got {value!r}")
        return value

    def flag(self, name: str, *, default: bool = False) -> bool:
        value = (self.environ.get(name) or "").strip().lower()
        if not value:
            return default
        if value in _TRUE:
            return True
        if value in _FALSE:
            return False
        raise ConfigError(name, f"must be 1 or 0 (true/false), got {self.environ[name]!r}")

    def port(self, name: str, default: int, *, allow_zero: bool = True) -> int:
        value = self.text(name)
        if value is None:
            return default
        low = 0 if allow_zero else 1
        if not value.isdigit() or not low <= int(value) <= 65535:
            raise ConfigError(name, f"must be a port number {low}-65535, got {value!r}")
        return int(value)

    def duration(self, name: str, default: float, *, positive: bool = False) -> float:
        value = self.text(name)
        if value is None:
            return default
        if not _DURATION.fullmatch(value):
            raise ConfigError(name, f"must be a duration such as 15s, 1m30s or 500ms, got {value!r}")
        parts = _DURATION_PART.findall(value)
        seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in parts) if parts else float(value)
        if positive and seconds <= 0:
            raise ConfigError(name, f"must be longer than 0, got {value!r}")
        return seconds

    def address(self, name: str) -> str | None:
        value = self.text(name)
        if value is not None:
            try:
                ipaddress.ip_address(value)
            except ValueError:
                raise ConfigError(name, f"must be an IP address to listen on (0.0.0.0: all), got {value!r}") from None
        return value

    def ca_bundle(self, name: str) -> str | None:
        """The CA certificates in the PEM file ``name`` points to, checked now: a bundle that cannot
        be used would otherwise fail every listing and every sync container of every job."""
        path = self.text(name)
        if path is None:
            return None
        if not path.startswith("/"):
            raise ConfigError(name, f"must be the absolute path of a PEM file, got {path!r}")
        try:
            with open(path, encoding="utf-8") as handle:
                text = handle.read(trust.MAX_BYTES + 1)
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(name, f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
        try:
            return trust.certificates(text)
        except ValueError as exc:
            raise ConfigError(name, f"{path} {exc}") from None

    def leader_election(self) -> ElectionConfig | None:
        """Only with KUBEDGX_LEADER_ELECTION=1; the Lease is in the operator's own namespace unless
        KUBEDGX_LEADER_ELECTION_NAMESPACE names another."""
        on = self.flag("KUBEDGX_LEADER_ELECTION")
        name = self.name("KUBEDGX_LEADER_ELECTION_ID", _DNS_SUBDOMAIN, 253, "Lease name")
        namespace = self.name("KUBEDGX_LEADER_ELECTION_NAMESPACE", _DNS_LABEL, 63, "namespace name")
        durations = {
            field: self.duration(f"KUBEDGX_LEADER_ELECTION_{suffix}", default, positive=True)
            for field, suffix, default in (
                ("lease_duration", "LEASE_DURATION", 15.0),
                ("renew_deadline", "RENEW_DEADLINE", 10.0),
                ("retry_period", "RETRY_PERIOD", 2.0),
            )
        }
        if not on:
            return None
        namespace = namespace or _own_namespace()
        if namespace is None:
            raise ConfigError(
                "KUBEDGX_LEADER_ELECTION_NAMESPACE",
                f"required with KUBEDGX_LEADER_ELECTION=1 (no {SERVICE_ACCOUNT_NAMESPACE}: not in a pod)",
            )
        config = ElectionConfig(
            namespace=namespace,
            name=name or DEFAULT_LEADER_ELECTION_ID,
            identity=default_identity(self.environ),
            **durations,
        )
        problems = config.problems()
        if problems:
            raise ConfigError("KUBEDGX_LEADER_ELECTION_LEASE_DURATION", "; ".join(problems))
        return config

    def choice(self, name: str, choices: tuple[str, ...], default: str) -> str:
        value = self.text(name)
        if value is None:
            return default
        if value not in choices:
            raise ConfigError(name, f"must be one of {', '.join(choices)}, got {value!r}")
        return value

    def name(self, name: str, pattern: re.Pattern[str], limit: int, what: str) -> str | None:
        value = self.text(name)
        if value is not None and (len(value) > limit or not pattern.fullmatch(value)):
            raise ConfigError(name, f"{value!r} is not a {what}")
        return value

    def namespaces(self, name: str) -> tuple[str, ...]:
        items = [item.strip() for item in (self.environ.get(name) or "").split(",")]
        found: list[str] = []
        for item in filter(None, items):
            if len(item) > 63 or not _DNS_LABEL.fullmatch(item):
                raise ConfigError(name, f"{item!r} is not a namespace name (comma-separated names, empty for all)")
            if item not in found:
                found.append(item)
        return tuple(found)

    def priority_classes(self, name: str) -> dict[str, str]:
        """``low=a,normal=b,high=c``; a priority left out gets no priorityClassName; "" for none at all."""
        value = self.environ.get(name)
        if value is None:
            return dict(DEFAULT_PRIORITY_CLASSES)
        mapping: dict[str, str] = {}
        for item in filter(None, (part.strip() for part in value.split(","))):
            key, sep, class_name = (s.strip() for s in item.partition("="))
            if not sep or key not in PRIORITIES:
                raise ConfigError(
                    name, f"{item!r}: expected PRIORITY=CLASS with PRIORITY one of {', '.join(PRIORITIES)}"
                )
            if key in mapping:
                raise ConfigError(name, f"priority {key!r} is given twice")
            if len(class_name) > 253 or not _DNS_SUBDOMAIN.fullmatch(class_name):
                raise ConfigError(name, f"{class_name!r} (for {key}) is not a PriorityClass name")
            mapping[key] = class_name
        return mapping

    def webhook(self) -> WebhookConfig | None:
        port = self.port("KUBEDGX_WEBHOOK_PORT", 0, allow_zero=False)
        certfile, pkeyfile = self.text("KUBEDGX_WEBHOOK_CERT"), self.text("KUBEDGX_WEBHOOK_KEY")
        self_signed, insecure = self.flag("KUBEDGX_WEBHOOK_SELF_SIGNED"), self.flag("KUBEDGX_WEBHOOK_INSECURE")
        policy = self.choice("KUBEDGX_WEBHOOK_FAILURE_POLICY", FAILURE_POLICIES, "Fail")
        configuration = self.name(
            "KUBEDGX_WEBHOOK_CONFIGURATION", _DNS_SUBDOMAIN, 253, "ValidatingWebhookConfiguration name"
        )
        service = self.name("KUBEDGX_WEBHOOK_SERVICE", _DNS_LABEL, 63, "Service name")
        namespace = self.name("KUBEDGX_WEBHOOK_NAMESPACE", _DNS_LABEL, 63, "namespace name")
        secret = self.name("KUBEDGX_WEBHOOK_SECRET", _DNS_SUBDOMAIN, 253, "Secret name")
        timeout = self.text("KUBEDGX_WEBHOOK_TIMEOUT_SECONDS")
        if timeout is not None and (not timeout.isdigit() or not 1 <= int(timeout) <= 30):
            raise ConfigError(
                "KUBEDGX_WEBHOOK_TIMEOUT_SECONDS", f"must be 1-30 (the apiserver's bounds), got {timeout!r}"
            )
        host = self.address("KUBEDGX_BIND_ADDRESS") or "0.0.0.0"
        dry_run = self.flag("KUBEDGX_WEBHOOK_DRY_RUN") if self.text("KUBEDGX_WEBHOOK_DRY_RUN") else True
        if not port:
            return None
        if bool(certfile) != bool(pkeyfile):
            missing = "KUBEDGX_WEBHOOK_KEY" if certfile else "KUBEDGX_WEBHOOK_CERT"
            raise ConfigError(missing, "must be set too: the certificate and its key go together")
        modes = [
            mode
            for mode, chosen in (
                ("KUBEDGX_WEBHOOK_CERT/KEY", certfile is not None),
                ("KUBEDGX_WEBHOOK_SELF_SIGNED=1", self_signed),
                ("KUBEDGX_WEBHOOK_INSECURE=1", insecure),
            )
            if chosen
        ]
        if len(modes) != 1:
            problem = "choose one of" if modes else "is set, so choose how to serve it:"
            raise ConfigError(
                "KUBEDGX_WEBHOOK_PORT",
                f"{problem} KUBEDGX_WEBHOOK_CERT and KUBEDGX_WEBHOOK_KEY (files), KUBEDGX_WEBHOOK_SELF_SIGNED=1"
                + " or KUBEDGX_WEBHOOK_INSECURE=1"
                + (f" (got {' and '.join(modes)})" if modes else ""),
            )
        if self_signed:
            if service is None:
                raise ConfigError("KUBEDGX_WEBHOOK_SERVICE", "required with KUBEDGX_WEBHOOK_SELF_SIGNED=1")
            namespace = namespace or _own_namespace()
            if namespace is None:
                raise ConfigError(
                    "KUBEDGX_WEBHOOK_NAMESPACE",
                    f"required with KUBEDGX_WEBHOOK_SELF_SIGNED=1 (no {SERVICE_ACCOUNT_NAMESPACE}: not in a pod)",
                )
        return WebhookConfig(
            port=port,
            host=host,
            certfile=certfile,
            pkeyfile=pkeyfile,
            insecure=insecure,
            self_signed=self_signed,
            service=service,
            namespace=namespace,
            configuration=configuration or DEFAULT_WEBHOOK_CONFIGURATION,
            failure_policy=cast(FailurePolicy, policy),
            secret=(secret or f"{service}-tls") if self_signed else None,
            timeout_seconds=int(timeout) if timeout is not None else DEFAULT_WEBHOOK_TIMEOUT_SECONDS,
            dry_run=dry_run,
        )


def _own_namespace() -> str | None:
    try:
        with open(SERVICE_ACCOUNT_NAMESPACE, encoding="utf-8") as handle:
            return handle.read().strip() or None
    except OSError:
        return None


def configure(settings: kopf.OperatorSettings, config: OperatorConfig) -> None:
    """Our finalizer and annotation prefix, bounded watches and requests, quick error backoffs, and
    watches of children that scale with kubedgx's objects rather than with the cluster's.

    The handlers' ``labels=`` filters are applied by kopf after it has received an object: without a
    server-side selector, kopf lists and watches every pod, Service and ConfigMap of the cluster and
    keeps per-object state for each (thousands of other workloads' pods in a real cluster). So the API
    server is asked for only those with our job label, on the initial LIST and on every WATCH; the
    handlers keep their client-side filters as well. The selector is keyed by group and version
    (core v1) so that it never narrows a custom resource that happens to share a plural. The initial
    LISTs (children, jobs, mounts) are paged, which bounds the size of each response, and kopf's
    per-object workers let go of their last body soon (WORKER_IDLE_TIMEOUT).

    The webhook server is set up by the startup handler (it needs the API client in self-signed mode)."""
    # The controller adds and removes our finalizer itself (one write, no diff-base annotation);
    # kopf's own, should any handler ever need one, gets our prefix too.
    settings.persistence.finalizer = f"{PREFIX}/kopf-finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=PREFIX, key="last-handled-configuration"
    )
    settings.posting.reporting_component = config.event_component
    settings.posting.event_name_prefix = "kubedgx-"
    settings.posting.level = logging.INFO
    settings.watching.server_timeout = config.watch_timeout
    settings.watching.client_timeout = config.watch_timeout + 30
    settings.watching.connect_timeout = 10
    for plural in CHILD_RESOURCES:
        settings.watching.label_selectors["", "v1", plural] = JOB_LABEL
    settings.watching.chunk_size = config.list_chunk_size or None
    settings.queueing.idle_timeout = WORKER_IDLE_TIMEOUT
    settings.networking.request_timeout = config.request_timeout
    settings.networking.connect_timeout = 10
    settings.networking.error_backoffs = config.error_backoffs
    settings.queueing.error_delays = (*config.error_backoffs, 60)
