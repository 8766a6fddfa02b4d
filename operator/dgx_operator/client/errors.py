"""What the user's client raises: one base class a notebook can catch, and the job's own words.

Every error carries a message meant for a person (what happened and, where there is one, the fix);
a failed job's error carries the job's reason and message as the operator wrote them, so a pipeline
can branch on ``exc.reason`` (``OutOfMemory``, ``BudgetExceeded``, ...) instead of parsing text.
"""

from __future__ import annotations

from typing import Any


class ClientError(Exception):
    """Anything the client cannot do: the message says what and how to fix it."""


class JobNotFoundError(ClientError):
    """The job does not exist (never created, or deleted)."""


class JobFailedError(ClientError):
    """The job ended without succeeding. ``reason`` and ``message`` are the job's ``Failed``
    condition's (docs/operator.md lists the reasons); ``job`` is the job as last read."""

    def __init__(self, name: str, reason: str, message: str, job: Any = None) -> None:
        super().__init__(f"{name} failed: {reason}: {message}" if message else f"{name} failed: {reason}")
        self.name = name
        self.reason = reason
        self.message = message
        self.job = job


class WaitTimeoutError(ClientError, TimeoutError):
    """``wait`` gave up before the job ended; the job goes on."""


class SubmitError(ClientError):
    """The cluster refused a manifest (the webhook's or the API server's message, naming the field)."""


class NothingToFetchError(ClientError):
    """The job has no artifact (or none of that name), or its history is nowhere to be read."""
