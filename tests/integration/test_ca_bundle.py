"""A DGXDataMount on an S3-compatible store behind a private CA (MinIO, Ceph RGW on premises): the
real operator (kopf, dgx_operator.runtime.handlers) against the emulator, listing moto's S3 served over HTTPS
with a certificate of a CA no default trust store has (tests/s3.py's ``s3_private_ca``).

Without the CA the listing fails with CertificateUntrusted, whose message names the fix (the chart's
caBundle); an operator started with the CA (``OperatorConfig.ca_bundle``, KUBEDGX_CA_BUNDLE) lists the
same mount again by itself, with no edit of the mount, and every data sync container of a job using
it gets the CA in KUBEDGX_CA_BUNDLE_PEM (tests/datasync/test_tls.py runs those containers' command).
"""

from __future__ import annotations

import kopf
import pytest

from dgx_datasync import trust
from dgx_operator.runtime.settings import OperatorConfig
from tests.conftest import BASE_MOUNT, with_changes
from tests.integration.conftest import OperatorRun, RunOperator
from tests.integration.emulator import Emulator
from tests.integration.mount_scenarios import FILES, SECRET, init_containers, job_using, wait_mount
from tests.integration.scenarios import JOBS, MOUNTS, NS, Body, condition, expect_pods, worker
from tests.s3 import PrivateS3, s3_private_ca, secret  # noqa: F401

pytestmark = pytest.mark.asyncio


async def start(emulator: Emulator, run_operator: RunOperator, ca_bundle: str | None) -> OperatorRun:
    """dgx_operator.runtime.handlers as the chart runs it, with KUBEDGX_CA_BUNDLE's PEM (or none)."""
    config = OperatorConfig(error_backoffs=(0.1, 0.2, 0.5, 1.0), retry_base=0.1, ca_bundle=ca_bundle)
    memo = kopf.Memo(config=config)
    run = await run_operator("dgx_operator.runtime.handlers", wait_for=(JOBS, MOUNTS, "pods"), memo=memo)
    await emulator.wait_for(lambda: memo.get("mounts"), timeout=10, message="the operator's startup handler ran")
    return run


def private_mount(private: PrivateS3, bucket: str, name: str = "data", **changes: object) -> Body:
    return with_changes(
        BASE_MOUNT,
        {
            "metadata.name": name,
            "spec.source": f"s3://{bucket}/prefix",
            "spec.endpoint": private.s3.endpoint,
            "spec.credentialsSecretRef": {"name": SECRET},
            **changes,
        },
    )


def sync_env(container: Body) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


async def test_an_untrusted_store_fails_naming_the_fix_and_lists_once_the_operator_has_the_ca(
    emulator: Emulator,
    run_operator: RunOperator,
    s3_private_ca: PrivateS3,  # noqa: F811
) -> None:
    bucket = s3_private_ca.s3.bucket("private", objects=FILES)
    emulator.create("secrets", secret(SECRET))
    first = await start(emulator, run_operator, None)
    emulator.create(MOUNTS, private_mount(s3_private_ca, bucket))
    status = await wait_mount(emulator, "Failed")
    ready = condition(status, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "CertificateUntrusted")
    assert ready["message"].startswith(f"the TLS certificate of the endpoint {s3_private_ca.s3.endpoint} ")
    assert "(unable to get local issuer certificate)" in ready["message"]
    assert "the Helm chart's caBundle value" in ready["message"]

    # The admin sets caBundle; the chart restarts the operator, which now trusts the CA and lists the
    # mount again by itself: nobody edits the mount.
    await first.stop()
    await start(emulator, run_operator, trust.certificates(s3_private_ca.ca_pem))
    status = await wait_mount(emulator, "Ready")
    assert (status["objects"], status["observedGeneration"]) == (3, 1)
    assert condition(status, "Ready")["reason"] == "Listed"
    stored = emulator.get(MOUNTS, NS, "data")
    assert stored is not None
    assert stored["metadata"]["generation"] == 1, "listed again with no edit of the mount"

    emulator.create(JOBS, job_using(("data", "/data")))
    await expect_pods(emulator, {worker(0): "0"})
    pull = init_containers(emulator, worker(0))["data-in-0"]
    assert pull["args"][pull["args"].index("--endpoint-url") + 1] == s3_private_ca.s3.endpoint
    assert sync_env(pull)[trust.PEM_ENV] == s3_private_ca.ca_pem


async def test_an_output_mount_behind_the_private_ca_is_checked_writable_and_its_sidecar_gets_the_ca(
    emulator: Emulator,
    run_operator: RunOperator,
    s3_private_ca: PrivateS3,  # noqa: F811
) -> None:
    bucket = s3_private_ca.s3.bucket("private-out")
    emulator.create("secrets", secret(SECRET))
    await start(emulator, run_operator, trust.certificates(s3_private_ca.ca_pem))
    emulator.create(MOUNTS, private_mount(s3_private_ca, bucket, "out", **{"spec.direction": "Out"}))
    status = await wait_mount(emulator, "Ready", "out")
    assert condition(status, "Ready")["reason"] == "Writable"
    emulator.create(JOBS, job_using(("out", "/workspace/output")))
    await expect_pods(emulator, {worker(0): "0"})
    containers = init_containers(emulator, worker(0))
    assert set(containers) >= {"restore-0", "checkpoints-0"}
    for name in ("restore-0", "checkpoints-0"):
        assert sync_env(containers[name])[trust.PEM_ENV] == s3_private_ca.ca_pem, name
    # The trainer never needs it (it talks to no store).
    pod = emulator.get("pods", NS, worker(0))
    assert pod is not None
    [trainer] = pod["spec"]["containers"]
    assert trust.PEM_ENV not in sync_env(trainer)
