"""The private CA bundle for object stores (the chart's caBundle): KUBEDGX_CA_BUNDLE as the operator
reads it at startup (the PEM file checked, only its certificates kept, a bad one refused naming the
variable), and the builders copying it into every data sync container of a worker pod, and nowhere
else. tests/integration/test_ca_bundle.py and tests/datasync/test_tls.py use it against a store."""

from __future__ import annotations

from pathlib import Path

import pytest

from dgx_datasync import trust
from dgx_operator.render import Defaults
from dgx_operator.render.datasync import CA_BUNDLE_ENV
from dgx_operator.runtime.settings import ConfigError, OperatorConfig
from tests.private_ca import PrivateCA
from tests.unit.render_helpers import OUT, children, inits, pods_of, refs

CA = PrivateCA()
OTHER = PrivateCA("another private CA")


def test_the_builders_and_the_data_plane_name_the_same_variable() -> None:
    assert CA_BUNDLE_ENV == trust.PEM_ENV == "KUBEDGX_CA_BUNDLE_PEM"


def test_the_file_is_read_once_and_only_its_certificates_are_kept(tmp_path: Path) -> None:
    path = tmp_path / "ca.crt"
    path.write_text(f"# corporate root\n{CA.pem}subject=CN = another\n{OTHER.pem}", encoding="utf-8")
    config = OperatorConfig.from_env({"KUBEDGX_CA_BUNDLE": str(path)})
    assert config.ca_bundle == CA.pem + OTHER.pem
    assert config.defaults().ca_bundle_pem == config.ca_bundle
    path.unlink()  # read at startup: the configuration no longer needs the file
    assert config.defaults().ca_bundle_pem == CA.pem + OTHER.pem
    assert OperatorConfig.from_env({}).ca_bundle is None
    assert OperatorConfig.from_env({"KUBEDGX_CA_BUNDLE": ""}).defaults().ca_bundle_pem is None


@pytest.mark.parametrize(
    ("content", "complaint"),
    [
        (None, "cannot read"),
        ("relative", "must be the absolute path of a PEM file, got 'relative'"),
        ("", "holds no PEM certificate"),
        ("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", "a certificate does not parse"),
        (CA.pem + "-----BEGIN EC PRIVATE KEY-----\nAAAA\n-----END EC PRIVATE KEY-----\n", "EC PRIVATE KEY block"),
        (CA.pem * 200, "more than 65536: give only the private CAs"),
    ],
    ids=["missing", "relative", "empty", "garbage", "key", "too-large"],
)
def test_a_bundle_that_cannot_be_used_stops_the_operator_naming_the_variable(
    content: str | None, complaint: str, tmp_path: Path
) -> None:
    path = tmp_path / "ca.crt"
    if content is not None and content != "relative":
        path.write_text(content, encoding="utf-8")
    value = "relative" if content == "relative" else str(path)
    with pytest.raises(ConfigError) as caught:
        OperatorConfig.from_env({"KUBEDGX_CA_BUNDLE": value})
    assert caught.value.variable == "KUBEDGX_CA_BUNDLE"
    assert str(caught.value).startswith("KUBEDGX_CA_BUNDLE: ")
    assert complaint in str(caught.value)


def test_every_data_sync_container_gets_the_bundle_and_nothing_else_does() -> None:
    mounts = {"data": {"source": "s3://bucket/in"}, "ckpt": OUT}
    changes = {**refs(("data", "/data"), ("ckpt", "/out")), "spec.trainer.output": {"dir": "/out/run"}}
    pod = pods_of(children(changes, mounts=mounts, defaults=Defaults(ca_bundle_pem=CA.pem)))[0]
    containers = inits(pod)
    assert set(containers) == {"data-in-0", "restore-1", "checkpoints-1"}
    for name, container in containers.items():
        values = {e["name"]: e.get("value") for e in container["env"]}
        assert values[CA_BUNDLE_ENV] == CA.pem, name
    others = [
        *pod["spec"]["containers"],
        *(c for c in pod["spec"].get("initContainers", []) if c["name"] not in containers),
    ]
    assert others
    for container in others:
        assert CA_BUNDLE_ENV not in {e["name"] for e in container.get("env", [])}, container["name"]


def test_without_a_bundle_the_containers_are_as_before() -> None:
    mounts = {"data": {"source": "s3://bucket/in"}}
    plain = pods_of(children(refs(("data", "/data")), mounts=mounts))[0]
    assert all(CA_BUNDLE_ENV not in {e["name"] for e in c["env"]} for c in inits(plain).values())
    assert plain == pods_of(children(refs(("data", "/data")), mounts=mounts, defaults=Defaults(ca_bundle_pem=None)))[0]
