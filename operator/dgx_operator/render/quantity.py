"""Kubernetes resource quantities compared by value ("500m" < "1" < "1.5"; "4Gi" > "4G"), for
the builders that fit one container's resources within another's. Pure: no client library, whose
parser would pull the Kubernetes client into the builders."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_SUFFIXES: dict[str, Decimal] = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)$")


def value(quantity: str | int) -> Decimal:
    """The quantity's value in base units (cores, bytes). Raises ValueError for what Kubernetes
    would refuse (the CRD's pattern refuses it first)."""
    text = str(quantity).strip()
    match = _QUANTITY.match(text)
    if match is None:
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    number, exponent, suffix = match.groups()
    try:
        base = Decimal(number)
        if exponent:
            return base * Decimal(f"1{exponent}")
    except InvalidOperation as exc:  # pragma: no cover - the pattern admits only numbers
        raise ValueError(f"not a Kubernetes quantity: {text!r}") from exc
    return base * _SUFFIXES[suffix or ""]


def smaller(a: str | int, b: str | int) -> str:
    """The smaller of two quantities, as written (``a`` where they are equal)."""
    return str(b) if value(b) < value(a) else str(a)
