"""One log line per event on stderr, as text or JSON, with structured fields.

Library code calls :func:`event`; the CLI installs the formatter. Nothing is logged before the
store has answered once, so that a command failing on credentials or a bucket prints exactly one
line (``datasync: <message>``) and nothing else.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, Final, TextIO

from dgx_api.text import is_printable, printable

LOGGER: Final = logging.getLogger("dgx_datasync")


def event(level: int, message: str, **fields: Any) -> None:
    LOGGER.log(level, message, extra={"fields": fields})


class LineFormatter(logging.Formatter):
    """``<time> <LEVEL> <message> key=value ...`` or one JSON object; never more than one line, and
    nothing unprintable (names in messages come from buckets and file systems)."""

    def __init__(self, json_format: bool) -> None:
        super().__init__()
        self.json_format = json_format

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = dict(getattr(record, "fields", None) or {})
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.created))
        message = printable(" ".join(record.getMessage().split()))
        if record.exc_info and record.exc_info[1] is not None:
            fields.setdefault("error", " ".join(str(record.exc_info[1]).split()))
        if self.json_format:
            payload = {"time": stamp, "level": record.levelname.lower(), "logger": record.name, "msg": message}
            return json.dumps({**payload, **fields}, default=str, separators=(",", ":"))
        extra = " ".join(f"{k}={_text(v)}" for k, v in fields.items())
        return f"{stamp} {record.levelname} {message}" + (f" {extra}" if extra else "")


def _text(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str, separators=(",", ":"))
    return json.dumps(text) if not is_printable(text) or any(c.isspace() for c in text) else text


def configure(log_format: str, stream: TextIO | None = None) -> None:
    """Our events at INFO, everybody else's (botocore, s3fs, ...) at WARNING, all one line each."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(LineFormatter(log_format == "json"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    LOGGER.setLevel(logging.INFO)
    logging.captureWarnings(True)
