"""The operator's own settings: what the Helm chart passes (flags or KUBEDGX_* variables), and
how they become kopf settings. Kept apart from handlers.py so that file stays wiring only."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import kopf

from dgx_operator.build.resolved import DEFAULT_TRAINER_IMAGE, Defaults
from dgx_operator.catalog import Catalog

PREFIX = "kubedgx.io"


@dataclass(frozen=True)
class WebhookConfig:
    """Where the validating webhook listens. TLS material comes from the chart (cert-manager or
    a self-signed pair); ``insecure`` serves plain HTTP, for tests and a TLS-terminating proxy."""

    port: int = 9443
    host: str = "0.0.0.0"
    certfile: str | None = None
    pkeyfile: str | None = None
    insecure: bool = False


@dataclass(frozen=True)
class OperatorConfig:
    catalog_path: str | None = None
    trainer_image: str = DEFAULT_TRAINER_IMAGE
    #: Seconds; an integer, since the API server rejects timeoutSeconds=300.0 with 400.
    watch_timeout: int = 300
    request_timeout: float = 30.0
    webhook: WebhookConfig | None = None
    event_component: str = "kubedgx-operator"
    #: kopf's delays between retries of failed API calls, and the first delay of the
    #: controller's own per-job backoff (doubling up to 60 s). Tests shorten both.
    error_backoffs: tuple[float, ...] = (1, 2, 4, 8, 15, 30)
    retry_base: float = 1.0

    @classmethod
    def from_env(cls) -> OperatorConfig:
        webhook_port = os.environ.get("KUBEDGX_WEBHOOK_PORT")
        webhook = (
            WebhookConfig(
                port=int(webhook_port),
                certfile=os.environ.get("KUBEDGX_WEBHOOK_CERT") or None,
                pkeyfile=os.environ.get("KUBEDGX_WEBHOOK_KEY") or None,
                insecure=os.environ.get("KUBEDGX_WEBHOOK_INSECURE", "") == "1",
            )
            if webhook_port
            else None
        )
        return cls(
            catalog_path=os.environ.get("KUBEDGX_CATALOG") or None,
            trainer_image=os.environ.get("KUBEDGX_TRAINER_IMAGE") or DEFAULT_TRAINER_IMAGE,
            webhook=webhook,
        )

    def catalog(self) -> Catalog:
        return Catalog.load(self.catalog_path)

    def defaults(self) -> Defaults:
        return Defaults(trainer_image=self.trainer_image)


def configure(settings: kopf.OperatorSettings, config: OperatorConfig) -> None:
    """Our finalizer and annotation prefix, bounded watches and requests, quick error backoffs."""
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
    settings.networking.request_timeout = config.request_timeout
    settings.networking.connect_timeout = 10
    settings.networking.error_backoffs = config.error_backoffs
    settings.queueing.error_delays = (*config.error_backoffs, 60)
    if config.webhook is not None:
        hook = config.webhook
        settings.admission.server = kopf.WebhookServer(
            addr=hook.host, port=hook.port, certfile=hook.certfile, pkeyfile=hook.pkeyfile, insecure=hook.insecure
        )
