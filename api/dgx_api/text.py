"""Text that is safe to print on one line of a terminal, a log or a Kubernetes condition.

Names, keys and values in messages come from whoever wrote the manifest (or planted a file in a
directory the data plane reads). Printed raw, a newline forges a second message line, an ANSI
escape recolours or erases the terminal, and a bidi override (U+202E) makes ``evil.yaml`` read as
something else. :func:`printable` escapes all of them the way Python's ``repr`` would, and leaves
every other character, including non-ASCII letters, as it is.
"""

from __future__ import annotations

import re
from typing import Final

#: C0, DEL and C1 controls; the bidi marks, embeddings, overrides and isolates; zero-width
#: characters, the line/paragraph separators and the BOM; lone surrogates. All of them change
#: how the rest of a line is displayed, or are invisible.
_UNSAFE: Final = re.compile(
    r"[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060\u2066-\u2069\ufeff\ud800-\udfff]"
)


def _escape(char: str) -> str:
    code = ord(char)
    if char == "\n":
        return "\\n"
    if char == "\r":
        return "\\r"
    if char == "\t":
        return "\\t"
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` with control characters (C0, DEL, C1), bidi controls, zero-width characters and
    lone surrogates written as ``\\xNN`` / ``\\uNNNN`` escapes; everything else unchanged."""
    if not _UNSAFE.search(text):
        return text
    return _UNSAFE.sub(lambda m: _escape(m.group()), text)


def is_printable(text: str) -> bool:
    """Whether :func:`printable` would leave ``text`` unchanged."""
    return _UNSAFE.search(text) is None
