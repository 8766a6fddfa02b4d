"""The operator's settings as the Helm chart passes them: KUBEDGX_* variables (and the `kubedgx operator` flags
written over them), parsed by ``OperatorConfig.from_env``. Every bad value is refused with an error that starts
with the variable's name; `kubedgx operator` prints it on one line and exits 2."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from dgx_operator.cli.main import build_parser, main, operator_environment
from dgx_operator.render.resolved import DEFAULT_TRAINER_IMAGE, Defaults
from dgx_operator.runtime import settings
from dgx_operator.runtime.settings import ConfigError, OperatorConfig
from dgx_operator.webhook.config import WebhookConfig

CHART_DEFAULTS = {"low": "kubedgx-low", "normal": "kubedgx-normal", "high": "kubedgx-high"}


def parse(**env: str) -> OperatorConfig:
    return OperatorConfig.from_env(env)


def refused(**env: str) -> str:
    with pytest.raises(ConfigError) as caught:
        parse(**env)
    return str(caught.value)


# -- good values ---------------------------------------------------------------------------------------------


def test_nothing_set_gives_the_documented_defaults() -> None:
    config = parse()
    assert config.namespaces == ()  # clusterwide
    assert (config.metrics_port, config.health_port, config.webhook) == (8080, 8081, None)
    assert config.catalog_path is None
    assert config.defaults() == Defaults(
        trainer_image=DEFAULT_TRAINER_IMAGE,
        datasync_image=None,
        cache_root="/raid/kubedgx",
        priority_classes=CHART_DEFAULTS,
        image_pull_policy="IfNotPresent",
    )


def test_every_variable_reaches_the_config() -> None:
    config = parse(
        KUBEDGX_WATCH_NAMESPACES=" ml, team-b ,,ml",
        KUBEDGX_METRICS_PORT="9090",
        KUBEDGX_HEALTH_PORT="0",
        KUBEDGX_CATALOG="/etc/kubedgx/catalog.yaml",
        KUBEDGX_TRAINER_IMAGE="registry.example/trainer:1.2",
        KUBEDGX_DATASYNC_IMAGE="registry.example/datasync@sha256:" + "a" * 64,
        KUBEDGX_CACHE_ROOT="/local/nvme",
        KUBEDGX_PRIORITY_CLASSES="low=batch-low, high = batch.high",
        KUBEDGX_IMAGE_PULL_POLICY="Always",
        KUBEDGX_WEBHOOK_PORT="9443",
        KUBEDGX_WEBHOOK_CERT="/tls/tls.crt",
        KUBEDGX_WEBHOOK_KEY="/tls/tls.key",
        KUBEDGX_CHECKPOINT_SYNC_INTERVAL="1m30s",
    )
    assert config.namespaces == ("ml", "team-b")
    assert (config.metrics_port, config.health_port) == (9090, 0)
    assert config.catalog_path == "/etc/kubedgx/catalog.yaml"
    defaults = config.defaults()
    assert defaults.trainer_image == "registry.example/trainer:1.2"
    assert defaults.datasync_image == "registry.example/datasync@sha256:" + "a" * 64
    assert defaults.cache_root == "/local/nvme"
    assert defaults.priority_classes == {"low": "batch-low", "high": "batch.high"}  # normal: no priorityClassName
    assert defaults.image_pull_policy == "Always"
    assert defaults.checkpoint_sync_interval == 90.0
    assert config.webhook == WebhookConfig(port=9443, certfile="/tls/tls.crt", pkeyfile="/tls/tls.key")
    assert config.webhook.mode == "certificate"


def test_an_empty_priority_class_list_means_none_and_empty_values_mean_defaults() -> None:
    config = parse(
        KUBEDGX_PRIORITY_CLASSES="", KUBEDGX_TRAINER_IMAGE="", KUBEDGX_METRICS_PORT="", KUBEDGX_CACHE_ROOT=""
    )
    assert config.priority_classes == {}
    assert (config.trainer_image, config.metrics_port, config.cache_root) == (
        DEFAULT_TRAINER_IMAGE,
        8080,
        "/raid/kubedgx",
    )


def test_self_signed_mode_names_the_service_and_its_dns_names() -> None:
    config = parse(
        KUBEDGX_WEBHOOK_PORT="9443",
        KUBEDGX_WEBHOOK_SELF_SIGNED="1",
        KUBEDGX_WEBHOOK_SERVICE="kubedgx-webhook",
        KUBEDGX_WEBHOOK_NAMESPACE="kubedgx-system",
        KUBEDGX_WEBHOOK_FAILURE_POLICY="Ignore",
        KUBEDGX_WEBHOOK_CONFIGURATION="kubedgx-prod",
    )
    hook = config.webhook
    assert hook is not None
    assert (hook.mode, hook.failure_policy, hook.configuration) == ("self-signed", "Ignore", "kubedgx-prod")
    assert hook.dns_names == ("kubedgx-webhook.kubedgx-system.svc", "kubedgx-webhook.kubedgx-system.svc.cluster.local")


def test_self_signed_mode_defaults_to_the_pods_own_namespace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    namespace_file = tmp_path / "namespace"
    namespace_file.write_text("kubedgx-system\n")
    monkeypatch.setattr(settings, "SERVICE_ACCOUNT_NAMESPACE", str(namespace_file))
    config = parse(KUBEDGX_WEBHOOK_PORT="9443", KUBEDGX_WEBHOOK_SELF_SIGNED="true", KUBEDGX_WEBHOOK_SERVICE="hook")
    assert config.webhook is not None
    assert (config.webhook.namespace, config.webhook.configuration, config.webhook.failure_policy) == (
        "kubedgx-system",
        "kubedgx",
        "Fail",
    )


def test_insecure_mode_and_no_webhook_without_a_port() -> None:
    hook = parse(KUBEDGX_WEBHOOK_PORT="8443", KUBEDGX_WEBHOOK_INSECURE="1").webhook
    assert hook is not None
    assert (hook.mode, hook.port) == ("insecure", 8443)
    assert parse(KUBEDGX_WEBHOOK_INSECURE="1").webhook is None


# -- bad values: each names its variable ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"KUBEDGX_METRICS_PORT": "http"}, "KUBEDGX_METRICS_PORT: must be a port number 0-65535, got 'http'"),
        ({"KUBEDGX_METRICS_PORT": "70000"}, "KUBEDGX_METRICS_PORT: must be a port number 0-65535, got '70000'"),
        ({"KUBEDGX_HEALTH_PORT": "-1"}, "KUBEDGX_HEALTH_PORT: must be a port number 0-65535, got '-1'"),
        ({"KUBEDGX_WEBHOOK_PORT": "0"}, "KUBEDGX_WEBHOOK_PORT: must be a port number 1-65535, got '0'"),
        ({"KUBEDGX_WATCH_NAMESPACES": "ml,Team_B"}, "KUBEDGX_WATCH_NAMESPACES: 'Team_B' is not a namespace name"),
        ({"KUBEDGX_WATCH_NAMESPACES": "ml team"}, "KUBEDGX_WATCH_NAMESPACES: 'ml team' is not a namespace name"),
        ({"KUBEDGX_PRIORITY_CLASSES": "urgent=x"}, "KUBEDGX_PRIORITY_CLASSES: 'urgent=x': expected PRIORITY=CLASS"),
        ({"KUBEDGX_PRIORITY_CLASSES": "kubedgx-low"}, "KUBEDGX_PRIORITY_CLASSES: 'kubedgx-low': expected"),
        ({"KUBEDGX_PRIORITY_CLASSES": "low=a,low=b"}, "KUBEDGX_PRIORITY_CLASSES: priority 'low' is given twice"),
        ({"KUBEDGX_PRIORITY_CLASSES": "high=Big_One"}, "KUBEDGX_PRIORITY_CLASSES: 'Big_One' (for high) is not a"),
        ({"KUBEDGX_IMAGE_PULL_POLICY": "always"}, "KUBEDGX_IMAGE_PULL_POLICY: must be one of Always, IfNotPresent"),
        ({"KUBEDGX_CHECKPOINT_SYNC_INTERVAL": "soon"}, "KUBEDGX_CHECKPOINT_SYNC_INTERVAL: must be a duration"),
        ({"KUBEDGX_CHECKPOINT_SYNC_INTERVAL": "0s"}, "KUBEDGX_CHECKPOINT_SYNC_INTERVAL: must be longer than 0"),
        ({"KUBEDGX_CACHE_ROOT": "raid/kubedgx"}, "KUBEDGX_CACHE_ROOT: must be an absolute path, got 'raid/kubedgx'"),
        ({"KUBEDGX_TRAINER_IMAGE": "trainer :1"}, "KUBEDGX_TRAINER_IMAGE: an image reference has no spaces"),
        ({"KUBEDGX_DATASYNC_IMAGE": "a b"}, "KUBEDGX_DATASYNC_IMAGE: an image reference has no spaces"),
        ({"KUBEDGX_WEBHOOK_INSECURE": "maybe"}, "KUBEDGX_WEBHOOK_INSECURE: must be 1 or 0 (true/false), got 'maybe'"),
        ({"KUBEDGX_WEBHOOK_SELF_SIGNED": "2"}, "KUBEDGX_WEBHOOK_SELF_SIGNED: must be 1 or 0"),
        ({"KUBEDGX_WEBHOOK_FAILURE_POLICY": "fail"}, "KUBEDGX_WEBHOOK_FAILURE_POLICY: must be one of Fail, Ignore"),
        ({"KUBEDGX_WEBHOOK_SERVICE": "my.service"}, "KUBEDGX_WEBHOOK_SERVICE: 'my.service' is not a Service name"),
        ({"KUBEDGX_WEBHOOK_CONFIGURATION": "Kubedgx"}, "KUBEDGX_WEBHOOK_CONFIGURATION: 'Kubedgx' is not a"),
        (
            {"KUBEDGX_WEBHOOK_PORT": "9443"},
            "KUBEDGX_WEBHOOK_PORT: is set, so choose how to serve it: KUBEDGX_WEBHOOK_CERT and KUBEDGX_WEBHOOK_KEY",
        ),
        (
            {"KUBEDGX_WEBHOOK_PORT": "9443", "KUBEDGX_WEBHOOK_INSECURE": "1", "KUBEDGX_WEBHOOK_SELF_SIGNED": "1"},
            "KUBEDGX_WEBHOOK_PORT: choose one of",
        ),
        (
            {"KUBEDGX_WEBHOOK_PORT": "9443", "KUBEDGX_WEBHOOK_CERT": "/tls/tls.crt"},
            "KUBEDGX_WEBHOOK_KEY: must be set too",
        ),
        (
            {"KUBEDGX_WEBHOOK_PORT": "9443", "KUBEDGX_WEBHOOK_SELF_SIGNED": "1"},
            "KUBEDGX_WEBHOOK_SERVICE: required with KUBEDGX_WEBHOOK_SELF_SIGNED=1",
        ),
    ],
)
def test_a_bad_value_is_refused_naming_its_variable(env: dict[str, str], expected: str) -> None:
    message = refused(**env)
    assert message.startswith(expected), message
    assert "\n" not in message


def test_self_signed_mode_outside_a_pod_needs_the_namespace(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(settings, "SERVICE_ACCOUNT_NAMESPACE", str(tmp_path / "absent"))
    message = refused(KUBEDGX_WEBHOOK_PORT="9443", KUBEDGX_WEBHOOK_SELF_SIGNED="1", KUBEDGX_WEBHOOK_SERVICE="hook")
    assert message.startswith("KUBEDGX_WEBHOOK_NAMESPACE: required with KUBEDGX_WEBHOOK_SELF_SIGNED=1")


# -- flags win over the environment ---------------------------------------------------------------------------


def flags_over(env: dict[str, str], *argv: str) -> OperatorConfig:
    args = build_parser().parse_args(["operator", *argv])
    return OperatorConfig.from_env(operator_environment(args, env))


def test_flags_override_the_variables() -> None:
    env = {
        "KUBEDGX_WATCH_NAMESPACES": "ml",
        "KUBEDGX_METRICS_PORT": "9090",
        "KUBEDGX_PRIORITY_CLASSES": "low=a",
        "KUBEDGX_WEBHOOK_PORT": "9443",
        "KUBEDGX_WEBHOOK_CERT": "/tls/tls.crt",
        "KUBEDGX_WEBHOOK_KEY": "/tls/tls.key",
    }
    assert flags_over(env).namespaces == ("ml",)
    config = flags_over(
        env, "-n", "a", "-n", "b", "--metrics-port", "0", "--priority-classes", "", "--webhook-insecure"
    )
    assert (config.namespaces, config.metrics_port, config.priority_classes) == (("a", "b"), 0, {})
    assert config.webhook == WebhookConfig(port=9443, insecure=True)
    assert flags_over(env, "-A").namespaces == ()
    self_signed = flags_over(
        env, "--webhook-self-signed", "--webhook-service", "hook", "--webhook-namespace", "ops"
    ).webhook
    assert self_signed is not None
    assert (self_signed.mode, self_signed.certfile, self_signed.dns_names[0]) == ("self-signed", None, "hook.ops.svc")


def test_the_dry_run_of_children_is_on_unless_turned_off_by_variable_or_flag() -> None:
    env = {"KUBEDGX_WEBHOOK_PORT": "9443", "KUBEDGX_WEBHOOK_INSECURE": "1"}

    def dry_run(config: OperatorConfig) -> bool:
        assert config.webhook is not None
        return config.webhook.dry_run

    assert dry_run(parse(**env)) is True
    assert dry_run(parse(**env, KUBEDGX_WEBHOOK_DRY_RUN="")) is True
    assert dry_run(parse(**env, KUBEDGX_WEBHOOK_DRY_RUN="0")) is False
    assert dry_run(parse(**env, KUBEDGX_WEBHOOK_DRY_RUN="true")) is True
    assert dry_run(flags_over(env, "--no-webhook-dry-run")) is False
    assert dry_run(flags_over({**env, "KUBEDGX_WEBHOOK_DRY_RUN": "0"}, "--webhook-dry-run")) is True
    assert dry_run(flags_over({**env, "KUBEDGX_WEBHOOK_DRY_RUN": "off"})) is False
    assert refused(**env, KUBEDGX_WEBHOOK_DRY_RUN="sometimes") == (
        "KUBEDGX_WEBHOOK_DRY_RUN: must be 1 or 0 (true/false), got 'sometimes'"
    )


@pytest.mark.parametrize(
    ("env", "argv", "expected"),
    [
        ({"KUBEDGX_METRICS_PORT": "x"}, [], "kubedgx operator: KUBEDGX_METRICS_PORT: must be a port number"),
        ({}, ["--metrics-port", "99999"], "kubedgx operator: KUBEDGX_METRICS_PORT: must be a port number"),
        ({}, ["--webhook-port", "9443"], "kubedgx operator: KUBEDGX_WEBHOOK_PORT: is set, so choose"),
        ({"KUBEDGX_CATALOG": "/nonexistent/catalog.yaml"}, [], "kubedgx operator: KUBEDGX_CATALOG: "),
    ],
)
def test_the_cli_exits_2_with_one_line(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], argv: list[str], expected: str
) -> None:
    for name in list(os.environ):
        if name.startswith("KUBEDGX_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    err = io.StringIO()
    assert main(["operator", *argv], out=io.StringIO(), err=err) == 2
    lines = err.getvalue().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(expected), lines
