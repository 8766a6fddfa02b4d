"""Object storage (s3://, gs://) <-> node-local directories for DGXDataMounts.

The operator imports the listing side (:func:`list_source`, :func:`check_writable`, the types);
the sync containers run ``python -m dgx_datasync`` (pull, push, watch, restore, list);
the checkpoint uploader is :class:`dgx_datasync.watch.Watcher`.
It is kubedgx's data plane, a layer of its own beside the contract (:mod:`dgx_api`) it stands on:
both images install it, so it imports no torch (the operator image has none) and no kopf or cluster
client (the trainer image has none); import-linter contracts in pyproject.toml keep it so.
docs/datasync.md describes the commands, the local and remote layouts and the resume rules.
"""

from dgx_datasync.errors import REASONS, SyncError
from dgx_datasync.store import (
    Listing,
    Location,
    ObjectInfo,
    StoreOptions,
    check_writable,
    list_source,
    listing_digest,
    parse_uri,
)
from dgx_datasync.sync import pull, push, restore

__version__ = "0.1.0"

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
