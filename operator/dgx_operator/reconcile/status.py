"""Status writing shared by the two planners and their controllers: conditions that keep their
transition time, and the merge patch that carries a planned status to the stored one.

Both are pure and kind-agnostic, so the job planner, the mount planner, the controllers and the
metrics use this one copy (each kept its own before).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

from dgx_operator.api.common import Condition


def set_condition(
    conditions: list[Condition], type_: str, status: bool, reason: str, message: str, now: datetime, generation: int
) -> list[Condition]:
    """Replace the condition of ``type_``; lastTransitionTime moves only when its status flips."""
    value: Literal["True", "False"] = "True" if status else "False"
    old = next((c for c in conditions if c.type == type_), None)
    since = old.last_transition_time if old is not None and old.status == value else now
    new = Condition(
        type=type_,
        status=value,
        reason=reason,
        message=message,
        last_transition_time=since,
        observed_generation=generation,
    )
    return [*(c for c in conditions if c.type != type_), new]


def find_condition(conditions: Sequence[Condition], type_: str) -> Condition | None:
    """The condition of ``type_``, if the status has one."""
    return next((c for c in conditions if c.type == type_), None)


def merge_patch(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """The RFC 7386 merge patch that turns ``before`` into ``after``: changed keys, nested objects
    diffed recursively, removed keys as null (lists are replaced whole, as merge patches do)."""
    patch: dict[str, Any] = {}
    for key, value in after.items():
        old = before.get(key)
        if isinstance(value, Mapping) and isinstance(old, Mapping):
            nested = merge_patch(old, value)
            if nested:
                patch[key] = nested
        elif key not in before or old != value:
            patch[key] = value
    for key in before:
        if key not in after:
            patch[key] = None
    return patch
