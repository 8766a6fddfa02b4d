"""A build that belongs to no test, run outside the test's timeout.

pytest-timeout (its default ``signal`` method on Linux) times a test with ``ITIMER_REAL`` and
SIGALRM. A fixture that builds a Go binary on first use (fake-gcs-server, promlint) can take
minutes on a cold, loaded machine, longer than any test's own ceiling; and under pytest-xdist, or
with .ci/run's background builds, it may first wait on the build's lock. ``timeout_paused()`` stops
the timer while the build runs and gives the test back what it had left after.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def timeout_paused() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return
    remaining, interval = signal.getitimer(signal.ITIMER_REAL)
    signal.setitimer(signal.ITIMER_REAL, 0)
    try:
        yield
    finally:
        if remaining > 0:
            signal.setitimer(signal.ITIMER_REAL, remaining, interval)
