"""One poll-until for every test folder: ``wait_until`` (threads and processes) and
``wait_until_async`` (inside an event loop).

The wait ends on the condition or on the timeout; ``interval`` only paces the polling and is never
the thing a test waits for. On timeout the error names what was awaited, the last value the probe
gave (or the exception it raised, where ``retry_on`` lets the wait look again) and, when given,
``diagnose()``'s account of the system under test.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeoutError(AssertionError):
    """A wait ran out of time. An AssertionError, so pytest reports it as the test's failure."""


def _message(what: str, timeout: float, last: object, diagnose: Callable[[], str] | None) -> str:
    detail = f"\n\n{diagnose()}" if diagnose is not None else ""
    return f"timed out after {timeout:g}s waiting for {what} (last: {last!r}){detail}"


def wait_until(
    probe: Callable[[], T | None],
    *,
    timeout: float,
    what: str = "the condition",
    interval: float = 0.05,
    retry_on: tuple[type[BaseException], ...] = (),
    diagnose: Callable[[], str] | None = None,
    error: type[Exception] = WaitTimeoutError,
) -> T:
    """Poll ``probe`` until it returns something other than None/False (or another falsy value);
    that value is the result. ``retry_on``: exceptions that mean "not yet" (a connection refused by
    a server still starting), anything else propagates at once. ``error``: the exception class
    raised on timeout (the control plane's StartError, say)."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = probe()
        except retry_on as exc:
            value, last = None, exc
        else:
            last = value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise error(_message(what, timeout, last, diagnose))
        time.sleep(interval)


async def wait_until_async(
    probe: Callable[[], T | Awaitable[T | None] | None],
    *,
    timeout: float,
    what: str = "the condition",
    interval: float = 0.05,
    retry_on: tuple[type[BaseException], ...] = (),
    diagnose: Callable[[], str] | None = None,
    error: type[Exception] = WaitTimeoutError,
) -> T:
    """``wait_until`` for a test inside an event loop: ``probe`` may be a plain function or a
    coroutine function, and the loop keeps running between looks."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = probe()
            if asyncio.iscoroutine(value) or isinstance(value, asyncio.Future):
                value = await value
        except retry_on as exc:
            value, last = None, exc
        else:
            last = value
        if value:
            return value  # type: ignore[return-value]
        if time.monotonic() >= deadline:
            raise error(_message(what, timeout, last, diagnose))
        await asyncio.sleep(interval)
