"""DGXDataMount decisions (reconcile/mounts.py): when to list again, what a listing or its error means
for the mount's status and events, which jobs hold it, and how a job reads its state."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from dgx_operator.api.datamount import DGXDataMount
from dgx_operator.reconcile.mounts import (
    Listed,
    human_bytes,
    mount_state,
    needs_listing,
    parse_mount,
    plan_mount,
    syncing,
    users,
)
from tests.conftest import BASE_MOUNT, with_changes

T0 = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)
T1 = T0 + timedelta(minutes=5)
DIGEST = "sha256:" + "1" * 64
OTHER_DIGEST = "sha256:" + "2" * 64
LISTED = Listed(objects=3, total_bytes=1536, digest=DIGEST)
DENIED = Listed(error="AccessDenied", message="access denied to s3://bucket/prefix: check the policy")
UNREACHABLE = Listed(error="Unreachable", message="s3://bucket/prefix did not answer", transient=True)


def ready_condition(
    status: str, reason: str, message: str, since: datetime = T0, generation: int = 1
) -> dict[str, Any]:
    return {
        "type": "Ready",
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since.isoformat(),
        "observedGeneration": generation,
    }


def mount(
    changes: dict[str, Any] | None = None, *, generation: int | None = 1, status: dict[str, Any] | None = None
) -> DGXDataMount:
    raw = with_changes(BASE_MOUNT, {"metadata.generation": generation, **(changes or {})})
    if status is not None:
        raw["status"] = status
    return DGXDataMount.model_validate(raw)


READY_STATUS: dict[str, Any] = {
    "phase": "Ready",
    "observedGeneration": 1,
    "objects": 3,
    "totalBytes": 1536,
    "manifestDigest": DIGEST,
    "conditions": [ready_condition("True", "Listed", "3 objects, 1.5 KiB at s3://bucket/prefix")],
}
FAILED_STATUS: dict[str, Any] = {
    "phase": "Failed",
    "observedGeneration": 1,
    "conditions": [ready_condition("False", "BucketNotFound", "bucket 'bucket' does not exist")],
}


def ready(m: DGXDataMount) -> tuple[str, str, str, datetime, int | None]:
    status = m.status
    assert status is not None
    (c,) = [c for c in status.conditions if c.type == "Ready"]
    return c.status, c.reason, c.message, c.last_transition_time, c.observed_generation


def after(m: DGXDataMount, listed: Listed, now: datetime = T1) -> tuple[DGXDataMount, list[tuple[str, str, str]], bool]:
    """(the mount with the planned status, events, retry)."""
    plan = plan_mount(m, listed, now)
    return m.model_copy(update={"status": plan.status}), plan.events, plan.retry


# --- needs_listing ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "generation", "expected"),
    [
        (None, 1, True),
        ({}, 1, True),  # no phase yet
        ({"phase": "Pending"}, 1, True),
        ({"phase": "Syncing", "observedGeneration": 1}, 1, True),  # an operator restarted mid-listing
        (READY_STATUS, 1, False),
        (READY_STATUS, 2, True),  # the spec changed
        (FAILED_STATUS, 1, False),  # a permanent error is not retried until the spec changes
        (FAILED_STATUS, 2, True),
        ({**READY_STATUS, "observedGeneration": 0}, None, False),  # no generation reads as 0
        ({**READY_STATUS, "observedGeneration": None}, 1, True),
    ],
)
def test_needs_listing(status: dict[str, Any] | None, generation: int | None, expected: bool) -> None:
    assert needs_listing(mount(generation=generation, status=status)) is expected


# --- syncing ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({}, "listing s3://bucket/prefix"),
        ({"spec.direction": "Out", "spec.source": "gs://bucket/out"}, "checking gs://bucket/out"),
    ],
)
def test_syncing_from_nothing(changes: dict[str, Any], message: str) -> None:
    m = mount(changes, generation=4)
    status = syncing(m, T0)
    assert status.phase == "Syncing"
    assert status.observed_generation is None  # the listing has not described any spec yet
    after_sync = m.model_copy(update={"status": status})
    assert ready(after_sync) == ("False", "Syncing", message, T0, 4)
    assert m.status is None


def test_syncing_keeps_the_previous_listing_and_moves_the_transition_time() -> None:
    m = mount(generation=2, status=READY_STATUS)
    status = syncing(m, T1)
    assert (status.phase, status.observed_generation) == ("Syncing", 1)
    assert (status.objects, status.total_bytes, status.manifest_digest) == (3, 1536, DIGEST)
    assert ready(m.model_copy(update={"status": status})) == ("False", "Syncing", "listing s3://bucket/prefix", T1, 2)
    assert m.status is not None
    assert m.status.phase == "Ready"  # the input is not changed


def test_syncing_again_keeps_the_transition_time() -> None:
    m = mount(status={"phase": "Failed", "conditions": [ready_condition("False", "AccessDenied", "denied")]})
    assert ready(m.model_copy(update={"status": syncing(m, T1)}))[3] == T0


def test_a_retry_of_the_same_generation_keeps_the_reason_it_is_retried() -> None:
    """No flapping between Syncing and the transient error, two writes per retry."""
    retrying = {"phase": "Syncing", "conditions": [ready_condition("False", "CredentialsMissing", "no Secret", T0, 2)]}
    m = mount(generation=2, status=retrying)
    assert ready(m.model_copy(update={"status": syncing(m, T1)})) == ("False", "CredentialsMissing", "no Secret", T0, 2)
    edited = mount(generation=3, status=retrying)  # a new spec is listed anew: Syncing says so
    assert ready(edited.model_copy(update={"status": syncing(edited, T1)}))[:3] == (
        "False",
        "Syncing",
        "listing s3://bucket/prefix",
    )


# --- human_bytes -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (1, "1 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (1536, "1.5 KiB"),
        (1024**2, "1.0 MiB"),
        (int(2.25 * 1024**3), "2.2 GiB"),
        (1024**4, "1.0 TiB"),
        (3 * 1024**5, "3072.0 TiB"),  # nothing above TiB
    ],
)
def test_human_bytes(n: int, text: str) -> None:
    assert human_bytes(n) == text


# --- plan_mount: success ---------------------------------------------------------------------------


def test_first_listing_makes_an_input_mount_ready() -> None:
    m = mount(generation=3, status=syncing(mount(generation=3), T0).model_dump(by_alias=True, mode="json"))
    planned, events, retry = after(m, LISTED)
    status = planned.status
    assert status is not None
    assert (status.phase, status.observed_generation, status.last_sync_time) == ("Ready", 3, T1)
    assert (status.objects, status.total_bytes, status.manifest_digest) == (3, 1536, DIGEST)
    message = "3 objects, 1.5 KiB at s3://bucket/prefix"
    assert ready(planned) == ("True", "Listed", message, T1, 3)
    assert events == [("Normal", "Ready", message)]
    assert retry is False


def test_an_empty_prefix_is_ready_with_a_hint() -> None:
    planned, events, _ = after(mount(), Listed(objects=0, total_bytes=0, digest=DIGEST))
    message = "0 objects, 0 B at s3://bucket/prefix (the prefix is empty: check spec.source, include and exclude)"
    assert ready(planned)[:3] == ("True", "Listed", message)
    assert events == [("Normal", "Ready", message)]


def test_an_output_mount_is_ready_when_writable_and_carries_no_listing() -> None:
    """An In mount turned Out: the old listing goes, and the changed digest (to none) is news."""
    m = mount({"spec.direction": "Out", "spec.source": "s3://bucket/out"}, status=READY_STATUS, generation=2)
    planned, events, _ = after(m, Listed())
    status = planned.status
    assert status is not None
    assert (status.phase, status.observed_generation) == ("Ready", 2)
    assert (status.objects, status.total_bytes, status.manifest_digest) == (None, None, None)
    assert ready(planned) == ("True", "Writable", "s3://bucket/out is writable", T0, 2)  # still True: time kept
    assert events == [("Normal", "Ready", "s3://bucket/out is writable")]
    # Checked again: Ready before and after, no digest either way, so nothing to say.
    _, events, _ = after(planned, Listed(), T1 + timedelta(minutes=1))
    assert events == []


@pytest.mark.parametrize(
    ("before", "listed", "events"),
    [
        (None, LISTED, 1),
        ({"phase": "Syncing"}, LISTED, 1),
        (FAILED_STATUS, LISTED, 1),
        (READY_STATUS, LISTED, 0),  # the same data listed again: nothing new to say
        (READY_STATUS, Listed(objects=4, total_bytes=2048, digest=OTHER_DIGEST), 1),  # the data changed
        (READY_STATUS, Listed(objects=4, total_bytes=2048, digest=DIGEST), 0),
    ],
)
def test_ready_events_only_on_transition_or_new_digest(
    before: dict[str, Any] | None, listed: Listed, events: int
) -> None:
    planned, found, _ = after(mount(status=before), listed)
    assert planned.status is not None
    assert planned.status.phase == "Ready"
    assert [(t, r) for t, r, _ in found] == [("Normal", "Ready")] * events


def test_ready_again_keeps_the_transition_time() -> None:
    planned, _, _ = after(mount(generation=2, status=READY_STATUS), Listed(objects=4, total_bytes=10, digest=DIGEST))
    assert ready(planned) == ("True", "Listed", "4 objects, 10 B at s3://bucket/prefix", T0, 2)


# --- plan_mount: errors ----------------------------------------------------------------------------


def test_a_permanent_error_fails_the_mount_once() -> None:
    m = mount(generation=2, status=READY_STATUS)
    planned, events, retry = after(m, DENIED)
    status = planned.status
    assert status is not None
    assert (status.phase, status.observed_generation) == ("Failed", 2)
    assert (status.objects, status.total_bytes, status.manifest_digest) == (None, None, None)
    assert ready(planned) == ("False", "AccessDenied", DENIED.message, T1, 2)
    assert events == [("Warning", "AccessDenied", DENIED.message)]
    assert retry is False
    # Listed again (say after an operator restart) with the same outcome: no second Warning.
    again, events, _ = after(planned, DENIED, T1 + timedelta(minutes=1))
    assert events == []
    assert ready(again)[3] == T1


def test_a_different_permanent_error_is_announced_again() -> None:
    m = mount(generation=2, status=READY_STATUS)
    failed, events, _ = after(m, DENIED)
    assert [reason for _, reason, _ in events] == ["AccessDenied"]
    missing = Listed(
        error="BucketNotFound", message="bucket 'b' does not exist (s3://b/p): create it or fix spec.source"
    )
    again, events, _ = after(failed, missing, T1 + timedelta(minutes=1))
    assert events == [("Warning", "BucketNotFound", missing.message)]
    assert ready(again)[:3] == ("False", "BucketNotFound", missing.message)


def test_a_transient_error_keeps_syncing_and_retries_without_events() -> None:
    m = mount(generation=2, status=READY_STATUS)
    planned, events, retry = after(m, UNREACHABLE)
    status = planned.status
    assert status is not None
    assert (status.phase, status.observed_generation) == ("Syncing", 1)  # describes no new spec yet
    assert ready(planned) == ("False", "Unreachable", "s3://bucket/prefix did not answer (retrying)", T1, 2)
    assert (events, retry) == ([], True)
    assert mount_state(planned) == ("Syncing", "s3://bucket/prefix did not answer (retrying)", None)


def test_a_missing_secret_is_retried_then_the_mount_becomes_ready() -> None:
    missing = Listed(error="CredentialsMissing", message="Secret ml/s3 not found", transient=True)
    m = mount()
    m, events, retry = after(m, missing, T0)
    assert (m.status.phase if m.status else None, events, retry) == ("Syncing", [], True)
    m, events, retry = after(m, LISTED, T1)
    assert m.status is not None
    assert (m.status.phase, retry) == ("Ready", False)
    assert [(t, r) for t, r, _ in events] == [("Normal", "Ready")]
    assert ready(m)[3] == T1


def test_plan_mount_does_not_change_its_input() -> None:
    m = mount(status=READY_STATUS)
    before = m.model_dump()
    for listed in (LISTED, DENIED, UNREACHABLE):
        plan_mount(m, listed, T1)
    assert m.model_dump() == before


# --- users -------------------------------------------------------------------------------------------


def job(name: str, mounts: list[str] | None, phase: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"metadata": {"name": name}, "spec": {}}
    if mounts is not None:
        body["spec"]["dataMounts"] = [{"name": m, "mountPath": f"/{m}"} for m in mounts]
    if phase is not None:
        body["status"] = {"phase": phase}
    return body


def test_users_are_the_unfinished_jobs_that_reference_the_mount() -> None:
    jobs = [
        job("zeta", ["data"], "Running"),
        job("alpha", ["other", "data"]),  # no status yet: just created
        job("done", ["data"], "Succeeded"),
        job("broken", ["data"], "Failed"),
        job("waiting", ["data"], "WaitingForData"),
        job("suspended", ["data"], "Suspended"),
        job("unrelated", ["other"], "Running"),
        job("plain", None, "Running"),
        {"metadata": {"name": "bare"}},
    ]
    assert users("data", jobs) == ["alpha", "suspended", "waiting", "zeta"]
    assert users("other", jobs) == ["alpha", "unrelated"]
    assert users("nothing", jobs) == []


# --- mount_state -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "generation", "expected"),
    [
        (None, 1, ("Pending", "", None)),
        ({}, 1, ("Pending", "", None)),
        (
            {"phase": "Syncing", "conditions": [ready_condition("False", "Syncing", "listing s3://bucket/prefix")]},
            1,
            ("Syncing", "listing s3://bucket/prefix", None),
        ),
        (READY_STATUS, 1, ("Ready", "3 objects, 1.5 KiB at s3://bucket/prefix", DIGEST)),
        ({"phase": "Ready", "observedGeneration": 1}, 1, ("Ready", "", None)),  # no condition, no digest
        (READY_STATUS, 2, ("Syncing", "the spec changed; listing again", None)),
        (FAILED_STATUS, 1, ("Failed", "bucket 'bucket' does not exist", None)),
        # A Failed status about an older spec (the user just fixed it) is not the new spec's verdict: a
        # job that sees it before the operator lists again must wait, not fail with DataMountFailed.
        (FAILED_STATUS, 2, ("Syncing", "the spec changed; listing again", None)),
    ],
)
def test_mount_state(status: dict[str, Any] | None, generation: int, expected: tuple[str, str, str | None]) -> None:
    assert mount_state(mount(generation=generation, status=status)) == expected


def test_mount_state_of_an_output_mount_has_no_digest() -> None:
    m, _, _ = after(mount({"spec.direction": "Out"}), Listed())
    assert mount_state(m) == ("Ready", "s3://bucket/prefix is writable", None)


def test_mount_state_follows_a_fix_through_the_lifecycle() -> None:
    """Failed, the spec edited, listed again: the job reads Syncing until the new listing is Ready."""
    failed, _, _ = after(mount(generation=1), DENIED, T0)
    assert mount_state(failed)[0] == "Failed"
    edited = mount(
        {"spec.source": "s3://bucket/fixed"},
        generation=2,
        status=failed.status.model_dump(by_alias=True, mode="json") if failed.status else None,
    )
    assert mount_state(edited) == ("Syncing", "the spec changed; listing again", None)
    assert needs_listing(edited) is True
    listing = edited.model_copy(update={"status": syncing(edited, T1)})
    assert mount_state(listing) == ("Syncing", "listing s3://bucket/fixed", None)
    done, events, _ = after(edited, LISTED, T1)
    assert mount_state(done) == ("Ready", "3 objects, 1.5 KiB at s3://bucket/fixed", DIGEST)
    assert [(t, r) for t, r, _ in events] == [("Normal", "Ready")]


def test_parse_mount_reads_a_broken_status_as_none_and_reports_a_broken_spec() -> None:
    """A stored mount the model refuses: its status (only the operator writes it) is dropped; a spec
    from an older, looser CRD is one printable line naming the field, never an exception."""
    for status in ("x", {"phase": 5}, {"conditions": "none"}):
        mount, why = parse_mount({**BASE_MOUNT, "status": status})
        assert mount is not None
        assert mount.status is None
        assert why == ""
    mount, why = parse_mount(with_changes(BASE_MOUNT, {"spec.cache": {"type": "pvc", "size": "-1Gi"}}))
    assert mount is None
    assert why.startswith("its stored spec no longer parses (spec.cache.size")
