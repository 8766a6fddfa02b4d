"""Stored objects the models may refuse, read without raising.

The API server validated an object when it was written, but against the CRD of that day: after an
upgrade whose schema is stricter (quantities became non-negative in issue 12), or with a status
someone wrote by hand, the model may refuse it. Raising there made every reconcile of the object
(and, for a mount, of each job using it) fail again and again, with a traceback in the log and no
word in the object. Instead: a status that does not parse is read as no status (the operator writes
a new one), and a spec that does not parse is one printable line naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from dgx_api.schema import join_path
from dgx_api.text import printable

M = TypeVar("M", bound=BaseModel)


def parse_stored(model: type[M], body: Mapping[str, Any]) -> tuple[M | None, str]:
    """``body`` as ``model``, or ``None`` and why not (one printable line with the fix)."""
    try:
        return model.model_validate(body), ""
    except ValidationError:
        pass
    try:
        return model.model_validate({k: v for k, v in body.items() if k != "status"}), ""
    except ValidationError as exc:
        err = exc.errors()[0]
        path = ""
        for part in err["loc"]:
            path = join_path(path, part)
        kind = body.get("kind") or model.__name__
        return None, printable(
            f"its stored spec no longer parses ({path}: {err['msg']}): re-apply the {kind} with a valid spec"
        )
