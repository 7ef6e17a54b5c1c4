"""Kubernetes resource quantities (`500m`, `2`, `1Gi`, `512Mi`, `1G`) parsed and rendered."""

from __future__ import annotations

import math
import re
from decimal import Context, Decimal, InvalidOperation

_BINARY: dict[str, int] = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL: dict[str, Decimal | int] = {
    "m": Decimal("0.001"),
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
}
_QUANTITY = re.compile(r"^(?P<num>[+]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)(?P<suffix>[A-Za-z]*)$")

SUFFIXES = "Ki, Mi, Gi, Ti, Pi, Ei (powers of 1024), k, M, G, T, P, E (powers of 1000), m (1/1000)"
# No resource of one job or user comes near this (it is 1000 Yi-ish); larger values are
# typos or probes, and refusing them keeps every later sum exact and small.
MAX_QUANTITY = Decimal(10) ** 24
# Exact arithmetic for anything under MAX_QUANTITY with its fractions (Decimal's default
# context keeps 28 digits and would round a long number silently).
_EXACT = Context(prec=60)


class QuantityError(ValueError):
    """Not a Kubernetes quantity; the message says which suffixes are allowed."""


def parse_quantity(text: str | int | float) -> Decimal:
    """The value of a quantity as an exact decimal (`1Gi` → 1073741824, `500m` → 0.5)."""
    if isinstance(text, bool):
        raise QuantityError("expected a quantity such as 2, 500m or 1Gi, not a boolean")
    if isinstance(text, float) and not math.isfinite(text):
        # JSON's NaN, Infinity and 1e400 arrive as floats that compare with nothing.
        raise QuantityError(f"must be a finite number, not {text}")
    if isinstance(text, int | float):
        if text < 0:
            raise QuantityError("must not be negative")
        return _bounded(Decimal(str(text)), text)
    match = _QUANTITY.match(text.strip())
    if match is None:
        raise QuantityError(f"{text!r} is not a quantity such as 2, 500m or 1Gi")
    suffix = match["suffix"]
    if suffix in _BINARY:
        factor: Decimal | int = _BINARY[suffix]
    elif suffix in _DECIMAL:
        factor = _DECIMAL[suffix]
    else:
        raise QuantityError(f"{text!r} has unknown suffix {suffix!r}; use {SUFFIXES}")
    try:
        number = Decimal(match["num"])
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only decimals
        raise QuantityError(f"{text!r} is not a number") from exc
    if number.adjusted() > 30:  # before multiplying: 1e300 is refused, not computed
        raise QuantityError(f"{text[:40]!r} is too large (at most {MAX_QUANTITY:.0e})")
    return _bounded(_EXACT.multiply(number, Decimal(factor)), text)


def _bounded(value: Decimal, text: object) -> Decimal:
    if value >= MAX_QUANTITY:
        raise QuantityError(f"{str(text)[:40]!r} is too large (at most {MAX_QUANTITY:.0e})")
    return value


def parse_cpu_milli(text: str | int | float) -> int:
    """CPU as whole millicores (`2` → 2000, `500m` → 500); finer than 1m is refused."""
    value = parse_quantity(text) * 1000
    if value != value.to_integral_value():
        raise QuantityError(f"{text!r} is finer than 1m (a thousandth of a CPU)")
    return int(value)


def parse_bytes(text: str | int | float) -> int:
    """A memory or storage size in bytes (`1Gi` → 1073741824); fractions of a byte are refused."""
    value = parse_quantity(text)
    if value != value.to_integral_value():
        raise QuantityError(f"{text!r} is not a whole number of bytes")
    return int(value)


def format_cpu_milli(milli: int) -> str:
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def format_bytes(size: int) -> str:
    """The shortest exact binary-suffixed spelling (`1073741824` → `1Gi`)."""
    for suffix, factor in sorted(_BINARY.items(), key=lambda kv: -kv[1]):
        if size and size % factor == 0:
            return f"{size // factor}{suffix}"
    return str(size)


def readable_bytes(size: int) -> str:
    """A size as people read it, to a tenth (`2.0 GiB`, `512.0 KiB`, `17 bytes`)."""
    for unit, factor in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= factor:
            return f"{size / factor:.1f} {unit}"
    return f"{size} bytes"
