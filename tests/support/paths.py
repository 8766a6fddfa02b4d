"""Test ids to the folder a test lives in (tests/unit, tests/cluster...), for the per-folder report
and the scheduling order."""

from __future__ import annotations


def folder_of(nodeid: str) -> str:
    """``tests/unit/test_x.py::test_y[a/b]`` -> ``tests/unit``; a test file right under tests/ -> ``tests``."""
    path = nodeid.split("::", 1)[0]
    parts = path.split("/")
    return "/".join(parts[:2]) if len(parts) > 2 else "/".join(parts[:-1]) or "."
