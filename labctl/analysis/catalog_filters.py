"""Which runs: the catalogue's filters (experiment, lab and profile as names or shell globs, `--since`,
`--status`) from the command line's text, as an SQL condition over the catalogue and as a test of one row."""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, replace
from typing import Any

from labctl.core.errors import InputError

RECORDED_STATUSES = ("running", "completed", "failed", "aborted")
STATUSES = (*RECORDED_STATUSES, "crashed")
"""What `--status` takes: the statuses run.json records, and `crashed` (recorded running, process gone)."""


_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)\s*(m|min|h|d|w)$")
_SECONDS = {"m": 60, "min": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")


def parse_since(text: str, now: dt.datetime | None = None) -> int:
    """`--since` as wall-clock ns: an ISO 8601 date or date-time (local time unless it names its offset
    or Z), `today`, `yesterday`, a weekday (`monday`: the latest Monday at 00:00, today if it is one), or
    an age (`90m`, `36h`, `7d`, `2w`). Anything else is an InputError."""
    now = now or dt.datetime.now().astimezone()
    word = text.strip().lower()
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    when: dt.datetime | None = None
    if word == "today":
        when = midnight
    elif word == "yesterday":
        when = midnight - dt.timedelta(days=1)
    elif word in _WEEKDAYS or (len(word) == 3 and word in [d[:3] for d in _WEEKDAYS]):
        back = (now.weekday() - [d[:3] for d in _WEEKDAYS].index(word[:3])) % 7
        when = midnight - dt.timedelta(days=back)
    elif m := _RELATIVE.match(word):
        when = now - dt.timedelta(seconds=float(m[1]) * _SECONDS[m[2]])
    else:
        try:
            when = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
        except ValueError:
            raise InputError(
                f"--since {text!r}: not a date; use an ISO date or time (2026-12-01, 2026-12-01T14:00), "
                "today, yesterday, a weekday (monday), or an age (36h, 7d)"
            ) from None
        if when.tzinfo is None:
            when = when.astimezone()  # a person's date: this machine's local time
    return int(when.timestamp()) * 1_000_000_000 + when.microsecond * 1000


def parse_statuses(text: str | None) -> frozenset[str]:
    """`--status completed,aborted` as a set; an unknown status is an InputError naming the known ones."""
    if not text:
        return frozenset()
    names = {n.strip().lower() for n in text.split(",") if n.strip()}
    unknown = sorted(names - set(STATUSES))
    if unknown or not names:
        raise InputError(f"--status {text!r}: use one or more of {', '.join(STATUSES)} (comma-separated)")
    return frozenset(names)


@dataclass(frozen=True)
class Filters:
    """Which runs: each given field must match (experiment, lab and profile as names or shell globs)."""

    experiment: str | None = None
    lab: str | None = None
    profile: str | None = None
    since_ns: int | None = None
    statuses: frozenset[str] = frozenset()

    def __bool__(self) -> bool:
        return any((self.experiment, self.lab, self.profile, self.since_ns is not None, bool(self.statuses)))

    def narrowed(self, other: Filters) -> Filters:
        """These filters with `other`'s fields where it sets them (a compare side's own, over the shared)."""
        return replace(
            self,
            **{
                name: value
                for name in ("experiment", "lab", "profile", "since_ns")
                if (value := getattr(other, name)) is not None
            },
            statuses=other.statuses or self.statuses,
        )

    def where(self) -> tuple[str, list[Any]]:
        """The SQL condition of every field but the status (worked out after reading: `crashed`)."""
        terms, params = ["TRUE"], []
        for column in ("experiment", "lab", "profile"):
            value = getattr(self, column)
            if value is not None:
                terms.append(f"{column} GLOB ?")
                params.append(value)
        if self.since_ns is not None:
            terms.append("started_ns >= ?")
            params.append(self.since_ns)
        return " AND ".join(terms), params

    def keeps(self, row: dict[str, Any]) -> bool:
        """Whether one row (with its effective `status`) passes every filter (explicitly named runs)."""
        from fnmatch import fnmatchcase

        for column in ("experiment", "lab", "profile"):
            pattern = getattr(self, column)
            if pattern is not None and not fnmatchcase(str(row.get(column) or ""), pattern):
                return False
        if self.since_ns is not None and (row.get("started_ns") or 0) < self.since_ns:
            return False
        return not self.statuses or row["status"] in self.statuses


FILTER_KEYS = ("experiment", "lab", "profile", "since", "status")
"""The `key=value` filters a compare side takes (the same as the --options)."""


def filters_from(
    experiment: str | None = None,
    lab: str | None = None,
    profile: str | None = None,
    since: str | None = None,
    status: str | None = None,
) -> Filters:
    """Filters from the command line's text (InputError for a bad date or status)."""
    return Filters(
        experiment=experiment,
        lab=lab,
        profile=profile,
        since_ns=parse_since(since) if since is not None else None,
        statuses=parse_statuses(status),
    )
