"""What the gs:// data-sync tests read off fake-gcs-server's request log and objects: the resumable
upload a request belongs to, GCS's md5Hash of some bytes (test_watch.py, test_push.py)."""

from __future__ import annotations

import base64
import hashlib
from urllib.parse import parse_qs

from tests.gcs import Hit


def upload_session(hit: Hit) -> str | None:
    """The resumable upload a gs request belongs to (its ``upload_id``), else None."""
    found = parse_qs(hit.query).get("upload_id")
    return found[0] if found else None


def gs_md5(data: bytes) -> str:
    """GCS's md5Hash of ``data``: the base64 of the digest."""
    return base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode("ascii")
