"""Wall time for the queue: the injectable clock, `--at` parsing and cron expressions (croniter)."""

from __future__ import annotations

import importlib
import re
import time
from datetime import datetime, tzinfo
from typing import Any, Protocol

from labctl.core.errors import InputError


# -- clocks ----------------------------------------------------------------------------------------------
class Clock(Protocol):
    """Wall-clock time for due dates and cron (users schedule in wall time); injectable for tests."""

    def wall_ns(self) -> int: ...


class SystemClock:
    def wall_ns(self) -> int:
        return time.time_ns()


# -- time parsing ----------------------------------------------------------------------------------------
_RELATIVE = re.compile(r"^\+(\d+(?:\.\d+)?)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_AT_HORIZON_NS = 10 * 366 * 86_400 * 10**9  # ten years: beyond that it is a typo (and overflows SQLite)


def parse_at(text: str, now_wall_ns: int) -> int:
    """`--at`: ISO 8601 (local time when no zone is given) or relative `+30s`, `+10m`, `+2h`, `+1d`."""
    m = _RELATIVE.match(text.strip())
    if m:
        at = now_wall_ns + round(float(m[1]) * _UNIT_S[m[2]] * 1e9)
    else:
        try:
            dt = datetime.fromisoformat(text.strip())
            if dt.tzinfo is None:
                dt = dt.astimezone()  # naive = local time
            at = round(dt.timestamp() * 1e9)
        except (ValueError, OverflowError, OSError):
            raise InputError(
                f"--at {text!r}: not a time; use ISO 8601 (2026-12-01T02:00, 2026-12-01 02:00+01:00) "
                "or a delay like +30s, +10m, +2h"
            ) from None
    if not 0 <= at - now_wall_ns <= _AT_HORIZON_NS:
        raise InputError(
            f"--at {text!r}: must be between now and {_AT_HORIZON_NS // 86_400_000_000_000} days ahead"
        )
    return at


def _croniter() -> Any:
    """croniter ships no type information (and its stubs are not a runtime dependency)."""
    return importlib.import_module("croniter").croniter


def validate_cron(expr: str) -> str:
    """Five fields only (croniter would read a sixth as seconds), and one that can actually fire."""
    croniter = _croniter()
    if len(expr.split()) != 5 or not croniter.is_valid(expr):
        raise InputError(f"--cron {expr!r}: not a cron expression (five fields: min hour day month weekday)")
    try:
        croniter(expr, datetime.now().astimezone()).get_next(datetime)
    except Exception:  # croniter's CroniterBadDateError and friends: e.g. '0 0 31 2 *' never fires
        raise InputError(f"--cron {expr!r}: never fires (no such date)") from None
    return expr


def next_fire_ns(expr: str, after_wall_ns: int, tz: tzinfo | None) -> int:
    """The first time strictly after `after_wall_ns` that `expr` fires, evaluated in `tz` (None: local)."""
    croniter = _croniter()
    base = datetime.fromtimestamp(after_wall_ns / 1e9, tz=tz or datetime.now().astimezone().tzinfo)
    nxt: datetime = croniter(expr, base).get_next(datetime)
    return round(nxt.timestamp() * 1e9)


def fmt_wall(ns: int | None) -> str:
    if ns is None:
        return "—"
    return datetime.fromtimestamp(ns / 1e9).astimezone().strftime("%Y-%m-%d %H:%M:%S")
