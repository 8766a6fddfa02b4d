"""How the validating webhook listens and gets TLS: :class:`WebhookConfig`, which the webhook's server
(admission.py) and its certificates (certificates.py) read. The daemon's settings
(runtime/settings.py) fill it from the KUBEDGX_WEBHOOK_* variables; it lives here so that the webhook
needs nothing from the daemon above it (the layers contract in pyproject.toml).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

DEFAULT_WEBHOOK_CONFIGURATION = "kubedgx"
#: The apiserver's default and the chart's: how long it waits for the webhook's answer.
DEFAULT_WEBHOOK_TIMEOUT_SECONDS = 10
FAILURE_POLICIES = ("Fail", "Ignore")

WebhookMode = Literal["certificate", "self-signed", "insecure"]
FailurePolicy = Literal["Fail", "Ignore"]


@dataclass(frozen=True)
class WebhookConfig:
    """Where the validating webhook listens and how it gets TLS:

    * ``certificate``: ``certfile``/``pkeyfile`` mounted from a Secret (cert-manager's); the chart
      creates the ValidatingWebhookConfiguration and cert-manager injects its caBundle;
    * ``self-signed``: the replicas share a CA and serving certificate for the Service's DNS names,
      kept in the Secret ``secret`` (made by the first replica to find it empty), and set its CA as
      the caBundle of the chart's ValidatingWebhookConfiguration ``configuration``
      (:mod:`dgx_operator.webhook.certificates`);
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
