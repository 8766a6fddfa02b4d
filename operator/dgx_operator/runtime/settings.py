"""The operator's own settings: what the Helm chart passes (flags or KUBEDGX_* variables), and
how they become kopf settings. Kept apart from handlers.py so that file stays wiring only.

Every setting is declared once, in :data:`SETTINGS`: its variable, type, default, the
:class:`OperatorConfig` field it fills, what it means, the chart value that sets it and its flag of
`kubedgx operator` (flags win: `kubedgx operator` writes the flags given over the environment it
parses). One parser, :meth:`OperatorConfig.from_env`, reads them all through that table and raises
:class:`ConfigError` naming the variable of the first bad value; :func:`read_flag` reads one flag
through the same parser. docs/operator.md's table ("Running the operator") is generated from the
table (``python -m dgx_operator.runtime.settings docs/operator.md``), and tests/unit/test_settings_declared_once.py
checks the chart, the CLI and the sources against it.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import kopf
import yaml
from pydantic import ValidationError

from dgx_datasync import trust
from dgx_operator.api.limits import LimitsSpec
from dgx_operator.catalog import Catalog
from dgx_operator.render.names import JOB_LABEL
from dgx_operator.render.resolved import DEFAULT_TRAINER_IMAGE, Defaults
from dgx_operator.runtime.leader import ElectionConfig, default_identity
from dgx_operator.webhook.config import (
    DEFAULT_WEBHOOK_CONFIGURATION,
    DEFAULT_WEBHOOK_TIMEOUT_SECONDS,
    FAILURE_POLICIES,
    WebhookConfig,
)

PREFIX = "kubedgx.io"

DEFAULT_METRICS_PORT = 8080
DEFAULT_HEALTH_PORT = 8081
#: The Lease the replicas elect their leader on, unless KUBEDGX_LEADER_ELECTION_ID names another.
DEFAULT_LEADER_ELECTION_ID = "kubedgx-operator"
#: The PriorityClasses the chart creates; KUBEDGX_PRIORITY_CLASSES replaces them ("" = none).
DEFAULT_PRIORITY_CLASSES: Mapping[str, str] = {"low": "kubedgx-low", "normal": "kubedgx-normal", "high": "kubedgx-high"}
PRIORITIES = ("low", "normal", "high")
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
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

PullPolicy = Literal["Always", "IfNotPresent", "Never"]


class ConfigError(ValueError):
    """A bad setting. The message starts with the variable's name; `kubedgx operator` prints it and exits 2."""

    def __init__(self, variable: str, problem: str) -> None:
        super().__init__(f"{variable}: {problem}")
        self.variable = variable


# -- the settings, each declared once ------------------------------------------------------------

#: How a kind reads its variable: (environment, variable, default) -> value; unset or empty gives the
#: default, a bad value raises ConfigError naming the variable.
Reader = Callable[["_Env", str, Any], Any]


def _code(value: Any) -> str:
    return f"`{value}`"


@dataclass(frozen=True)
class Kind:
    """A type of setting: how its docs row names it, how a value of it is read (one parser per type:
    every variable of a type is refused with the same words) and how its default is shown."""

    name: str
    read: Reader
    show: Callable[[Any], str] = _code


def _port(*, allow_zero: bool = True) -> Kind:
    return Kind(
        "port" if allow_zero else "port (1-65535)",
        lambda env, name, default: env.port(name, default, allow_zero=allow_zero),
    )


def _duration(*, positive: bool = False) -> Kind:
    return Kind(
        "duration > 0" if positive else "duration",
        lambda env, name, default: env.duration(name, default, positive=positive),
        lambda seconds: f"`{seconds:g}s`",
    )


def _choice(choices: tuple[str, ...]) -> Kind:
    return Kind(" or ".join(choices), lambda env, name, default: env.choice(name, choices, default))


def _name(pattern: re.Pattern[str], limit: int, what: str) -> Kind:
    return Kind(what, lambda env, name, default: env.name(name, pattern, limit, what) or default)


FLAG = Kind("flag", lambda env, name, default: env.flag(name, default=default), lambda on: "`1`" if on else "`0`")
FILE = Kind("file", lambda env, name, default: env.text(name) or default)
IMAGE = Kind("image", lambda env, name, default: env.image(name) or default)
ABSOLUTE_PATH = Kind("absolute path", lambda env, name, default: env.absolute_path(name) or default)
ADDRESS = Kind("IP address", lambda env, name, default: env.address(name) or default)
NAMESPACES = Kind("namespaces, comma-separated", lambda env, name, default: env.namespaces(name) or default)
PRIORITY_MAP = Kind(
    "low=CLASS,normal=CLASS,high=CLASS",
    lambda env, name, default: env.priority_classes(name, default),
    lambda mapping: _code(",".join(f"{k}={v}" for k, v in mapping.items())),
)
PEM_FILE = Kind("PEM file (absolute path)", lambda env, name, default: env.ca_bundle(name) or default)
LIMITS_FILE = Kind("YAML file (absolute path)", lambda env, name, default: env.limits(name) or default)
WEBHOOK_SECONDS = Kind("seconds (1-30)", lambda env, name, default: env.webhook_timeout(name, default))


@dataclass(frozen=True)
class Setting:
    """One setting of the operator, declared once: the variable the chart sets, its kind (which parser
    reads it), its default (what the field gets when the variable is unset or empty), the
    :class:`OperatorConfig` field it fills, a one-line description, the chart value that sets it and
    the `kubedgx operator` flag that overrides it.

    ``field`` is a field of OperatorConfig, or ``group.field`` for a field of the WebhookConfig or
    ElectionConfig that fills the field ``group`` (:data:`_COMBINE` builds those), or ``group`` alone
    for the flag that turns the group on. ``chart``: the value of charts/kubedgx/values.yaml that
    decides what the chart's Deployment sets (None: the chart never sets it; ``extraEnv`` can).
    ``unset``: what an unset variable means, for the docs, where the default value does not say it."""

    variable: str
    kind: Kind
    default: Any
    field: str
    description: str
    chart: str | None = None
    flag: str | None = None
    unset: str | None = None

    def read(self, env: _Env) -> Any:
        return self.kind.read(env, self.variable, self.default)

    @property
    def shown_default(self) -> str:
        if self.unset is not None:
            return self.unset
        return "—" if self.default is None else self.kind.show(self.default)


#: Every setting, in the order :meth:`OperatorConfig.from_env` checks them (the first bad one is the
#: one reported), which is also the order of docs/operator.md's table.
SETTINGS: tuple[Setting, ...] = (
    Setting(
        "KUBEDGX_CATALOG",
        FILE,
        None,
        "catalog_path",
        "instance catalog YAML (the chart mounts its `catalog` value, a ConfigMap, at"
        " `/etc/kubedgx/catalog/catalog.yaml`)",
        chart="catalog",
        flag="--catalog",
        unset="built-in catalog",
    ),
    Setting(
        "KUBEDGX_LIMITS",
        LIMITS_FILE,
        None,
        "limits",
        "cluster-wide guard rails for jobs, the fields of a DGXLimits spec (docs/cost.md), read once at startup"
        " (a file the schema refuses: exit 2 naming this variable); a namespace's DGXLimits narrows them (the"
        " chart mounts its `limits` value, a ConfigMap, at `/etc/kubedgx/limits/limits.yaml` when it sets any)",
        chart="limits",
        flag="--limits",
        unset="no cluster-wide limits",
    ),
    Setting(
        "KUBEDGX_TRAINER_IMAGE",
        IMAGE,
        DEFAULT_TRAINER_IMAGE,
        "trainer_image",
        "trainer image of jobs without `spec.image`",
        chart="trainer.image",
        flag="--trainer-image",
    ),
    Setting(
        "KUBEDGX_DATASYNC_IMAGE",
        IMAGE,
        None,
        "datasync_image",
        "image of the data sync containers",
        chart="dataSync.image",
        flag="--datasync-image",
        unset="the trainer image",
    ),
    Setting(
        "KUBEDGX_SCHEDULER_NAME",
        _name(_DNS_SUBDOMAIN, 253, "scheduler profile name"),
        None,
        "scheduler_name",
        "`spec.schedulerName` of every worker: a profile of the cluster's kube-scheduler, such as one that packs"
        " GPU nodes so jobs of fewer GPUs fill partly used nodes first (docs/sharing.md)",
        chart="scheduling.schedulerName",
        flag="--scheduler-name",
        unset="the cluster's default scheduler",
    ),
    Setting(
        "KUBEDGX_CACHE_ROOT",
        ABSOLUTE_PATH,
        Defaults.cache_root,
        "cache_root",
        "node-local data cache: `<root>/<namespace>/<mount>/`",
        chart="dataMounts.cacheRoot",
        flag="--cache-root",
    ),
    Setting(
        "KUBEDGX_PRIORITY_CLASSES",
        PRIORITY_MAP,
        DEFAULT_PRIORITY_CLASSES,
        "priority_classes",
        '`spec.priority` -> PriorityClass; a priority left out, or `""` for all, gets no `priorityClassName`'
        ' (the chart: `""` with `priorityClasses.enabled: false`)',
        chart="priorityClasses.enabled",
        flag="--priority-classes",
    ),
    Setting(
        "KUBEDGX_IMAGE_PULL_POLICY",
        _choice(PULL_POLICIES),
        "IfNotPresent",
        "image_pull_policy",
        "`imagePullPolicy` of every container the operator creates",
        chart="trainer.imagePullPolicy",
        flag="--image-pull-policy",
    ),
    Setting(
        "KUBEDGX_WATCH_NAMESPACES",
        NAMESPACES,
        (),
        "namespaces",
        "namespaces to watch; empty: clusterwide (the flag is repeatable; `-A`: every namespace)",
        chart="watchNamespaces",
        flag="--namespace",
        unset="all namespaces",
    ),
    Setting(
        "KUBEDGX_METRICS_PORT",
        _port(),
        DEFAULT_METRICS_PORT,
        "metrics_port",
        "Prometheus `/metrics` on this port; `0`: off (the chart: `0` with `metrics.enabled: false`)",
        chart="metrics.port",
        flag="--metrics-port",
    ),
    Setting(
        "KUBEDGX_HEALTH_PORT",
        _port(),
        DEFAULT_HEALTH_PORT,
        "health_port",
        "`GET /healthz` (liveness) and `GET /readyz` (readiness) on this port; `0`: off",
        chart="health.port",
        flag="--health-port",
    ),
    Setting(
        "KUBEDGX_WEBHOOK_PORT",
        _port(allow_zero=False),
        0,
        "webhook.port",
        "serve the validating webhook on this port; needs one of the modes: `KUBEDGX_WEBHOOK_CERT` and"
        ' `KUBEDGX_WEBHOOK_KEY`, `KUBEDGX_WEBHOOK_SELF_SIGNED` or `KUBEDGX_WEBHOOK_INSECURE` ("Webhook modes" below)',
        chart="webhook.port",
        flag="--webhook-port",
        unset="no webhook",
    ),
    Setting(
        "KUBEDGX_WEBHOOK_CERT",
        FILE,
        None,
        "webhook.certfile",
        "certificate mode: the TLS certificate, with `KUBEDGX_WEBHOOK_KEY` (the chart: cert-manager's, with"
        " `webhook.certManager.enabled`)",
        chart="webhook.certManager.enabled",
        flag="--webhook-cert",
    ),
    Setting(
        "KUBEDGX_WEBHOOK_KEY",
        FILE,
        None,
        "webhook.pkeyfile",
        "certificate mode: the certificate's private key",
        chart="webhook.certManager.enabled",
        flag="--webhook-key",
    ),
    Setting(
        "KUBEDGX_WEBHOOK_SELF_SIGNED",
        FLAG,
        False,
        "webhook.self_signed",
        "self-signed mode: the replicas share a CA and certificate and set the `caBundle` (the chart: unless"
        " `webhook.certManager.enabled`)",
        chart="webhook.certManager.enabled",
        flag="--webhook-self-signed",
    ),
    Setting(
        "KUBEDGX_WEBHOOK_INSECURE",
        FLAG,
        False,
        "webhook.insecure",
        "plain HTTP, for tests or a TLS-terminating proxy",
        flag="--webhook-insecure",
    ),
    Setting(
        "KUBEDGX_WEBHOOK_FAILURE_POLICY",
        _choice(FAILURE_POLICIES),
        "Fail",
        "webhook.failure_policy",
        "self-signed mode: its `failurePolicy` when the operator has to create the configuration (run"
        " without the chart)",
        chart="webhook.failurePolicy",
        flag="--webhook-failure-policy",
    ),
    Setting(
        "KUBEDGX_WEBHOOK_CONFIGURATION",
        _name(_DNS_SUBDOMAIN, 253, "ValidatingWebhookConfiguration name"),
        DEFAULT_WEBHOOK_CONFIGURATION,
        "webhook.configuration",
        "self-signed mode: the ValidatingWebhookConfiguration whose `caBundle` the replicas set (the chart:"
        " `<fullname>-webhook`, which it renders)",
        chart="webhook.certManager.enabled",
        flag="--webhook-configuration",
    ),
    Setting(
        "KUBEDGX_WEBHOOK_SERVICE",
        _name(_DNS_LABEL, 63, "Service name"),
        None,
        "webhook.service",
        "self-signed mode (required): the webhook's Service, whose DNS names the certificate covers",
        chart="webhook.certManager.enabled",
        flag="--webhook-service",
    ),
    Setting(
        "KUBEDGX_WEBHOOK_NAMESPACE",
        _name(_DNS_LABEL, 63, "namespace name"),
        None,
        "webhook.namespace",
        "self-signed mode: the Service's namespace",
        chart="webhook.certManager.enabled",
        flag="--webhook-namespace",
        unset="the pod's namespace",
    ),
    Setting(
        "KUBEDGX_WEBHOOK_SECRET",
        _name(_DNS_SUBDOMAIN, 253, "Secret name"),
        None,
        "webhook.secret",
        "self-signed mode: the Secret the replicas share the certificate in",
        chart="webhook.certManager.enabled",
        flag="--webhook-secret",
        unset="`<service>-tls`",
    ),
    Setting(
        "KUBEDGX_WEBHOOK_TIMEOUT_SECONDS",
        WEBHOOK_SECONDS,
        DEFAULT_WEBHOOK_TIMEOUT_SECONDS,
        "webhook.timeout_seconds",
        "the configuration's `timeoutSeconds`: the review's own lookups are fitted inside it",
        chart="webhook.timeoutSeconds",
        flag="--webhook-timeout-seconds",
    ),
    Setting(
        "KUBEDGX_BIND_ADDRESS",
        ADDRESS,
        "0.0.0.0",
        "bind_address",
        "the address the health, metrics and webhook servers listen on",
        flag="--bind-address",
    ),
    Setting(
        "KUBEDGX_WEBHOOK_DRY_RUN",
        FLAG,
        True,
        "webhook.dry_run",
        'dry-run a job\'s children against the apiserver at admission ("The children, dry-run" above)',
        flag="--[no-]webhook-dry-run",
    ),
    Setting(
        "KUBEDGX_KUEUE",
        FLAG,
        True,
        "kueue",
        "Kueue's job integration ([kueue.md](kueue.md)); `0`: Kueue's objects are not watched",
        chart="kueue.enabled",
    ),
    Setting(
        "KUBEDGX_KUEUE_MANAGE_JOBS_WITHOUT_QUEUE_NAME",
        FLAG,
        False,
        "kueue_manage_without_queue_name",
        "queue jobs without the `kueue.x-k8s.io/queue-name` label too, in the LocalQueue `default` of their"
        " namespace (Kueue's manageJobsWithoutQueueName)",
        chart="kueue.manageJobsWithoutQueueName",
    ),
    Setting(
        "KUBEDGX_LEADER_ELECTION",
        FLAG,
        False,
        "leader_election",
        'elect one replica on a Lease to reconcile; every replica serves admission ("High availability" below)',
        chart="leaderElection.enabled",
        flag="--[no-]leader-elect",
    ),
    Setting(
        "KUBEDGX_LEADER_ELECTION_ID",
        _name(_DNS_SUBDOMAIN, 253, "Lease name"),
        DEFAULT_LEADER_ELECTION_ID,
        "leader_election.name",
        "the Lease's name (the chart: `<fullname>-leader`, which it renders)",
        chart="leaderElection.enabled",
        flag="--leader-election-id",
    ),
    Setting(
        "KUBEDGX_LEADER_ELECTION_NAMESPACE",
        _name(_DNS_LABEL, 63, "namespace name"),
        None,
        "leader_election.namespace",
        "the Lease's namespace (the chart: the release namespace)",
        chart="leaderElection.enabled",
        flag="--leader-election-namespace",
        unset="the pod's namespace",
    ),
    Setting(
        "KUBEDGX_LEADER_ELECTION_LEASE_DURATION",
        _duration(positive=True),
        15.0,
        "leader_election.lease_duration",
        "how long a Lease lasts unrenewed; client-go's rule: lease duration > renew deadline > 1.2 × retry"
        " period, else exit 2 naming this variable",
        chart="leaderElection.leaseDuration",
        flag="--leader-election-lease-duration",
    ),
    Setting(
        "KUBEDGX_LEADER_ELECTION_RENEW_DEADLINE",
        _duration(positive=True),
        10.0,
        "leader_election.renew_deadline",
        "a leader that could not renew for this long stops reconciling",
        chart="leaderElection.renewDeadline",
        flag="--leader-election-renew-deadline",
    ),
    Setting(
        "KUBEDGX_LEADER_ELECTION_RETRY_PERIOD",
        _duration(positive=True),
        2.0,
        "leader_election.retry_period",
        "time between a candidate's attempts and a leader's renewals",
        chart="leaderElection.retryPeriod",
        flag="--leader-election-retry-period",
    ),
    Setting(
        "KUBEDGX_SHUTDOWN_DELAY",
        _duration(),
        0.0,
        "shutdown_delay",
        "after SIGTERM: not ready, no reconciling, Lease released at once, admission answered this long more",
        chart="shutdownDelay",
        flag="--shutdown-delay",
    ),
    Setting(
        "KUBEDGX_PROGRESS_INTERVAL",
        _duration(),
        30.0,
        "progress_interval",
        "how often the operator reads a running job's worker 0 log (`pods/log`) for its latest progress line"
        " into `status.progress`: at most one log read and one progress status write per job per interval;"
        " `0`: never (progress then shows when worker 0 ends)",
        chart="progressInterval",
        flag="--progress-interval",
    ),
    Setting(
        "KUBEDGX_STATUS_INTERVAL",
        _duration(),
        10.0,
        "status_interval",
        "how long a job's status may lag behind its counts in flight (running workers, `NODES`, the numbers in"
        " a condition's message): a change of those alone is written at most once per interval per job, while"
        " phase, reason, restarts, failures and progress are written at once; `0`: every change at once",
        chart="statusInterval",
        flag="--status-interval",
    ),
    Setting(
        "KUBEDGX_USAGE_INTERVAL",
        _duration(),
        300.0,
        "usage_interval",
        "how long a running job's `status.usage` (GPU-HOURS, COST) may lag behind: it rides on every status write"
        " made anyway (progress, transitions) and is written alone at most once per interval per job, and at once"
        " when the job's last worker lets go of its node; `0`: like the counts in flight (`statusInterval`)",
        chart="usageInterval",
        flag="--usage-interval",
    ),
    Setting(
        "KUBEDGX_CHECKPOINT_SYNC_INTERVAL",
        _duration(positive=True),
        30.0,
        "checkpoint_sync_interval",
        "how often each checkpoint sidecar scans the trainer's output directory for new complete checkpoints:"
        " the longest a finished checkpoint waits on the node before its upload starts",
        chart="dataMounts.checkpointSyncInterval",
    ),
    Setting(
        "KUBEDGX_CA_BUNDLE",
        PEM_FILE,
        None,
        "ca_bundle",
        "private CAs that sign object stores' certificates (MinIO, Ceph RGW), read once at startup (certificates"
        " only, ≤ 64 KiB, else exit 2 naming this variable): added to the default trust of the operator's"
        " listings and passed to every data sync container as `KUBEDGX_CA_BUNDLE_PEM`; a mount Failed with"
        " `CertificateUntrusted` is listed again at each start (the chart: set only when `caBundle` gives one)",
        chart="caBundle",
        flag="--ca-bundle",
    ),
)

#: The settings by variable.
SETTING: Mapping[str, Setting] = {s.variable: s for s in SETTINGS}


def read_flag(variable: str, environ: Mapping[str, str] | None = None) -> bool:
    """One flag setting read by the parser :meth:`OperatorConfig.from_env` uses, for code that needs it
    before the configuration exists (handlers.py decides at import which resources to watch): a value
    from_env refuses is refused here with the same ConfigError."""
    setting = SETTING[variable]
    if setting.kind is not FLAG:
        raise TypeError(f"{variable} is a {setting.kind.name}, not a flag")
    return bool(setting.read(_Env(os.environ if environ is None else environ)))


@dataclass(frozen=True)
class OperatorConfig:
    """Everything `kubedgx operator` is configured with. Built from the environment (and flags) by
    :meth:`from_env`; tests build it directly, where the servers default to off (no fixed ports)."""

    catalog_path: str | None = None
    #: Guard rails for every namespace (the chart's ``limits``), combined with each namespace's DGXLimits
    #: (validation.limits); None: none but the namespaces' own.
    limits: LimitsSpec | None = None
    trainer_image: str = DEFAULT_TRAINER_IMAGE
    #: Workers' spec.schedulerName (KUBEDGX_SCHEDULER_NAME); None: the default scheduler.
    scheduler_name: str | None = None
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
    #: reconciles (one replica, or a local run). See :mod:`dgx_operator.runtime.leader`.
    leader_election: ElectionConfig | None = None
    #: Seconds between SIGTERM and the end of serving: the replica reports not ready and hands its
    #: leadership over at once, but goes on answering admission reviews while the endpoint's removal
    #: reaches the apiserver (a rolling update then refuses no write).
    shutdown_delay: float = 0.0
    #: Seconds between reads of a running job's worker 0 log for its progress (KUBEDGX_PROGRESS_INTERVAL);
    #: 0: never (controllers.job.Controller.live_progress).
    progress_interval: float = 30.0
    #: Seconds a job's status may lag behind its counts in flight (KUBEDGX_STATUS_INTERVAL); 0: none
    #: (reconcile.planner.coalesce).
    status_interval: float = 10.0
    #: Seconds a running job's status.usage may lag behind (KUBEDGX_USAGE_INTERVAL); 0: like the
    #: counts in flight (reconcile.planner.coalesce).
    usage_interval: float = 300.0
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
        values: dict[str, Any] = {}
        for setting in SETTINGS:
            values[setting.field] = setting.read(env)
            group = _group(setting)
            if group is not None and _LAST_OF_GROUP[group] is setting:
                # Checked together as soon as the last of them is read, so that the first bad value
                # is still the one reported (a setting read later waits its turn).
                values[group] = _COMBINE[group](env, values)
        return cls(**{name: value for name, value in values.items() if "." not in name})

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
            scheduler_name=self.scheduler_name,
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

    def limits(self, name: str) -> LimitsSpec | None:
        """The cluster's limits in the YAML file ``name`` points to, checked now with the DGXLimits
        schema: a typo would otherwise disable a limit silently."""
        path = self.text(name)
        if path is None:
            return None
        if not path.startswith("/"):
            raise ConfigError(name, f"must be the absolute path of a YAML file, got {path!r}")
        try:
            with open(path, encoding="utf-8") as handle:
                data = yaml.safe_load(handle)
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(name, f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(name, f"{path} is not YAML: {' '.join(str(exc).split())}") from None
        try:
            return LimitsSpec.model_validate(data or {})
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "<top>"
            raise ConfigError(
                name, f"{path}: limits.{where}: {first['msg']} (the fields of a DGXLimits spec, docs/cost.md)"
            ) from None

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

    def priority_classes(self, name: str, default: Mapping[str, str]) -> dict[str, str]:
        """``low=a,normal=b,high=c``; a priority left out gets no priorityClassName; "" for none at all
        (so unset, not empty, means the default)."""
        value = self.environ.get(name)
        if value is None:
            return dict(default)
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

    def webhook_timeout(self, name: str, default: int) -> int:
        value = self.text(name)
        if value is None:
            return default
        if not value.isdigit() or not 1 <= int(value) <= 30:
            raise ConfigError(name, f"must be 1-30 (the apiserver's bounds), got {value!r}")
        return int(value)


def _webhook(env: _Env, values: Mapping[str, Any]) -> WebhookConfig | None:
    """The webhook's settings (read, each checked alone) checked together: a port needs exactly one
    TLS mode, and self-signed mode a Service and a namespace. None without a port."""
    port: int = values["webhook.port"]
    certfile, pkeyfile = values["webhook.certfile"], values["webhook.pkeyfile"]
    self_signed, insecure = values["webhook.self_signed"], values["webhook.insecure"]
    service, namespace = values["webhook.service"], values["webhook.namespace"]
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
        host=values["bind_address"],
        certfile=certfile,
        pkeyfile=pkeyfile,
        insecure=insecure,
        self_signed=self_signed,
        service=service,
        namespace=namespace,
        configuration=values["webhook.configuration"],
        failure_policy=values["webhook.failure_policy"],
        secret=(values["webhook.secret"] or f"{service}-tls") if self_signed else None,
        timeout_seconds=values["webhook.timeout_seconds"],
        dry_run=values["webhook.dry_run"],
    )


def _leader_election(env: _Env, values: Mapping[str, Any]) -> ElectionConfig | None:
    """Only with KUBEDGX_LEADER_ELECTION=1; the Lease is in the operator's own namespace unless
    KUBEDGX_LEADER_ELECTION_NAMESPACE names another. Its timings are checked even when off."""
    if not values["leader_election"]:
        return None
    namespace = values["leader_election.namespace"] or _own_namespace()
    if namespace is None:
        raise ConfigError(
            "KUBEDGX_LEADER_ELECTION_NAMESPACE",
            f"required with KUBEDGX_LEADER_ELECTION=1 (no {SERVICE_ACCOUNT_NAMESPACE}: not in a pod)",
        )
    config = ElectionConfig(
        namespace=namespace,
        name=values["leader_election.name"],
        identity=default_identity(env.environ),
        lease_duration=values["leader_election.lease_duration"],
        renew_deadline=values["leader_election.renew_deadline"],
        retry_period=values["leader_election.retry_period"],
    )
    problems = config.problems()
    if problems:
        raise ConfigError("KUBEDGX_LEADER_ELECTION_LEASE_DURATION", "; ".join(problems))
    return config


#: The OperatorConfig fields several settings fill together, and how (with their checks across settings).
_COMBINE: Mapping[str, Callable[[_Env, Mapping[str, Any]], Any]] = {
    "webhook": _webhook,
    "leader_election": _leader_election,
}


def _group(setting: Setting) -> str | None:
    group = setting.field.partition(".")[0]
    return group if group in _COMBINE else None


#: The last setting of each group in table order: the group is built as soon as that one is read.
_LAST_OF_GROUP: Mapping[str, Setting] = {group: s for s in SETTINGS if (group := _group(s)) is not None}


# -- docs/operator.md's table, generated ----------------------------------------------------------

DOCS_BEGIN = "<!-- settings:begin (generated: python -m dgx_operator.runtime.settings docs/operator.md) -->"
DOCS_END = "<!-- settings:end -->"


def docs_table() -> str:
    """The Markdown table of every setting, one row each, in table order."""
    rows = [
        "| Variable | Flag | Chart value | Type | Default | Meaning |",
        "|---|---|---|---|---|---|",
    ]
    for s in SETTINGS:
        cells = (
            _code(s.variable),
            _code(s.flag) if s.flag else "—",
            _code(s.chart) if s.chart else "—",
            s.kind.name,
            s.shown_default,
            s.description,
        )
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(rows)


def with_docs_table(text: str) -> str:
    """``text`` (docs/operator.md) with the table between the markers replaced by :func:`docs_table`."""
    if text.count(DOCS_BEGIN) != 1 or text.count(DOCS_END) != 1:
        raise ValueError(f"the markers {DOCS_BEGIN!r} and {DOCS_END!r} must each appear once")
    head, rest = text.split(DOCS_BEGIN)
    _, tail = rest.split(DOCS_END)
    return f"{head}{DOCS_BEGIN}\n{docs_table()}\n{DOCS_END}{tail}"


def main(argv: list[str] | None = None) -> int:
    """``python -m dgx_operator.runtime.settings docs/operator.md [--check]``: regenerate the docs table (or
    exit 1 if it is stale)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m dgx_operator.runtime.settings", description=main.__doc__)
    parser.add_argument("doc", type=Path, help="the Markdown file holding the markers (docs/operator.md)")
    parser.add_argument("--check", action="store_true", help="exit 1 if the table in it is stale")
    args = parser.parse_args(argv)
    path: Path = args.doc
    text = path.read_text(encoding="utf-8")
    fresh = with_docs_table(text)
    if args.check:
        if fresh != text:
            print(
                f"{path}: the settings table is stale (run `python -m dgx_operator.runtime.settings {path}`)",
                file=sys.stderr,
            )
            return 1
        return 0
    path.write_text(fresh, encoding="utf-8")
    return 0


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


if __name__ == "__main__":
    raise SystemExit(main())
