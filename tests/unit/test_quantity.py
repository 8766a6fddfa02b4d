"""dgx_operator.render.quantity: Kubernetes quantities compared by value, as the apiserver's
resource.Quantity would (the builders fit init containers within the trainer's share)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from dgx_operator.render.quantity import smaller, value


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", Decimal(0)),
        ("2", Decimal(2)),
        (2, Decimal(2)),
        ("500m", Decimal("0.5")),
        ("1.5", Decimal("1.5")),
        ("1Ki", Decimal(1024)),
        ("4Gi", Decimal(4 * 2**30)),
        ("4G", Decimal(4 * 10**9)),
        ("1e3", Decimal(1000)),
        ("1.5E-3", Decimal("0.0015")),
        ("100u", Decimal("0.0001")),
        ("1Ti", Decimal(2**40)),
        (".5", Decimal("0.5")),
    ],
)
def test_value(text: str | int, expected: Decimal) -> None:
    assert value(text) == expected


@pytest.mark.parametrize("text", ["", "Gi", "4 Gi", "4gi", "4GiB", "1,5", "abc", "4i"])
def test_value_refuses_what_kubernetes_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        value(text)


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [("4", "2", "2"), ("2", "4", "2"), ("4", "4000m", "4"), ("4Gi", "4G", "4G"), ("1Gi", "1024Mi", "1Gi")],
)
def test_smaller(a: str, b: str, expected: str) -> None:
    assert smaller(a, b) == expected
