"""The controller's pure helpers: status merge patches and expectations."""

from __future__ import annotations

from typing import Any

import pytest

from dgx_operator.api.trainingjob import DGXTrainingJobStatus
from dgx_operator.controllers.job import EXPECTATION_TTL, Expectations, status_patch
from dgx_operator.reconcile.status import merge_patch


def apply(doc: Any, patch: Any) -> Any:
    """RFC 7386 application, to check that a computed patch really produces the target."""
    if not isinstance(patch, dict):
        return patch
    out = dict(doc) if isinstance(doc, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = apply(out.get(key), value)
    return out


CASES = [
    ({}, {"phase": "Pending"}),
    ({"phase": "Pending", "startTime": "t"}, {"phase": "Suspended"}),
    ({"progress": {"step": 1, "precision": "bf16"}}, {"progress": {"step": 2}}),
    ({"conditions": [{"type": "A"}, {"type": "B"}]}, {"conditions": [{"type": "A"}]}),
    (
        {"workers": {"desired": 2, "active": 2}, "nodes": "2/2"},
        {"workers": {"desired": 2, "active": 1}, "nodes": "1/2"},
    ),
]


@pytest.mark.parametrize(("before", "after"), CASES)
def test_merge_patch_turns_before_into_after(before: dict[str, Any], after: dict[str, Any]) -> None:
    assert apply(before, merge_patch(before, after)) == after


def test_nested_fields_that_disappear_become_null() -> None:
    patch = merge_patch({"progress": {"step": 1, "precision": "bf16"}}, {"progress": {"step": 2}})
    assert patch == {"progress": {"step": 2, "precision": None}}


def test_an_unchanged_status_needs_no_write() -> None:
    status = DGXTrainingJobStatus.model_validate({"phase": "Running", "restarts": 1, "progress": {"step": 3}})
    assert status_patch(status, status.model_copy(deep=True)) is None
    changed = status.model_copy(update={"restarts": 2})
    assert status_patch(status, changed) == {"restarts": 2}


def test_expectations_settle_when_the_cache_catches_up() -> None:
    exp = Expectations()
    exp.created["Pod/job-worker-0"] = (100.0, {"kind": "Pod"})
    exp.created["Pod/job-worker-1"] = (100.0, {"kind": "Pod"})
    exp.deleted["Pod/job-worker-2"] = 100.0
    exp.settle({"Pod/job-worker-0", "Pod/job-worker-2"}, now=101.0)
    assert set(exp.created) == {"Pod/job-worker-1"}  # worker 0 is in the cache now
    assert set(exp.deleted) == {"Pod/job-worker-2"}  # still in the cache: still being deleted
    exp.settle({"Pod/job-worker-0"}, now=101.0)
    assert exp.deleted == {}
    exp.settle(set(), now=100.0 + EXPECTATION_TTL + 1)
    assert exp.created == {}  # a lost watch event never pins a phantom worker forever
