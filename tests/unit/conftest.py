"""Fixtures of the planner's unit tests (tests/unit/planner_sim.py, planner_table.py)."""

from __future__ import annotations

import pytest

from dgx_operator.catalog import Catalog
from dgx_operator.render import BuildContext
from tests.unit.planner_sim import PHASE_CONDITION, make_ctx
from tests.unit.planner_table import State, reach


@pytest.fixture
def ctx(catalog: Catalog) -> BuildContext:
    """The build context of the planner's jobs: the catalog, and the mounts ``data`` and ``out``."""
    return make_ctx(catalog)


@pytest.fixture(scope="module")
def states(catalog: Catalog) -> dict[str, State]:
    """The decision table's job brought into each phase by the planner itself."""
    ctx = make_ctx(catalog)
    return {phase: reach(ctx, phase) for phase in PHASE_CONDITION}
