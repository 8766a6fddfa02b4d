"""Property: whatever the mutated example, `kubedgx validate` and `kubedgx render` exit 0, 1 or 2 with
one printable line per problem and no traceback, and the Validator (the webhook's core) never raises
on the mutated objects.

Derandomised, so CI runs the same inputs every time; benchmarks/hostile_inputs.py draws fresh ones
by the thousand and counts them (docs/benchmarks.md)."""

from __future__ import annotations

import functools
import tempfile
import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings

from dgx_api.manifests import ManifestError, load_documents
from dgx_operator.catalog import Catalog
from dgx_operator.validation.validator import Validator, immutable_changes
from tests.hostile_inputs import check, object_mutation, problems_with, text_mutation

#: Seconds of CPU per input, both commands: the slowest seen are ~0.3 s. CPU, not hypothesis' wall-clock
#: deadline: that one failed a cold CI run at 3.09 s while go compiled on both cores.
CPU_BOUND = 3.0

PROPERTY = settings(
    max_examples=120,
    deadline=None,  # the bound is CPU_BOUND, checked in _check
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _check(content: str | bytes) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "input.yaml"
        seen = check(content, path)
        assert not problems_with(seen, path), (problems_with(seen, path), seen)
        assert seen.cpu_seconds < CPU_BOUND, seen


@PROPERTY
@given(object_mutation())
def test_mutated_objects_get_clean_answers(content: str) -> None:
    _check(content)


@PROPERTY
@given(text_mutation())
def test_mutated_text_gets_clean_answers(content: bytes) -> None:
    _check(content)


@settings(max_examples=80, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip
@given(object_mutation(), object_mutation())
def test_validator_never_raises_on_updates(new: str, old: str) -> None:
    """The webhook's core on an UPDATE (object and old object, each mutated, as JSON-shaped values
    the apiserver could send): an Outcome and a list of immutable-field problems, never an exception."""
    started = time.thread_time()
    try:
        new_docs, old_docs = load_documents(new), load_documents(old)
    except ManifestError:
        return  # the loader refused it: the CLI says so in one line (tested above)
    validator = Validator(_catalog())
    for obj, previous in zip(new_docs, old_docs, strict=False):
        outcome = validator.validate(obj, old=previous)
        assert all("\n" not in str(p) for p in outcome.problems)
        if isinstance(obj, dict) and isinstance(previous, dict):
            immutable_changes(previous, obj)
    assert time.thread_time() - started < CPU_BOUND


@functools.cache
def _catalog() -> Catalog:
    return Catalog.load()
