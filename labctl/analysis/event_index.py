"""The events a breakdown reads, indexed: each source's signals grouped by kind into time-sorted arrays
(`Series`: time, value, the sample before), and the run's few control events in full (`EventIndex`, read
from events.jsonl decoding only the fields it needs)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from labctl.core.errors import InputError
from labctl.core.events import Event, Kind

METER = "rx_power<meter"
"""The index key of the meter readings of a NIC port's receive fiber (rx_power events naming it in meta)."""
CONTROL_KINDS = frozenset(
    {Kind.PHASE, Kind.OCS_COMMAND, Kind.OCS_COMPLETE, Kind.RUN_TIMEOUT, Kind.RUN_START, Kind.LINK_SETTINGS}
)
SIGNAL_KINDS = (
    Kind.RX_POWER,
    Kind.RX_UPDATE,
    Kind.LINK_FIRMWARE,
    Kind.CARRIER,
    Kind.TRAFFIC_OK,
    Kind.TRAFFIC_LOST,
)


class _LiteMeta(msgspec.Struct, frozen=True):
    peer: str | None = None
    nic: str | None = None  # a power-meter channel's reading: the NIC port whose receive fiber it taps
    prev_ns: int | None = None
    after_ns: int | None = None  # the carrier and link-state polls' name for the same bracket start
    sampling_period_ns: int | None = None


class _Lite(msgspec.Struct):
    """The fields the breakdown needs from every event; decoding skips the rest of meta cheaply."""

    t_ns: int
    source: str
    kind: str
    value: int | float | str | None = None
    meta: _LiteMeta = _LiteMeta()


def traffic_ok_key(peer: str) -> str:
    """The index key of traffic.ok events that reached `peer` (traffic probes name their peer in meta)."""
    return f"traffic.ok>{peer}"


@dataclass
class Series:
    t: np.ndarray
    v: np.ndarray
    prev: np.ndarray
    """The time of the sample before each event's (-1: none known, a mark stamped as it happened)."""


class EventIndex:
    """Events grouped by (source, kind) into time-sorted arrays, plus the few control events in full."""

    def __init__(self) -> None:
        self._t: dict[tuple[str, str], list[int]] = defaultdict(list)
        self._v: dict[tuple[str, str], list[float]] = defaultdict(list)
        self._p: dict[tuple[str, str], list[int]] = defaultdict(list)
        self.update_ns: dict[str, int] = {}
        """Per source: the module's estimated DOM update interval where it exceeds the sampling period."""
        self.control: list[Event] = []
        self._series: dict[tuple[str, str], Series] = {}

    @property
    def last_ns(self) -> int:
        """The latest time stamped on any indexed event (0 if none)."""
        return max([max(ts) for ts in self._t.values() if ts] + [e.t_ns for e in self.control], default=0)

    def add(
        self,
        t_ns: int,
        source: str,
        kind: str,
        value: Any,
        peer: str | None = None,
        prev_ns: int | None = None,
        sampling_period_ns: int | None = None,
        nic: str | None = None,
    ) -> None:
        if kind == Kind.RX_UPDATE:
            # Longer than the sampling period: the module, not the poller, limits the optical mark.
            if isinstance(value, int) and value > 1.5 * (sampling_period_ns or 0):
                self.update_ns[source] = value
            else:
                self.update_ns.pop(source, None)
            return
        v = -math.inf if value is None else float(value) if not isinstance(value, str) else 0.0
        keys = [(source, kind)]
        if kind == Kind.TRAFFIC_OK and peer:
            keys.append((source, traffic_ok_key(peer)))
        elif kind == Kind.RX_POWER and nic:
            keys.append((nic, METER))
        for key in keys:
            self._t[key].append(t_ns)
            self._v[key].append(v)
            self._p[key].append(-1 if prev_ns is None else prev_ns)

    @classmethod
    def from_events(cls, events: Iterable[Event]) -> EventIndex:
        index = cls()
        for e in events:
            if e.kind in CONTROL_KINDS:
                index.control.append(e)
            elif e.kind in SIGNAL_KINDS:
                m = e.meta
                prev = m.get("prev_ns", m.get("after_ns"))
                index.add(
                    e.t_ns,
                    e.source,
                    e.kind,
                    e.value,
                    m.get("peer"),
                    prev,
                    m.get("sampling_period_ns"),
                    m.get("nic"),
                )
        return index

    @classmethod
    def from_file(cls, path: Path) -> EventIndex:
        """Fast path for large files: decode only t/source/kind/value except for control events."""
        index = cls()
        lite = msgspec.json.Decoder(_Lite)
        full = msgspec.json.Decoder(Event)
        with open(path, "rb") as f:
            data = f.read()
        lines = data.split(b"\n")
        for i, line in enumerate(lines):
            if not line:
                continue
            try:
                e = lite.decode(line)
            except msgspec.DecodeError as err:
                if i == len(lines) - 1:  # torn last line of a killed run
                    break
                raise InputError(f"{path}:{i + 1}: not a valid event line ({err})") from None
            if e.kind in CONTROL_KINDS:
                index.control.append(full.decode(line))
            elif e.kind in SIGNAL_KINDS:
                m = e.meta
                prev = m.prev_ns if m.prev_ns is not None else m.after_ns
                index.add(e.t_ns, e.source, e.kind, e.value, m.peer, prev, m.sampling_period_ns, m.nic)
        return index

    def series(self, source: str, kind: str) -> Series:
        key = (source, kind)
        s = self._series.get(key)
        if s is None:
            t = np.asarray(self._t.get(key, ()), dtype=np.int64)
            v = np.asarray(self._v.get(key, ()), dtype=np.float64)
            p = np.asarray(self._p.get(key, ()), dtype=np.int64)
            order = np.argsort(t, kind="stable")
            s = self._series[key] = Series(t[order], v[order], p[order])
        return s
