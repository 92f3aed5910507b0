"""Units: seconds and bytes everywhere; human budget strings are parsed here and only here."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Decimal

from memsched.errors import MemschedError

_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
# The largest size accepted anywhere: byte counts are stored as signed 64-bit integers (the service's
# database included), and nothing real comes near it (8 EiB).
MAX_BYTES = 2**63 - 1
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE]([0-9]+))?\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str | int, field: str = "budget") -> int:
    """Parse '12GiB', '500MB', '1.5e9' or a plain integer into bytes."""
    if isinstance(text, bool):
        raise MemschedError(f"{field}: expected a size such as 12GiB, 500MB or 1048576, got {text!r}")
    if isinstance(text, int):
        value = text
    else:
        m = _SIZE_RE.match(text)
        if not m or m.group(3).lower() not in _UNITS:
            raise MemschedError(f"{field}: cannot read {text!r} as a size; write it like 12GiB, 500MB, 1048576 or 50%")
        if m.group(2) and int(m.group(2)) > 30:
            # Decimal would compute 1e400 exactly, but no exponent past 30 is a size: say so before the work.
            raise MemschedError(
                f"{field}: {text!r} is far larger than any memory (at most 8 EiB); "
                "check the exponent, or write the size like 12GiB"
            )
        # Decimal, not float: exact for any written size, and 1e30 cannot overflow a float conversion.
        number = Decimal(m.group(1)) * (10 ** int(m.group(2)) if m.group(2) else 1)
        value = int((number * _UNITS[m.group(3).lower()]).to_integral_value(rounding=ROUND_HALF_EVEN))
    if value > MAX_BYTES:
        raise MemschedError(
            f"{field}: {text!r} is larger than any memory (at most 8 EiB, 2**63-1 bytes); "
            "check the number and its unit, e.g. 12GiB"
        )
    if value <= 0:
        raise MemschedError(f"{field}: must be > 0 bytes, got {text!r}; give a positive size such as 8GiB")
    return value


@dataclass(frozen=True)
class BudgetSpec:
    """A budget as the user wrote it: absolute bytes, or a percentage of the keep-all activation peak."""

    bytes: int | None = None
    """Absolute budget in bytes (the whole device-memory peak), or None for a percentage budget."""
    percent: float | None = None
    """N in 'N%': static bytes + N% of the keep-all peak activation bytes, or None for an absolute budget."""

    def describe(self) -> str:
        return f"{self.percent:g}%" if self.percent is not None else format_bytes(self.bytes or 0)


def parse_budget(text: str | int) -> BudgetSpec:
    """Parse a budget: '12GiB', '500MB', plain bytes, or 'N%' (static + N% of activations: docs/architecture.md,
    'Units and budgets')."""
    if isinstance(text, str) and text.strip().endswith("%"):
        raw = text.strip()[:-1]
        try:
            pct = float(raw)
        except ValueError:
            raise MemschedError(f"budget: cannot read {text!r} as a percentage; write it like 50%") from None
        if not math.isfinite(pct) or pct <= 0:
            raise MemschedError(f"budget: percentage must be > 0, got {text!r}; write it like 50%")
        return BudgetSpec(percent=pct)
    if isinstance(text, str):
        m = _SIZE_RE.match(text)
        if m and not m.group(3) and 0 < Decimal(m.group(1)) * (10 ** int(m.group(2) or 0)) <= 1:
            # A budget of a byte or less is never meant: a fraction that small is a share of activations
            # written without its percent sign.
            pct = float(Decimal(m.group(1)) * (10 ** int(m.group(2) or 0)) * 100)
            raise MemschedError(
                f"budget: {text!r} would be {text.strip()} byte(s), which no model fits in; did you mean {pct:g}%? "
                f"Write {pct:g}% (static + {pct:g}% of the activations) or a size such as 8GiB"
            )
    return BudgetSpec(bytes=parse_bytes(text))


def format_bytes(n: float) -> str:
    """Human-readable binary size, e.g. 1.50 GiB."""
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{sign}{n / scale:.2f} {unit}"
    return f"{sign}{int(n)} B"


def format_seconds(s: float) -> str:
    """Human-readable duration: ms below 10 s."""
    return f"{s * 1e3:.2f} ms" if abs(s) < 10 else f"{s:.2f} s"
