"""Object storage (s3://, gs://) <-> node-local directories for DGXDataMounts.

The operator imports the listing side (:func:`list_source`, :func:`check_writable`, the types);
the sync containers run ``python -m dgx_trainer.datasync`` (pull, push, watch, restore, list);
the checkpoint uploader is :class:`dgx_trainer.datasync.watch.Watcher`.
No torch anywhere in here: the operator image does not have it (an import-linter contract).
docs/datasync.md describes the commands, the local and remote layouts and the resume rules.
"""

from dgx_trainer.datasync.errors import REASONS, SyncError
from dgx_trainer.datasync.store import (
    Listing,
    Location,
    ObjectInfo,
    StoreOptions,
    check_writable,
    list_source,
    listing_digest,
    parse_uri,
)
from dgx_trainer.datasync.sync import pull, push, restore

__all__ = [
    "REASONS",
    "Listing",
    "Location",
    "ObjectInfo",
    "StoreOptions",
    "SyncError",
    "check_writable",
    "list_source",
    "listing_digest",
    "parse_uri",
    "pull",
    "push",
    "restore",
]
