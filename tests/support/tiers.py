"""The ``slow`` tier: modules left out of the inner loop (docs/testing.md), run by CI and the full
command like every other.

Each runs a real program end to end in subprocesses, or runs long on purpose, and took a minute or
more of a worker's time in a full run (tests/support/durations.json): torchrun and the trainer's
command line on tiny models, pyflyte-execute as two pods, pip building the five wheels, import-linter
on copies of the tree, hypothesis' generated inputs through the command lines, and the data plane's
pulls against both stores. What they check has faster, in-process counterparts in the inner loop
(the trainer's model, data and progress tests, the planner and the CLI's unit tests, the other
datasync modules); what only they check is the whole program as its container runs it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

SLOW = frozenset(
    {
        "tests/trainer/test_local.py",
        "tests/trainer/test_launch.py",
        "tests/trainer/test_multinode_resume.py",
        "tests/trainer/test_config_errors.py",
        "tests/trainer/test_divergence.py",
        "tests/trainer/test_yaml_numbers.py",
        "tests/trainer/test_data.py",
        "tests/trainer/test_resume.py",
        "tests/trainer/test_sigterm.py",
        "tests/trainer/test_torchrun.py",
        "tests/trainer/test_tracking.py",
        "tests/flyte/test_in_pod.py",
        "tests/datasync/test_pull.py",
        "tests/unit/test_import_contract.py",
        "tests/unit/test_generated_input.py",
        "tests/images/test_distributions.py",
    }
)


def mark_slow(items: list[pytest.Item], root: Path) -> None:
    for item in items:
        try:
            module = Path(str(item.fspath)).resolve().relative_to(root).as_posix()
        except ValueError:
            continue
        if module in SLOW:
            item.add_marker(pytest.mark.slow)
