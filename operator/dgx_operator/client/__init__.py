"""kubedgx for notebooks and pipelines: the verbs of the CLI as a Python client.

``Client`` submits, lists, follows, waits for, cancels and fetches DGXTrainingJobs with the user's
kubeconfig; its errors are :class:`ClientError`s, a failed job's a :class:`JobFailedError` carrying
the job's reason and message. Needs nothing of the operator's daemon (the import contract "the
user's client needs nothing of the daemon").
"""

from dgx_operator.client.errors import (
    ClientError,
    JobFailedError,
    JobNotFoundError,
    NothingToFetchError,
    SubmitError,
    WaitTimeoutError,
)
from dgx_operator.client.jobs import Client, Event, LogLine, MountState, Submitted, Worker

__all__ = [
    "Client",
    "ClientError",
    "Event",
    "JobFailedError",
    "JobNotFoundError",
    "LogLine",
    "MountState",
    "NothingToFetchError",
    "SubmitError",
    "Submitted",
    "WaitTimeoutError",
    "Worker",
]
