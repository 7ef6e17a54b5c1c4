"""Kubernetes quantities as the job spec and quotas take them."""

from __future__ import annotations

from decimal import Decimal

import pytest

from paddlecloud.common.quantity import (
    QuantityError,
    format_bytes,
    format_cpu_milli,
    parse_bytes,
    parse_cpu_milli,
    parse_quantity,
    readable_bytes,
)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("500m", Decimal("0.5")),
        ("2", 2),
        ("1Gi", 2**30),
        ("512Mi", 512 * 2**20),
        ("1G", 10**9),
        ("1.5Gi", 3 * 2**29),
        ("1e3", 1000),
        (3, 3),
        (0.25, Decimal("0.25")),
    ],
)
def test_parse(text: str | int | float, value: Decimal | int) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["1GB", "lots", "", "-1", "1 Gi", "Gi", True])
def test_bad_quantities_say_what_is_allowed(text: str) -> None:
    with pytest.raises(QuantityError) as info:
        parse_quantity(text)
    if text == "1GB":
        assert "Ki, Mi, Gi" in str(info.value)


def test_cpu_and_bytes() -> None:
    assert parse_cpu_milli("1.5") == 1500 and parse_cpu_milli("250m") == 250
    with pytest.raises(QuantityError, match="finer than 1m"):
        parse_cpu_milli("0.0005")
    with pytest.raises(QuantityError, match="whole number of bytes"):
        parse_bytes("500m")
    assert (format_cpu_milli(2000), format_cpu_milli(500)) == ("2", "500m")
    assert (format_bytes(2**30), format_bytes(3 * 2**29), format_bytes(1000)) == ("1Gi", "1536Mi", "1000")


@pytest.mark.parametrize(
    ("size", "text"), [(17, "17 bytes"), (1536, "1.5 KiB"), (2**20, "1.0 MiB"), (2 * 2**30 + 1, "2.0 GiB")]
)
def test_readable_bytes(size: int, text: str) -> None:
    assert readable_bytes(size) == text


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_numbers_that_are_not_finite_are_refused_not_compared(value: float) -> None:
    # JSON's NaN, Infinity and 1e400 arrive as these floats; NaN compares with nothing.
    with pytest.raises(QuantityError, match="finite"):
        parse_quantity(value)
