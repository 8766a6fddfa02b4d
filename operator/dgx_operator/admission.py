"""The validating webhook's logic: the same checks as `kubedgx validate`, plus the ones that need
the cluster (referenced DGXDataMounts) or the previous object (immutable fields of a running job)."""

from __future__ import annotations

from typing import Any

import kopf

from dgx_operator.api import DGXDataMount, DGXTrainingJob
from dgx_operator.validation import Validator, immutable_changes, reference_problems


async def review(memo: kopf.Memo, body: dict[str, Any], old: dict[str, Any] | None, operation: str | None) -> None:
    """Raise kopf.AdmissionError (HTTP 422) listing every problem, one per line."""
    if operation == "DELETE":
        return
    if (
        operation == "UPDATE"
        and old is not None
        and (old.get("spec") == body.get("spec") or (body.get("metadata") or {}).get("deletionTimestamp"))
    ):
        # Metadata-only writes (the operator's own finalizer removal, labels) and writes to a
        # deleting object are never refused: a spec that became invalid later (the catalog
        # dropped its instance, a mount changed) must not pin the job forever.
        return
    # Shared by every request: created at startup (handlers.startup); built here only for callers
    # without one, such as tests.
    validator: Validator = memo.get("validator") or Validator(memo.config.catalog())
    outcome = validator.validate(body, old=old if operation == "UPDATE" else None)
    problems = list(outcome.problems)
    if outcome.ok and body.get("kind") == "DGXTrainingJob":
        if operation == "UPDATE" and old is not None:
            problems += immutable_changes(old, body)
        job = DGXTrainingJob.model_validate(body)
        namespace = job.metadata.namespace or "default"
        found: list[tuple[dict[str, Any], int]] = [(body, 0)]
        for ref in job.spec.data_mounts:
            mount = await memo.kube.get_mount(namespace, ref.name) if "kube" in memo else None
            if mount is not None:
                DGXDataMount.model_validate(mount)
                found.append((mount, 1))
        problems += [p for key, p in reference_problems(validator.catalog, found) if key == 0]
    if problems:
        raise kopf.AdmissionError("\n".join(str(p) for p in problems), code=422)
