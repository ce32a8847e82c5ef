"""Durations as people read them, the same way in every table and line labctl prints."""

from __future__ import annotations

import math


def fmt_ns(value: float | int | None) -> str:
    """Human duration for tables: 25.1 ms, 74 µs, 6.021 s."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    v = float(value)
    if abs(v) >= 1e9:
        return f"{v / 1e9:.3f} s"
    if abs(v) >= 1e6:
        return f"{v / 1e6:.1f} ms"
    if abs(v) >= 1e3:
        return f"{v / 1e3:.0f} µs"
    return f"{v:.0f} ns"
