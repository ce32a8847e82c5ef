"""Durations as people read them, the same way in every table and line labctl prints.

A single duration in a sentence picks its own unit (`fmt_ns`). A table column holds one unit for all its
cells (`UnitColumn`): chosen for the column's values, named in the header, each cell a bare number in it;
an interval printed beside a value (a median's CI) is in that value's unit and precision.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

TIME_UNITS: dict[str, int] = {"ns": 1, "µs": 1_000, "ms": 1_000_000, "s": 1_000_000_000}
"""Each unit and its size in ns, smallest first."""

SIGNIFICANT = 3
"""Significant digits of a number in a column's unit (at least its integer part: 6021 ms, not 6020)."""

_SINGLE = (("s", 3), ("ms", 1), ("µs", 0), ("ns", 0))  # fmt_ns: each unit and its decimals, largest first


def _missing(value: float | int | None) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def fmt_ns(value: float | int | None) -> str:
    """Human duration for a sentence: 25.1 ms, 74 µs, 6.021 s (a value that rounds up to 1000 of a unit
    is said in the next: 999,960 ns is 1.0 ms, never 1000 µs)."""
    if _missing(value):
        return "—"
    assert value is not None
    v = float(value)
    for i, (unit, decimals) in enumerate(_SINGLE):
        scaled = round(v / TIME_UNITS[unit], decimals)
        next_up = _SINGLE[i - 1][0] if i else None
        if next_up is not None and abs(scaled) >= 1000:  # rounded up into the next unit
            return f"{v / TIME_UNITS[next_up]:.{_SINGLE[i - 1][1]}f} {next_up}"
        if abs(scaled) >= 1 or unit == "ns":
            return f"{scaled:.{decimals}f} {unit}"
    raise AssertionError("unreachable: ns takes every value")


def pick_unit(values: Iterable[float | int | None]) -> str:
    """One unit for a column of durations (ns): the largest unit not above the median magnitude of the
    column's non-zero values, so the typical cell reads 1-999 in it (ns for a column of none)."""
    magnitudes = sorted(abs(float(v)) for v in values if v is not None and not _missing(v) and v != 0)
    if not magnitudes:
        return "ns"
    middle = magnitudes[len(magnitudes) // 2]
    return next((u for u in reversed(TIME_UNITS) if middle >= TIME_UNITS[u]), "ns")


def decimals_for(value: float | int | None, unit: str, significant: int = SIGNIFICANT) -> int:
    """Decimals that show `significant` digits of `value` in `unit` (none past the integer part; at most
    as many as resolve 1 ns in the unit)."""
    most = round(math.log10(TIME_UNITS[unit]))
    if _missing(value) or value == 0:
        return 0
    assert value is not None
    scaled = abs(float(value)) / TIME_UNITS[unit]
    places = max(0, min(most, significant - 1 - math.floor(math.log10(scaled))))
    if places and round(scaled, places) >= 10 ** (significant - places):  # 0.99996 rounds to 1.000: 1.00
        places -= 1
    return places


def fmt_in(value: float | int | None, unit: str, decimals: int | None = None) -> str:
    """`value` (ns) as a bare number in `unit` ("—" where missing): 0.0750 in ms is 75 µs."""
    if _missing(value):
        return "—"
    assert value is not None
    places = decimals_for(value, unit) if decimals is None else decimals
    return f"{float(value) / TIME_UNITS[unit]:.{places}f}"


@dataclass(frozen=True)
class UnitColumn:
    """One table column of durations in one unit, chosen for its values (`of`)."""

    unit: str

    @classmethod
    def of(cls, values: Iterable[float | int | None]) -> UnitColumn:
        return cls(pick_unit(values))

    def header(self, name: str) -> str:
        return f"{name} ({self.unit})"

    def cell(self, value: float | int | None) -> str:
        return fmt_in(value, self.unit)

    def with_interval(
        self, value: float | int | None, interval: Iterable[float | int] | None, *, sep: str = " "
    ) -> str:
        """`value` and its interval in this unit, all three at one precision (that of the largest, so a
        difference near 0 with a wide interval reads `4 [-2080, 1719]`): `47.3 [45.4, 48.9]`."""
        bounds = list(interval) if interval is not None else []
        if _missing(value) or len(bounds) != 2:
            return self.cell(value)
        assert value is not None
        places = decimals_for(max(abs(float(value)), *map(abs, bounds)), self.unit)
        low, high = (fmt_in(b, self.unit, places) for b in bounds)
        return f"{fmt_in(value, self.unit, places)}{sep}[{low}, {high}]"

    def interval(self, interval: Iterable[float | int] | None, like: float | int | None) -> str:
        """An interval alone, at the precision of the value it belongs to (`like`) or of its larger end,
        whichever is larger: `[45.4, 48.9]`."""
        bounds = list(interval) if interval is not None else []
        if len(bounds) != 2:
            return "—"
        largest = max(abs(float(b)) for b in bounds)
        places = decimals_for(largest if _missing(like) else max(abs(float(like or 0)), largest), self.unit)
        low, high = (fmt_in(b, self.unit, places) for b in bounds)
        return f"[{low}, {high}]"


def fmt_pair(first: float | int | None, second: float | int | None) -> tuple[str, str, str]:
    """Two durations said together in one unit (chosen for both): (first, second, unit)."""
    unit = pick_unit([first, second])
    return fmt_in(first, unit), fmt_in(second, unit), unit
