"""The integration fixtures (an in-memory API server, the real operator run against it) and the session's S3
server, for the Argo CD health checks evaluated against what the operator really writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.conftest import api_client, emulator, http, kubeconfig, run_operator  # noqa: F401
from tests.s3 import s3  # noqa: F401

TEST_TIMEOUT_S = 60


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The integration tests' 60 s ceiling per test, here too."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.path).parents and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(TEST_TIMEOUT_S))
