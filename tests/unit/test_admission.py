"""The validating webhook's logic without a server: :func:`immutable_changes` and :func:`admission.review`.

``review`` gets a real ``kopf.Memo`` with an :class:`OperatorConfig` (the default catalog unless a test writes
an admin's one) and, where a job references DGXDataMounts, a fake ``kube`` whose ``get_mount`` answers from a
dict, as :class:`dgx_operator.kube.Kube` answers from the cluster (None for 404).
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import celpy
import kopf
import pytest
import yaml
from celpy.adapter import json_to_cel

from dgx_operator.api import DGXTrainingJob
from dgx_operator.api.limits import KUEUE_PRIORITY_LABEL, LimitsSpec
from dgx_operator.catalog import Catalog
from dgx_operator.kube import ApiError
from dgx_operator.render import JobIdentity, trainer_config_map
from dgx_operator.render.names import FINALIZER
from dgx_operator.runtime.settings import OperatorConfig
from dgx_operator.validation.validator import immutable_changes
from dgx_operator.webhook import admission, budget_warnings
from dgx_operator.webhook.config import WebhookConfig
from tests.conftest import BASE_BUDGET, BASE_JOB, BASE_MOUNT, DELETE, with_changes

Body = dict[str, Any]

STARTED = "2024-05-01T12:00:00Z"
#: Written out rather than imported, so that a change to the operator's lists shows here (docs/operator.md).
ACTIVE_PHASES = ("Pending", "Running", "Restarting")
IMMUTABLE_FIELDS = ("instance", "trainer", "command", "args")
RUNNING_MESSAGE = "cannot change while the job is Running: suspend it first (spec.suspend: true) or create a new job"
OUT_DIR_IN_INPUT = (
    "spec.trainer.output.dir: /data/out is inside /data, which workers see read-only (an input mount or the "
    "config); write outputs to a direction: Out mount or another directory"
)


def command_job() -> Body:
    """A job running its own program (spec.command and spec.args) instead of the built-in trainer."""
    return with_changes(BASE_JOB, {"spec.trainer": DELETE, "spec.command": ["python", "train.py"], "spec.args": ["-v"]})


#: Per field that must not move under running workers: the job it is changed on, and the change.
IMMUTABLE_EDITS: dict[str, tuple[Body, dict[str, Any]]] = {
    "instance": (BASE_JOB, {"spec.instance": "dgxh100.80g.8.norm"}),
    "trainer": (BASE_JOB, {"spec.trainer.model.name": "org/other-model"}),
    "command": (command_job(), {"spec.command": ["python", "other.py"]}),
    "args": (command_job(), {"spec.args": ["-vv"]}),
}
#: Changes that are fine at any time, running or not.
MUTABLE_EDITS: dict[str, dict[str, Any]] = {
    "env": {"spec.env": [{"name": "NCCL_DEBUG", "value": "INFO"}]},
    "maxNodes": {"spec.elastic.maxNodes": 4},
    "suspend": {"spec.suspend": True},
    "labels": {"metadata.labels": {"team": "nlp"}},
}


def job_in(phase: str | None, *, started: bool = True, base: Body = BASE_JOB) -> Body:
    """``base`` as the cluster stores it in ``phase`` (None: no status yet)."""
    if phase is None:
        return with_changes(base, {"status": DELETE})
    status: Body = {"phase": phase, **({"startTime": STARTED} if started else {})}
    return with_changes(base, {"status": status})


def edited(old: Body, changes: dict[str, Any]) -> Body:
    """The object an UPDATE sends: ``old`` with ``changes``, its status carried over as the API server does."""
    return with_changes(old, changes)


# -- immutable_changes ----------------------------------------------------------------------------


@pytest.mark.parametrize("phase", ACTIVE_PHASES)
@pytest.mark.parametrize("field", IMMUTABLE_FIELDS)
def test_fields_that_define_the_run_are_refused_while_the_job_has_workers(phase: str, field: str) -> None:
    base, changes = IMMUTABLE_EDITS[field]
    old = job_in(phase, base=base)
    problems = immutable_changes(old, edited(old, changes))
    assert [str(p) for p in problems] == [
        f"spec.{field}: cannot change while the job is {phase}: suspend it first (spec.suspend: true) "
        "or create a new job"
    ]


def test_every_changed_field_is_reported_once_in_a_stable_order() -> None:
    old = job_in("Running")
    new = edited(old, {"spec.instance": "dgxh100.80g.8.norm", "spec.trainer": DELETE, "spec.command": ["python"]})
    assert [p.path for p in immutable_changes(old, new)] == ["spec.instance", "spec.trainer", "spec.command"]


def test_switching_from_trainer_to_command_changes_both_fields() -> None:
    old = job_in("Restarting")
    problems = immutable_changes(old, edited(old, {"spec.trainer": DELETE, "spec.command": ["t"], "spec.args": ["-v"]}))
    assert [p.path for p in problems] == ["spec.trainer", "spec.command", "spec.args"]


def test_a_nested_trainer_change_is_reported_at_spec_trainer() -> None:
    old = job_in("Running")
    problems = immutable_changes(old, edited(old, {"spec.trainer.dataset.path": "/data/other.jsonl"}))
    assert [str(p) for p in problems] == [f"spec.trainer: {RUNNING_MESSAGE}"]


@pytest.mark.parametrize(
    ("phase", "started"),
    [
        pytest.param(None, False, id="never-reconciled"),
        pytest.param("Pending", False, id="pending-never-started"),
        pytest.param("WaitingForData", False, id="waiting-for-data"),
        pytest.param("WaitingForData", True, id="waiting-for-data-after-a-start"),
        pytest.param("Running", False, id="running-without-startTime"),
        pytest.param("Suspended", True, id="suspended"),
        # Not active phases either: a finished job has no workers, and its spec may change.
        pytest.param("Succeeded", True, id="succeeded"),
        pytest.param("Failed", True, id="failed"),
    ],
)
@pytest.mark.parametrize("field", IMMUTABLE_FIELDS)
def test_the_same_fields_may_change_when_no_workers_run(phase: str | None, started: bool, field: str) -> None:
    base, changes = IMMUTABLE_EDITS[field]
    old = job_in(phase, started=started, base=base)
    new = edited(old, changes)
    assert new["spec"] != old["spec"]
    assert immutable_changes(old, new) == []


@pytest.mark.parametrize("phase", ACTIVE_PHASES)
@pytest.mark.parametrize("edit", sorted(MUTABLE_EDITS))
def test_other_fields_may_change_at_any_time(phase: str, edit: str) -> None:
    old = job_in(phase)
    new = edited(old, MUTABLE_EDITS[edit])
    assert new != old
    assert immutable_changes(old, new) == []


def test_suspending_and_changing_the_instance_in_one_update_is_refused() -> None:
    """ "Suspend it first": the suspension takes effect once the job is Suspended, not in the same write."""
    old = job_in("Running")
    new = edited(old, {"spec.suspend": True, "spec.instance": "dgxh100.80g.8.norm"})
    assert [p.path for p in immutable_changes(old, new)] == ["spec.instance"]


def test_only_the_old_objects_status_decides() -> None:
    """The new object's status is whatever the client sent; the stored (old) one is what the job is in."""
    old = job_in("Suspended")
    new = edited(old, {"spec.instance": "dgxh100.80g.8.norm", "status.phase": "Running"})
    assert immutable_changes(old, new) == []
    assert [p.path for p in immutable_changes(new, edited(new, {"spec.instance": "dgxb200.180g.8.norm"}))] == [
        "spec.instance"
    ]


# -- admission.review ------------------------------------------------------------------------------


class FakeKube:
    """``get_mount``, ``get_limits``, ``list_budgets`` and ``list_jobs`` as :class:`dgx_operator.kube.Kube` answers
    them: the stored object, or None (404); a namespace's list. ``limits``: a namespace's DGXLimits, or an exception
    its lookup raises; ``budgets``: a namespace's DGXBudgets, or an exception (or ``HANG``) for their listing."""

    HANG = object()

    def __init__(
        self,
        mounts: Mapping[tuple[str, str], Body] | None = None,
        limits: Mapping[str, Any] | None = None,
        budgets: Mapping[str, Any] | None = None,
        jobs: Mapping[str, list[Body]] | None = None,
    ) -> None:
        self.mounts = dict(mounts or {})
        self.limits = dict(limits or {})
        self.budgets = dict(budgets or {})
        self.jobs = dict(jobs or {})
        self.asked: list[tuple[str, str]] = []
        self.asked_limits: list[str] = []
        self.listed: list[tuple[str, str]] = []

    async def get_mount(self, namespace: str, name: str) -> Body | None:
        self.asked.append((namespace, name))
        return self.mounts.get((namespace, name))

    async def get_limits(self, namespace: str) -> Body | None:
        self.asked_limits.append(namespace)
        found = self.limits.get(namespace)
        if isinstance(found, BaseException):
            raise found
        return found

    async def list_budgets(self, namespace: str) -> list[Body]:
        self.listed.append(("dgxbudgets", namespace))
        found = self.budgets.get(namespace, [])
        if found is FakeKube.HANG:
            await asyncio.Event().wait()  # no answer, ever: the review's own timeout ends it
        if isinstance(found, BaseException):
            raise found
        return copy.deepcopy(list(found))

    async def list_jobs(self, namespace: str) -> list[Body]:
        self.listed.append(("dgxtrainingjobs", namespace))
        return copy.deepcopy(self.jobs.get(namespace, []))


def memo_for(kube: FakeKube | None = None, config: OperatorConfig | None = None) -> kopf.Memo:
    memo = kopf.Memo(config=config or OperatorConfig())
    if kube is not None:
        memo.kube = kube
    return memo


def review(
    body: Body, old: Body | None = None, operation: str = "CREATE", memo: kopf.Memo | None = None
) -> kopf.AdmissionError | None:
    """Run ``admission.review``; the AdmissionError it raised, or None when it let the object through."""
    try:
        asyncio.run(admission.review(memo if memo is not None else memo_for(), body, old, operation))
    except kopf.AdmissionError as exc:
        return exc
    return None


def refusal(body: Body, old: Body | None = None, operation: str = "CREATE", memo: kopf.Memo | None = None) -> str:
    """The message of a 422 refusal (fails the test if there is none, or another code)."""
    error = review(body, old, operation, memo)
    assert error is not None, f"{operation} was allowed"
    assert error.code == 422
    return str(error)


def admin_catalog_without_a100(tmp_path: Path) -> OperatorConfig:
    """The operator's config with an admin's catalog: the default one without the a100 families."""
    data = yaml.safe_load(Catalog.load().spec.model_dump_json(by_alias=True, exclude_none=True))
    data["gpus"] = [family for family in data["gpus"] if family["family"] != "a100"]
    path = tmp_path / "catalog.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return OperatorConfig(catalog_path=str(path))


def test_a_valid_job_and_a_valid_mount_pass() -> None:
    assert review(BASE_JOB) is None
    assert review(BASE_MOUNT) is None


def test_every_problem_is_one_line_of_path_and_message() -> None:
    job = with_changes(
        BASE_JOB, {"spec.elastic.minNodes": "two", "spec.elastic.rendezvous.port": 80, "spec.typo": True}
    )
    assert refusal(job).splitlines() == [
        'spec.elastic.minNodes: must be of type integer, got string "two"',
        "spec.elastic.rendezvous.port: should be greater than or equal to 1024 (got 80)",
        "spec.typo: unknown field",
    ]


def test_a_cross_field_rule_of_the_crd_refuses() -> None:
    job = with_changes(BASE_JOB, {"spec.elastic.minNodes": 3, "spec.elastic.maxNodes": 2})
    assert refusal(job) == "spec.elastic.minNodes: must be <= spec.elastic.maxNodes"


def test_an_instance_the_catalog_does_not_define_is_refused() -> None:
    job = with_changes(BASE_JOB, {"spec.instance": "dgxv100.32g.8.norm"})
    message = refusal(job)
    assert message.startswith(
        "spec.instance: unknown instance type 'dgxv100.32g.8.norm': no GPU family 'v100.32g' in the catalog"
    )
    assert "\n" not in message


def test_the_catalog_is_the_one_the_operator_is_configured_with(tmp_path: Path) -> None:
    """An admin's catalog without the a100 families refuses an instance the default catalog knows."""
    memo = memo_for(config=admin_catalog_without_a100(tmp_path))
    assert refusal(BASE_JOB, memo=memo).startswith("spec.instance: unknown instance type 'dgxa100.80g.8.norm'")
    assert review(with_changes(BASE_JOB, {"spec.instance": "dgxh100.80g.8.norm"}), memo=memo) is None


def test_a_maxnodes_beyond_the_nvlink_domain_is_refused() -> None:
    job = with_changes(BASE_JOB, {"spec.instance": "dgxgb200.186g.4.norm", "spec.elastic.maxNodes": 19})
    assert refusal(job) == (
        "spec.elastic.maxNodes: dgxgb200.186g.4.norm keeps a job inside one NVLink domain of 18 nodes; "
        "maxNodes 19 can never be placed"
    )
    assert review(with_changes(job, {"spec.elastic.maxNodes": 18})) is None


def test_an_update_changing_the_instance_of_a_running_job_is_refused_at_its_path() -> None:
    old = job_in("Running")
    new = edited(old, {"spec.instance": "dgxh100.80g.8.norm"})
    assert refusal(new, old, "UPDATE") == f"spec.instance: {RUNNING_MESSAGE}"


def test_an_update_of_a_running_job_changing_other_fields_passes() -> None:
    old = job_in("Running")
    assert review(edited(old, {"spec.elastic.maxNodes": 2, **MUTABLE_EDITS["env"]}), old, "UPDATE") is None


def test_the_same_instance_change_passes_once_the_job_is_suspended() -> None:
    old = job_in("Suspended")
    assert review(edited(old, {"spec.instance": "dgxh100.80g.8.norm"}), old, "UPDATE") is None


def test_a_create_is_never_checked_against_an_old_object() -> None:
    """kopf passes no old object on CREATE; even if one came, only UPDATE compares."""
    old = job_in("Running")
    assert review(edited(old, {"spec.instance": "dgxh100.80g.8.norm"}), old, "CREATE") is None


def data_job(output_dir: str = "/data/out", mount_path: str = "/data") -> Body:
    return with_changes(
        BASE_JOB,
        {"spec.dataMounts": [{"name": "data", "mountPath": mount_path}], "spec.trainer.output.dir": output_dir},
    )


def test_an_output_dir_inside_an_input_mount_of_the_cluster_is_refused() -> None:
    kube = FakeKube({("ml", "data"): BASE_MOUNT})
    assert refusal(data_job(), memo=memo_for(kube)) == OUT_DIR_IN_INPUT
    assert kube.asked == [("ml", "data")]


@pytest.mark.parametrize(
    ("mounts", "output_dir"),
    [
        pytest.param({("ml", "data"): with_changes(BASE_MOUNT, {"spec.direction": "Out"})}, "/data/out", id="out"),
        pytest.param({("ml", "data"): BASE_MOUNT}, "/output", id="outside-the-mount"),
        pytest.param({("ml", "data"): BASE_MOUNT}, "/database/out", id="sibling-prefix"),
        # The mount is not in the cluster yet (or lives in another namespace): the operator reports it later.
        pytest.param({}, "/data/out", id="mount-absent"),
        pytest.param({("other", "data"): BASE_MOUNT}, "/data/out", id="mount-in-another-namespace"),
    ],
)
def test_an_output_dir_is_refused_only_inside_an_existing_input_mount(
    mounts: dict[tuple[str, str], Body], output_dir: str
) -> None:
    kube = FakeKube(mounts)
    assert review(data_job(output_dir), memo=memo_for(kube)) is None
    assert kube.asked == [("ml", "data")]


def test_a_data_mount_at_a_path_kubedgx_uses_is_refused() -> None:
    kube = FakeKube({("ml", "data"): BASE_MOUNT})
    message = refusal(data_job("/output", mount_path="/dev/shm"), memo=memo_for(kube))
    assert message == "spec.dataMounts[0].mountPath: /dev/shm is used by kubedgx itself; pick another path"


def test_without_a_cluster_client_mounts_are_not_looked_up() -> None:
    assert review(data_job()) is None


def test_an_invalid_job_is_not_looked_up_in_the_cluster() -> None:
    kube = FakeKube({("ml", "data"): BASE_MOUNT})
    job = with_changes(data_job(), {"spec.elastic.minNodes": 0})
    assert refusal(job, memo=memo_for(kube)) == "spec.elastic.minNodes: should be greater than or equal to 1 (got 0)"
    assert kube.asked == []


@pytest.mark.parametrize("body", [BASE_JOB, BASE_MOUNT], ids=["job", "mount"])
def test_delete_passes_whatever_the_object(body: Body) -> None:
    broken = with_changes(body, {"spec.instance": "nope", "spec.source": "http://x", "spec.typo": 1})
    assert review(broken, None, "DELETE", memo_for(FakeKube())) is None
    assert review(broken, broken, "DELETE") is None


def test_a_mount_with_a_bad_source_is_refused() -> None:
    mount = with_changes(BASE_MOUNT, {"spec.source": "https://bucket.example.com/prefix"})
    assert refusal(mount) == (
        'spec.source: invalid value "https://bucket.example.com/prefix": must be an object-store URI such as '
        "s3://bucket/prefix or gs://bucket/prefix (bucket: 3-63 lower-case letters, digits, '.', '-' or '_')"
    )


def test_a_mount_cross_field_rule_refuses() -> None:
    mount = with_changes(BASE_MOUNT, {"spec.source": "gs://bucket/prefix", "spec.region": "eu-west-1"})
    assert refusal(mount) == "spec.region: region applies only to s3:// sources"


@pytest.mark.parametrize("cause", ["catalog-dropped-the-instance", "mount-became-an-input"])
def test_removing_the_finalizer_of_a_deleting_job_is_never_refused(cause: str, tmp_path: Path) -> None:
    if cause == "catalog-dropped-the-instance":
        stored, memo = BASE_JOB, memo_for(FakeKube(), admin_catalog_without_a100(tmp_path))
    else:
        stored, memo = data_job(), memo_for(FakeKube({("ml", "data"): BASE_MOUNT}))
    old = with_changes(
        job_in("Running", base=stored),
        {"metadata.finalizers": [FINALIZER], "metadata.deletionTimestamp": "2024-05-02T08:00:00Z"},
    )
    new = edited(old, {"metadata.finalizers": []})
    assert review(new, old, "UPDATE", memo) is None


# -- the children, dry-run against the apiserver --------------------------------------------------------------


def status_error(code: int, reason: str, message: str) -> ApiError:
    """An ApiError as kubernetes_asyncio raises it for an apiserver's answer: a metav1 Status body."""
    exc = ApiError(status=code, reason=reason)
    status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "reason": reason}
    exc.body = json.dumps({**status, "code": code}).encode()
    return exc


def _config_map_name(body: Body) -> str:
    job = DGXTrainingJob.model_validate(body)
    config = trainer_config_map(JobIdentity.of(job), job.spec)
    assert config is not None
    name: str = config["metadata"]["name"]
    return name


#: BASE_JOB, run once: restartPolicy Never on norm capacity cannot be restarted in a new pod, so its answers
#: carry no checkpoint warning (tested on its own at the end of this file) beside the dry-run's they are about.
JOB = with_changes(BASE_JOB, {"spec.restartPolicy": "Never"})
#: JOB's trainer ConfigMap as the operator names it (by the job's uid, a placeholder before it is stored,
#: and the config's content).
CONFIG_MAP = _config_map_name(JOB)
POD_SECURITY = (
    'pods "job-worker-0" is forbidden: violates PodSecurity "baseline:latest": hostPath volumes (volume "data-0")'
)
NO_PRIORITY_CLASS = 'pods "job-worker-0" is forbidden: no PriorityClass with name kubedgx-high was found'
EXCEEDED_QUOTA = (
    'pods "job-worker-0" is forbidden: exceeded quota: compute, requested: pods=1, used: pods=4, limited: pods=4'
)
RBAC = (
    'pods is forbidden: User "system:serviceaccount:kubedgx:kubedgx" cannot create resource "pods" in API group "" '
    'in the namespace "ml"'
)


class DryRunKube(FakeKube):
    """A FakeKube that also answers ``dry_run_create`` as :class:`dgx_operator.kube.Kube` does: None when the
    apiserver would create the object, else what ``refuse`` says it raises (an ApiError, another exception,
    or ``HANG``: no answer ever)."""

    HANG = object()

    def __init__(
        self,
        refuse: Callable[[Body], BaseException | object | None] = lambda obj: None,
        mounts: Mapping[tuple[str, str], Body] | None = None,
    ) -> None:
        super().__init__(mounts)
        self.refuse = refuse
        self.sent: list[Body] = []

    async def dry_run_create(self, obj: Body) -> None:
        self.sent.append(copy.deepcopy(obj))
        answer = self.refuse(obj)
        if answer is DryRunKube.HANG:
            await asyncio.Event().wait()
        if isinstance(answer, BaseException):
            raise answer

    def kinds(self) -> list[tuple[str, str]]:
        return [(o["kind"], o["metadata"]["name"]) for o in self.sent]


def serving(kube: FakeKube, *, dry_run: bool = True, **config: Any) -> kopf.Memo:
    """The memo of an operator that serves the webhook (dry-runs are on by default)."""
    hook = WebhookConfig(host="127.0.0.1", port=9443, insecure=True, dry_run=dry_run)
    return memo_for(kube, OperatorConfig(webhook=hook, **config))


def pods(answer: BaseException | object) -> Callable[[Body], BaseException | object | None]:
    return lambda obj: answer if obj["kind"] == "Pod" else None


def warned(body: Body, memo: kopf.Memo, old: Body | None = None, operation: str = "CREATE") -> list[str]:
    """The warnings of a review that let ``body`` through (fails the test if it refused)."""
    warnings: list[str] = []
    asyncio.run(admission.review(memo, body, old, operation, warnings))
    return warnings


def test_a_created_job_has_its_config_map_service_and_worker_0_dry_run_without_owner() -> None:
    kube = DryRunKube()
    assert warned(JOB, serving(kube)) == []
    assert kube.kinds() == [("ConfigMap", CONFIG_MAP), ("Service", "job"), ("Pod", "job-worker-0")]
    assert CONFIG_MAP.startswith("job-trainer-")
    assert all("ownerReferences" not in o["metadata"] for o in kube.sent)
    assert all(o["metadata"]["namespace"] == "ml" for o in kube.sent)
    pod = kube.sent[2]
    # The operator's own builders, with its own settings: the PriorityClass of spec.priority (normal).
    assert pod["spec"]["priorityClassName"] == "kubedgx-normal"


def status_of_refusal(body: Body, memo: kopf.Memo) -> tuple[int | None, str]:
    error = review(body, memo=memo)
    assert error is not None, "the job was allowed"
    return error.code, str(error)


@pytest.mark.parametrize(
    ("error", "kind", "child"),
    [
        pytest.param(status_error(403, "Forbidden", POD_SECURITY), "Pod", "worker pod job-worker-0", id="pod-security"),
        pytest.param(
            status_error(403, "Forbidden", NO_PRIORITY_CLASS), "Pod", "worker pod job-worker-0", id="priority"
        ),
        pytest.param(
            status_error(422, "Invalid", 'Service "job" is invalid: spec.ports[1]: Duplicate value: "23456/TCP"'),
            "Service",
            "Service job",
            id="invalid",
        ),
        pytest.param(
            status_error(400, "BadRequest", f'ConfigMap "{CONFIG_MAP}" is invalid: data: Too long'),
            "ConfigMap",
            f"ConfigMap {CONFIG_MAP}",
            id="bad-request",
        ),
    ],
)
def test_a_permanent_refusal_of_a_child_refuses_the_job_quoting_the_apiserver(
    error: ApiError, kind: str, child: str
) -> None:
    kube = DryRunKube(lambda obj: error if obj["kind"] == kind else None)
    code, message = status_of_refusal(JOB, serving(kube))
    assert code == 422
    assert message == f"spec: the apiserver would refuse {child}: {json.loads(error.body or b'{}')['message']}"


def test_the_refusal_is_invalid_and_names_the_child_as_in_the_docs() -> None:
    kube = DryRunKube(pods(status_error(403, "Forbidden", POD_SECURITY)))
    assert status_of_refusal(JOB, serving(kube)) == (
        422,
        "spec: the apiserver would refuse worker pod job-worker-0: " + POD_SECURITY,
    )


@pytest.mark.parametrize(
    ("answer", "warning"),
    [
        pytest.param(
            status_error(403, "Forbidden", EXCEEDED_QUOTA),
            "spec: the apiserver would not create worker pod job-worker-0 now: " + EXCEEDED_QUOTA,
            id="quota-exceeded",
        ),
        pytest.param(
            status_error(403, "Forbidden", 'pods "job-worker-0" is forbidden: status unknown for quota: compute'),
            "spec: the apiserver would not create worker pod job-worker-0 now:",
            id="quota-not-computed-yet",
        ),
        pytest.param(
            status_error(
                403,
                "Forbidden",
                'pods "job-worker-0" is forbidden: error looking up service account ml/trainer: serviceaccount '
                '"trainer" not found',
            ),
            "spec: the apiserver would not create worker pod job-worker-0 now:",
            id="service-account-to-come",
        ),
        pytest.param(
            status_error(403, "Forbidden", RBAC),
            f"spec: could not dry-run worker pod job-worker-0 (HTTP 403: {RBAC}); admitted without that check",
            id="rbac-of-the-operator",
        ),
        pytest.param(
            status_error(500, "InternalError", "etcdserver: request timed out"),
            "spec: could not dry-run worker pod job-worker-0 (HTTP 500: etcdserver: request timed out); admitted "
            "without that check",
            id="server-error",
        ),
        pytest.param(
            status_error(429, "TooManyRequests", "too many requests"),
            "spec: could not dry-run worker pod job-worker-0 (HTTP 429: too many requests)",
            id="throttled",
        ),
        pytest.param(
            aiohttp.ClientConnectionError("Cannot connect to host 10.96.0.1:443"),
            "spec: could not dry-run worker pod job-worker-0 (Cannot connect to host 10.96.0.1:443)",
            id="connection",
        ),
        pytest.param(
            TimeoutError(),
            "spec: could not dry-run worker pod job-worker-0 (the request to the API server timed out)",
            id="client-timeout",
        ),
    ],
)
def test_what_the_spec_cannot_cure_admits_the_job_with_a_warning(answer: BaseException, warning: str) -> None:
    kube = DryRunKube(pods(answer))
    (line,) = warned(JOB, serving(kube))
    assert line.startswith(warning)
    assert "\n" not in line


def test_a_taken_name_means_the_child_passed_and_says_nothing() -> None:
    """409 AlreadyExists comes after validation and admission: on a job's UPDATE its children exist."""
    exists = status_error(409, "AlreadyExists", 'pods "job-worker-0" already exists')
    kube = DryRunKube(lambda obj: exists)
    old = job_in("Running", base=JOB)
    assert warned(edited(old, {"spec.maxDuration": "2h"}), serving(kube), old, "UPDATE") == []
    assert len(kube.sent) == 3


def test_no_answer_in_time_admits_the_job_with_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admission, "DRY_RUN_TIMEOUT_S", 0.05)
    kube = DryRunKube(pods(DryRunKube.HANG))
    assert warned(JOB, serving(kube)) == [
        "spec: the apiserver did not answer the dry-run of the job's children within 0.05s; admitted without that check"
    ]


def test_an_update_is_refused_only_for_what_the_stored_spec_did_not_have_already() -> None:
    """Raising spec.priority to a class that does not exist is the edit's fault; a namespace labelled for
    PodSecurity after the job was made is not, and must not stop the job from being edited (suspended)."""
    missing_high = DryRunKube(
        lambda obj: (
            status_error(403, "Forbidden", NO_PRIORITY_CLASS)
            if obj["kind"] == "Pod" and obj["spec"].get("priorityClassName") == "kubedgx-high"
            else None
        )
    )
    old = job_in("Running", base=JOB)
    new = edited(old, {"spec.priority": "high"})
    error = review(new, old, "UPDATE", serving(missing_high))
    assert error is not None
    assert str(error) == "spec: the apiserver would refuse worker pod job-worker-0: " + NO_PRIORITY_CLASS
    # The new spec's worker, then the stored spec's: only the refused child is asked about again.
    assert [o["spec"].get("priorityClassName") for o in missing_high.sent if o["kind"] == "Pod"] == [
        "kubedgx-high",
        "kubedgx-normal",
    ]

    everything = DryRunKube(pods(status_error(403, "Forbidden", POD_SECURITY)))
    (line,) = warned(edited(old, {"spec.suspend": True}), serving(everything), old, "UPDATE")
    assert line == (
        f"spec: the apiserver would refuse worker pod job-worker-0: {POD_SECURITY} (it refuses the job's "
        "previous spec too, so this change is not refused for it)"
    )
    # A CREATE has no previous spec to excuse it.
    assert review(with_changes(JOB, {"spec.suspend": True}), memo=serving(everything)) is not None


def test_worker_0_is_dry_run_only_when_its_mounts_were_found() -> None:
    """Without the mount the pod cannot be rendered (the job waits for it); with it, the pod carries its
    hostPath cache, which is what PodSecurity baseline refuses."""
    job = with_changes(data_job("/output"), {"spec.restartPolicy": "Never"})
    kube = DryRunKube()
    assert warned(job, serving(kube)) == []
    assert kube.kinds() == [("ConfigMap", _config_map_name(job)), ("Service", "job")]

    kube = DryRunKube(mounts={("ml", "data"): BASE_MOUNT})
    assert warned(job, serving(kube)) == []
    pod = kube.sent[-1]
    assert pod["kind"] == "Pod"
    assert [v["name"] for v in pod["spec"]["volumes"] if "hostPath" in v] == ["data-0"]


def test_a_command_job_has_no_config_map_to_dry_run() -> None:
    kube = DryRunKube()
    assert warned(command_job(), serving(kube)) == []
    assert kube.kinds() == [("Service", "job"), ("Pod", "job-worker-0")]


@pytest.mark.parametrize(
    "case",
    ["switched-off", "invalid-job", "metadata-only-update", "delete", "mount", "no-webhook-config"],
)
def test_no_dry_run_when_it_is_off_or_has_nothing_to_add(case: str) -> None:
    kube = DryRunKube(lambda obj: status_error(403, "Forbidden", POD_SECURITY))
    old = job_in("Running", base=JOB)
    if case == "switched-off":
        assert review(JOB, memo=serving(kube, dry_run=False)) is None
    elif case == "invalid-job":  # its own problems are the answer; the children would only repeat them
        assert refusal(with_changes(JOB, {"spec.elastic.minNodes": 0}), memo=serving(kube)).startswith(
            "spec.elastic.minNodes:"
        )
    elif case == "metadata-only-update":
        assert review(edited(old, {"metadata.labels": {"team": "nlp"}}), old, "UPDATE", serving(kube)) is None
    elif case == "delete":
        assert review(old, old, "DELETE", serving(kube)) is None
    elif case == "mount":
        assert review(BASE_MOUNT, memo=serving(kube)) is None
    else:
        assert review(JOB, memo=memo_for(kube)) is None
    assert kube.sent == []


def test_the_dry_run_follows_the_operators_priority_classes() -> None:
    """The same mapping as the operator's: a priority the admin mapped to no class sends no priorityClassName."""
    kube = DryRunKube()
    memo = serving(kube, priority_classes={"normal": "team-normal"})
    assert warned(with_changes(JOB, {"spec.priority": "normal"}), memo) == []
    assert warned(with_changes(JOB, {"spec.priority": "high"}), memo) == []
    assert [o["spec"].get("priorityClassName") for o in kube.sent if o["kind"] == "Pod"] == ["team-normal", None]


# -- the checkpoint warning (validation/durability.py) -----------------------------------------------------------


def test_a_restartable_job_without_durable_checkpoints_is_admitted_with_one_warning() -> None:
    """A warning, never a refusal, judged with the mounts the cluster has; one it did not find is not guessed at."""
    spot = with_changes(JOB, {"spec.instance": "dgxa100.80g.8.spot"})
    (line,) = warned(spot, memo_for(FakeKube()))
    assert line.startswith(
        "spec.dataMounts: this job can be restarted in a new pod (spot capacity), but its checkpoint"
    )
    durable = with_changes(
        spot,
        {"spec.dataMounts": [{"name": "data", "mountPath": "/output"}], "spec.trainer.output.dir": "/output/run-1"},
    )
    out = with_changes(BASE_MOUNT, {"spec.direction": "Out"})
    assert warned(durable, memo_for(FakeKube({("ml", "data"): out}))) == []
    assert warned(durable, memo_for(FakeKube())) == [], "the mount is not in the cluster yet"
    assert warned(durable, memo_for()) == [], "no cluster client: no mount to judge by"
    kept_on_the_node = with_changes(out, {"spec.syncCheckpoints": False})
    (line,) = warned(durable, memo_for(FakeKube({("ml", "data"): kept_on_the_node})))
    assert line.startswith(
        "spec.dataMounts[0]: this job can be restarted in a new pod (spot capacity), but DGXDataMoun"
    )


# -- guard rails (DGXLimits and the chart's limits) --------------------------------------------------------------


def dgx_limits(spec: dict[str, Any], namespace: str = "ml") -> Body:
    return {
        "apiVersion": "kubedgx.io/v1alpha1",
        "kind": "DGXLimits",
        "metadata": {"name": "default", "namespace": namespace},
        "spec": spec,
    }


LIMITED = {"maxDuration": {"default": "24h", "max": "72h"}, "priorities": ["low", "normal"]}


def test_a_job_over_the_namespaces_limit_is_refused_naming_the_limit_and_where_it_is_set() -> None:
    kube = FakeKube(limits={"ml": dgx_limits(LIMITED)})
    message = refusal(with_changes(BASE_JOB, {"spec.maxDuration": "96h", "spec.priority": "high"}), memo=memo_for(kube))
    assert message.splitlines() == [
        "spec.maxDuration: 96h exceeds the maximum 72h set by DGXLimits ml/default (spec.maxDuration.max)",
        "spec.priority: high is not allowed in namespace ml (DGXLimits ml/default allows low, normal)",
    ]
    assert kube.asked_limits == ["ml"]


def test_a_default_that_applies_is_a_warning_and_is_not_written_into_the_job() -> None:
    kube = FakeKube(limits={"ml": dgx_limits(LIMITED)})
    job = with_changes(BASE_JOB, {"spec.restartPolicy": "Never"})  # no checkpoint warning beside it
    assert warned(job, memo_for(kube)) == ["spec.maxDuration unset: 24h applies (DGXLimits ml/default)"]
    assert "maxDuration" not in job["spec"]


def test_the_charts_limits_apply_without_a_dgxlimits() -> None:
    config = OperatorConfig(limits=LimitsSpec.model_validate({"maxNodes": 2}))
    message = refusal(with_changes(BASE_JOB, {"spec.elastic.maxNodes": 4}), memo=memo_for(FakeKube(), config))
    assert message == (
        "spec.elastic.maxNodes: 4 exceeds the maximum of 2 nodes per job set by the chart value limits.maxNodes"
    )


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        pytest.param(ApiError(status=403, reason="Forbidden"), "the API server answered HTTP 403 Forbidden", id="rbac"),
        pytest.param(aiohttp.ClientConnectionError("refused"), "refused", id="connection"),
    ],
)
def test_limits_that_cannot_be_looked_up_refuse_for_now_rather_than_let_the_job_through(
    answer: BaseException, reason: str
) -> None:
    error = review(BASE_JOB, memo=memo_for(FakeKube(limits={"ml": answer})))
    assert error is not None
    assert error.code == admission.RETRY_CODE
    assert str(error) == (
        f"spec: cannot check against DGXLimits ml/default (the namespace's guard rails): {reason}; retry"
    )


def test_a_dgxlimits_this_kubedgx_cannot_read_refuses_for_now_saying_why() -> None:
    broken = dgx_limits({"maxNodes": "many"})
    error = review(BASE_JOB, memo=memo_for(FakeKube(limits={"ml": broken})))
    assert error is not None
    assert error.code == admission.RETRY_CODE
    assert str(error).startswith(
        "spec: cannot check against DGXLimits ml/default (the namespace's guard rails): DGXLimits cannot be read by "
        "this kubedgx (spec.maxNodes: "
    )


def test_an_update_is_refused_only_for_the_limit_it_breaks() -> None:
    """A limit set after the job was made refuses no edit (Kueue flips spec.suspend), only a new breach."""
    kube = FakeKube(limits={"ml": dgx_limits(LIMITED)})
    old = job_in("Pending", base=with_changes(BASE_JOB, {"spec.maxDuration": "96h"}))
    assert review(edited(old, {"spec.suspend": True}), old, "UPDATE", memo_for(kube)) is None
    assert review(edited(old, {"spec.backoffLimit": 5}), old, "UPDATE", memo_for(kube)) is None
    assert refusal(edited(old, {"spec.priority": "high"}), old, "UPDATE", memo_for(kube)) == (
        "spec.priority: high is not allowed in namespace ml (DGXLimits ml/default allows low, normal)"
    )


def test_adding_the_kueue_priority_class_label_later_is_checked() -> None:
    """A metadata-only update, which the webhook otherwise never refuses (open question 10)."""
    kube = FakeKube(limits={"ml": dgx_limits({"kueuePriorityClasses": ["research"]})})
    old = job_in("Running")
    labelled = edited(old, {"metadata.labels": {KUEUE_PRIORITY_LABEL: "production"}})
    assert refusal(labelled, old, "UPDATE", memo_for(kube)) == (
        'metadata.labels["kueue.x-k8s.io/priority-class"]: production is not allowed in namespace ml '
        "(DGXLimits ml/default allows research)"
    )
    assert (
        review(edited(old, {"metadata.labels": {KUEUE_PRIORITY_LABEL: "research"}}), old, "UPDATE", memo_for(kube))
        is None
    )
    # Other labels are never checked, nor looked up for.
    asked = len(kube.asked_limits)
    assert review(edited(old, {"metadata.labels": {"team": "nlp"}}), old, "UPDATE", memo_for(kube)) is None
    assert len(kube.asked_limits) == asked


def test_the_match_conditions_send_priority_class_label_changes_and_no_other_metadata_update() -> None:
    """The apiserver's matchConditions, evaluated offline with cel-python as the apiserver would."""
    (_, changed) = admission.MATCH_CONDITIONS
    env = celpy.Environment()
    program = env.program(env.compile(changed["expression"]))

    def sent(old: Body, new: Body) -> bool:
        request = {"operation": "UPDATE"}
        return bool(
            program.evaluate(
                {"object": json_to_cel(new), "oldObject": json_to_cel(old), "request": json_to_cel(request)}
            )
        )

    old = job_in("Running")
    labelled = edited(old, {"metadata.labels": {KUEUE_PRIORITY_LABEL: "x"}})
    assert sent(old, labelled)
    assert sent(labelled, edited(labelled, {"metadata.labels": {}}))
    assert sent(old, edited(old, {"spec.suspend": True}))
    assert not sent(old, edited(old, {"metadata.labels": {"team": "nlp"}}))
    assert not sent(old, edited(old, {"metadata.finalizers": ["kubedgx.io/finalizer"]}))


# -- budgets (DGXBudget): the warning of a run that cannot fit ----------------------------------------------------

#: The webhook's clock in these tests: mid-December, so the stored period below is the current one.
NOW = datetime(2026, 12, 15, 12, tzinfo=UTC)
#: A job that has run 2 hours on one a100 node (8 GPUs at the shipped example price, 1.80 USD/GPU-h): 28.80 USD
#: of usage no budget has settled yet, and a reservation for 8 more hours (115.20 USD committed).
RUNNING_USAGE = {
    "gpuSeconds": 2 * 3600 * 8,
    "accountedUntil": "2026-12-15T12:00:00Z",
    "buckets": [{"capacity": "norm", "pricePerGpuHour": "1.80", "gpuSeconds": 2 * 3600 * 8}],
}


def stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def running_job() -> Body:
    return with_changes(
        BASE_JOB,
        {
            "metadata.name": "running",
            "metadata.uid": "uid-running",
            "metadata.creationTimestamp": stamp(NOW - timedelta(hours=2)),
            "spec.restartPolicy": "Never",
            "spec.maxDuration": "10h",
            "status": {"phase": "Running", "usage": RUNNING_USAGE},
        },
    )


def dgx_budget(spec: dict[str, Any] | None = None, name: str = "burst", status: bool = True) -> Body:
    """A DGXBudget of namespace ml limiting December's cost to 1000 USD, 600 of it spent by a job since deleted,
    the running job's reservation in it."""
    budget = with_changes(
        BASE_BUDGET, {"metadata.name": name, "spec": {"limits": {"cost": "1000"}, "period": {"calendar": "Month"}}}
    )
    budget["spec"].update(spec or {})
    if status:
        budget["status"] = {
            "currency": "USD",
            "period": {"start": "2026-12-01T00:00:00Z", "end": "2027-01-01T00:00:00Z"},
            "ledger": [
                {
                    "job": "gone",
                    "uid": "uid-gone",
                    "seenGpuSeconds": 1_200_000,
                    "seenCost": "600",
                    "gpuSeconds": 1_200_000,
                    "cost": "600",
                }
            ],
            "reservations": [
                {
                    "job": "running",
                    "uid": "uid-running",
                    "capacity": "norm",
                    "nodes": 1,
                    "gpusPerNode": 8,
                    "pricePerGpuHour": "1.80",
                    "from": stamp(NOW - timedelta(hours=2)),
                    "until": stamp(NOW + timedelta(hours=8)),
                }
            ],
        }
    return budget


def over(budget: Body | None = None, *, jobs: list[Body] | None = None) -> FakeKube:
    """A FakeKube whose namespace ml has ``budget`` (default: :func:`dgx_budget`'s) and ``jobs`` (default: the
    running job)."""
    return FakeKube(budgets={"ml": [budget or dgx_budget()]}, jobs={"ml": [running_job()] if jobs is None else jobs})


@pytest.fixture
def december(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admission, "now", lambda: NOW)


#: BASE_JOB run once (no checkpoint warning), for a day: 1 node x 8 GPUs x 1.80 USD/GPU-h x 24h = 345.60 USD.
DAY_JOB = with_changes(BASE_JOB, {"spec.restartPolicy": "Never", "spec.maxDuration": "24h"})
OVER = (
    "DGXBudget ml/burst: this run's worst case 1 node x 8 GPUs x 1.80 USD/GPU-h x 24h = 345.60 USD does not fit: "
    "spent 628.80 + committed 115.20 of 1000.00 USD (2026-12-01 to 2027-01-01, UTC); it starts when the budget is "
    "raised, a running job ends, or the period rolls on 2027-01-01: this job will wait (BudgetExceeded) until then"
)


@pytest.mark.usefixtures("december")
def test_a_namespace_without_budgets_costs_one_listing_and_no_warning() -> None:
    kube = FakeKube(jobs={"ml": [running_job()]})
    assert warned(DAY_JOB, memo_for(kube)) == []
    assert kube.listed == [("dgxbudgets", "ml")]  # its jobs are not listed


@pytest.mark.usefixtures("december")
def test_a_run_that_fits_warns_nothing() -> None:
    """600 spent + 28.80 unsettled + 115.20 committed + 10h x 8 x 1.80 (144.00) = 888.00 <= 1000."""
    kube = over()
    assert warned(with_changes(DAY_JOB, {"spec.maxDuration": "10h"}), memo_for(kube)) == []
    assert kube.listed == [("dgxbudgets", "ml"), ("dgxtrainingjobs", "ml")]


@pytest.mark.usefixtures("december")
def test_a_run_that_cannot_fit_is_admitted_with_the_budgets_numbers() -> None:
    """600 spent + 28.80 unsettled + 115.20 committed + 345.60 = 1089.60 > 1000: admitted, with the message the job's
    BudgetExceeded condition will carry."""
    assert warned(DAY_JOB, memo_for(over())) == [OVER]


@pytest.mark.usefixtures("december")
def test_each_budget_that_holds_warns_and_report_budgets_never_do() -> None:
    report = dgx_budget({"enforcement": "Report"}, name="ledger")
    spot_only = dgx_budget({"capacities": ["spot"]}, name="spot")
    other_team = dgx_budget({"jobSelector": {"matchLabels": {"team": "vision"}}}, name="vision")
    hours = dgx_budget({"limits": {"gpuHours": "10"}}, name="hours", status=False)
    kube = FakeKube(budgets={"ml": [report, spot_only, other_team, hours, dgx_budget()]}, jobs={"ml": [running_job()]})
    assert warned(DAY_JOB, memo_for(kube)) == [
        "DGXBudget ml/hours: this run's worst case 1 node x 8 GPUs x 24h = 192.00 GPU-hours does not fit: spent 16.00 "
        "+ committed 0.00 of 10.00 GPU-hours (2026-12-01 to 2027-01-01, UTC), and alone exceeds the limit; it starts "
        "when the budget is raised or the run asks for less (fewer nodes, a shorter spec.maxDuration): this job will "
        "wait (BudgetExceeded) until then",
        OVER,
    ]


@pytest.mark.usefixtures("december")
def test_a_namespace_with_report_budgets_only_is_not_listed_further() -> None:
    kube = over(dgx_budget({"enforcement": "Report"}))
    assert warned(DAY_JOB, memo_for(kube)) == []
    assert kube.listed == [("dgxbudgets", "ml")]


@pytest.mark.usefixtures("december")
def test_a_run_without_maxduration_cannot_fit_a_hold_budget_and_is_told_to_set_it() -> None:
    job = with_changes(DAY_JOB, {"spec.maxDuration": DELETE})
    assert warned(job, memo_for(over())) == [
        "DGXBudget ml/burst: this run has no worst case to reserve: set spec.maxDuration (the budget holds a run until "
        "its nodes x GPUs x price x maxDuration fits): this job will wait (BudgetExceeded) until then"
    ]


@pytest.mark.usefixtures("december")
def test_the_guard_rails_default_maxduration_is_the_worst_case_of_a_job_without_one() -> None:
    job = with_changes(DAY_JOB, {"spec.maxDuration": DELETE})
    kube = over()
    kube.limits = {"ml": dgx_limits({"maxDuration": {"default": "24h"}})}
    assert warned(job, memo_for(kube)) == ["spec.maxDuration unset: 24h applies (DGXLimits ml/default)", OVER]
    kube.limits = {"ml": dgx_limits({"maxDuration": {"default": "10h"}})}
    assert warned(job, memo_for(kube)) == ["spec.maxDuration unset: 10h applies (DGXLimits ml/default)"]


@pytest.mark.usefixtures("december")
def test_an_update_counts_the_jobs_own_usage_once_and_not_its_own_reservation() -> None:
    """The running job, its maxDuration raised: its own 28.80 USD count once (the listed copy is left out), and the
    new run's worst case replaces its reservation (the 115.20 committed to it are not counted beside it). At 25h,
    600 + 28.80 + 360.00 = 988.80 fits; counting its usage twice (1017.60) or its reservation (1104.00) would not."""
    old = running_job()
    assert warned(edited(old, {"spec.maxDuration": "25h"}), memo_for(over()), old, "UPDATE") == []
    [message] = warned(edited(old, {"spec.maxDuration": "26h"}), memo_for(over()), old, "UPDATE")
    assert "= 374.40 USD does not fit: spent 628.80 + committed 0.00 of 1000.00 USD" in message


@pytest.mark.usefixtures("december")
def test_no_budget_listing_when_the_spec_did_not_change() -> None:
    """Kueue's suspend flips and label edits change no run's worst case: no listing, no warning for Kueue's log."""
    old = running_job()
    kube = over()
    assert warned(edited(old, {"spec.suspend": True}), memo_for(kube), old, "UPDATE") == []
    labelled = edited(old, {"metadata.labels": {KUEUE_PRIORITY_LABEL: "research"}})
    assert warned(labelled, memo_for(kube), old, "UPDATE") == []
    assert kube.listed == []


@pytest.mark.usefixtures("december")
def test_a_refused_job_is_not_warned_about_budgets() -> None:
    """A refused job has no run to wait: the budget warning would only bury the refusal."""
    kube = over()
    kube.limits = {"ml": dgx_limits({"priorities": ["low"]})}
    warnings: list[str] = []
    with pytest.raises(kopf.AdmissionError):
        asyncio.run(admission.review(memo_for(kube), DAY_JOB, None, "CREATE", warnings))
    assert warnings == []
    kube.limits = {}
    assert warned(DAY_JOB, memo_for(kube)) == [OVER]  # the same job, admitted


@pytest.mark.usefixtures("december")
def test_a_budget_this_kubedgx_cannot_read_is_a_warning_and_the_others_still_count() -> None:
    broken = dgx_budget({"period": {"calendar": "Fortnight"}}, name="broken")
    kube = over()
    kube.budgets["ml"] = [broken, dgx_budget()]
    assert warned(DAY_JOB, memo_for(kube)) == [
        "DGXBudget ml/broken cannot be read by this kubedgx, so this job was not checked against it; re-apply the "
        "budget with a valid spec",
        OVER,
    ]


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        pytest.param(ApiError(status=403, reason="Forbidden"), "the API server answered HTTP 403 Forbidden", id="rbac"),
        pytest.param(aiohttp.ClientConnectionError("refused"), "refused", id="connection"),
        pytest.param(FakeKube.HANG, "the API server did not answer within 0.05s", id="no-answer"),
    ],
)
def test_budgets_that_cannot_be_listed_admit_the_job_with_a_warning(
    answer: object, reason: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(admission, "MOUNT_LOOKUP_TIMEOUT_S", 0.05)
    kube = FakeKube(budgets={"ml": answer})
    assert warned(DAY_JOB, memo_for(kube)) == [
        f"spec: cannot check whether this job fits the DGXBudgets of namespace ml: {reason}; admitted without that "
        "check"
    ]


@pytest.mark.usefixtures("december")
def test_a_failure_judging_the_budgets_is_a_warning_not_a_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: Any) -> list[str]:
        raise ValueError("a ledger no test foresaw")

    monkeypatch.setattr(budget_warnings, "warnings", broken)
    assert warned(DAY_JOB, memo_for(over())) == [
        "spec: cannot check whether this job fits the DGXBudgets of namespace ml: ValueError: a ledger no test "
        "foresaw; admitted without that check"
    ]
