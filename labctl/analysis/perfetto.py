"""A run's timeline as a Chrome trace-event JSON file that Perfetto's UI (ui.perfetto.dev) and
chrome://tracing open (issue 27).

One process per host (the switches and the controller are hosts too), one track per NIC port. On each port's
track, per reconfiguration, a slice for the whole recovery (t0 → t5) with its phases nested under it
(optical t0 → t2, firmware t2 → t3, carrier t3 → t4, transport t4 → t5: the breakdown's definitions), an
instant per mark carrying its resolution, and a sampled mark's bracket (the previous sample, which did not
see it, to the mark) as a slice nested at the end of the phase the mark closes. Each switch command is a
slice on its switch's track (ocs.command → ocs.complete); Rx power (dBm) and the loop's lag are counters,
a dark Rx power sample (None: no light) at FLOOR_DBM, -100 dBm, so every outage shows.
Times are the run's CLOCK_MONOTONIC stamps in microseconds from the run's start (the format's unit),
fractional, so no nanosecond is lost. A phase the breakdown flagged (impossible or unresolved) is drawn
with its flag in the slice's arguments, never as a negative slice: Perfetto would reject it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from labctl.analysis.breakdown_table import COLUMNS

MARKS = tuple(COLUMNS[COLUMNS.index("t0_command_ns") : COLUMNS.index("t5_traffic_ns") + 1])
PHASES = (  # name, start mark, end mark: as labctl.analysis.breakdown defines them
    ("optical", "t0_command_ns", "t2_rx_power_ns"),
    ("firmware", "t2_rx_power_ns", "t3_firmware_up_ns"),
    ("carrier", "t3_firmware_up_ns", "t4_carrier_up_ns"),
    ("transport", "t4_carrier_up_ns", "t5_traffic_ns"),
)
FLOOR_DBM = -100.0
"""Dark, on the Rx power counter (a counter has no -inf): an `rx_power` sample of None (the receiver reads no
light, below its floor) is drawn at this value, under every reading any source reports (a module's 0.1 µW is
-40 dBm, a power meter reads to -70 dBm, a switch monitor above -99.99 dBm), so no reading is mistaken for
dark nor dark for a reading; the trace's metadata names it (`rx_power_dark_dbm`). The events keep None
(decision 0075)."""


def _counter_dbm(value: Any, meta: dict[str, Any]) -> float | None:
    """An `rx_power` sample on the counter: its dBm, FLOOR_DBM where it is dark; None for one that measured
    nothing (a switch port with `monitor: none`) or holds no number."""
    if value is None or (isinstance(value, float) and math.isnan(value)):  # NaN: a None a frame made a float
        return None if meta.get("monitor") == "none" else FLOOR_DBM
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return max(float(value), FLOOR_DBM)


def _ns(value: Any) -> int | None:
    """A mark or value as integer ns; None where it is missing (None, NaN, NA)."""
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return None
    return int(value)


class TraceBuilder:
    """The trace's events: a pid per host, a tid per track, times in µs from `origin_ns`."""

    def __init__(self, origin_ns: int) -> None:
        self.origin_ns = origin_ns
        self.pids: dict[str, int] = {}
        self.tids: dict[tuple[str, str], int] = {}
        self.meta: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.busy_until: dict[tuple[str, str], int] = {}  # a port lane's last recovery end

    def track(self, host: str, name: str) -> tuple[int, int]:
        if host not in self.pids:
            self.pids[host] = len(self.pids) + 1
            self.meta.append(  # tid 0: the process itself (the format wants a tid on every event)
                {"ph": "M", "name": "process_name", "pid": self.pids[host], "tid": 0, "args": {"name": host}}
            )
        pid = self.pids[host]
        if (host, name) not in self.tids:
            tid = self.tids[(host, name)] = len(self.tids) + 1
            self.meta.append(
                {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}
            )
        return pid, self.tids[(host, name)]

    def us(self, t_ns: int) -> float:
        return (t_ns - self.origin_ns) / 1e3

    def slice(
        self, where: tuple[int, int], name: str, cat: str, start: int, end: int, args: dict[str, Any]
    ) -> None:
        pid, tid = where
        event = {"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": tid, "ts": self.us(start)}
        self.events.append({**event, "dur": (end - start) / 1e3, "args": args})

    def instant(self, where: tuple[int, int], name: str, t: int, args: dict[str, Any]) -> None:
        pid, tid = where
        self.events.append(
            {
                "ph": "i",
                "s": "t",
                "name": name,
                "cat": "mark",
                "pid": pid,
                "tid": tid,
                "ts": self.us(t),
                "args": args,
            }
        )

    def counter(self, host: str, name: str, t: int, args: dict[str, float]) -> None:
        pid, tid = self.track(host, "counters")
        self.events.append({"ph": "C", "name": name, "pid": pid, "tid": tid, "ts": self.us(t), "args": args})

    def lane(self, host: str, port: str, start: int, end: int) -> tuple[int, int]:
        """The port's track, or a second one (`port #2`) where this recovery starts before the last one on
        it ended (a port still recovering when the next command came): slices on one track must nest."""
        n = 1
        while True:
            name = port if n == 1 else f"{port} #{n}"
            if self.busy_until.get((host, name), start) <= start:
                self.busy_until[(host, name)] = end
                return self.track(host, name)
            n += 1

    def port(self, row: dict[str, Any]) -> None:
        """One breakdown row: the recovery, its phases and its marks on the port's track."""
        host, port = str(row.get("host") or "?"), str(row.get("port") or row.get("source") or "?")
        flags = ",".join(
            str(row[f]) for f in ("impossible", "unresolved") if isinstance(row.get(f), str) and row[f]
        )
        args = {"reconfig": int(row["reconfig"]), "phase": row.get("phase"), "peer": row.get("peer") or ""}
        marks = {mark: _ns(row.get(mark)) for mark in MARKS}
        t0, t5 = marks["t0_command_ns"], marks["t5_traffic_ns"]
        known = [t for t in marks.values() if t is not None]
        if not known:
            return
        where = self.lane(host, port, min(known), max(known))
        recovery = t0 is not None and t5 is not None and t5 >= t0
        if t0 is not None and t5 is not None and recovery:
            self.slice(where, f"reconfig {args['reconfig']}", "recovery", t0, t5, {**args, "flags": flags})
        cursor = t0 if recovery else None
        drawn: dict[str, int] = {}  # end mark → start of the phase slice drawn up to it
        for name, start, end in PHASES:
            a, b = marks[start], marks[end]
            # A flagged phase (it ends before it starts) is no slice, nor one that would overlap the phase
            # before it or leave the recovery: slices on a track nest, the format's rule.
            if a is None or b is None or b < a or (cursor is not None and a < cursor):
                continue
            if recovery and t5 is not None and b > t5:
                continue
            self.slice(where, name, "phase", a, b, {**args, "ns": b - a})
            drawn[end] = a
            cursor = b
        for mark, t in marks.items():
            if t is None:
                continue
            resolution = _ns(row.get(mark[:2] + "_resolution_ns"))
            extra = {} if resolution is None else {"resolution_ns": resolution}
            name = mark.removesuffix("_ns")
            # A sampled mark's bracket (the previous sample, which did not see it, to the mark) as a slice
            # nested at the end of the phase it closes; where it would reach before that phase began, its
            # width stays in the instant's arguments only.
            if resolution and mark in drawn and t - resolution >= drawn[mark]:
                self.slice(where, f"{name} bracket", "bracket", t - resolution, t, {**args, "ns": resolution})
            self.instant(where, name, t, {**args, "t_ns": t, **extra})

    def stream(self, events: pd.DataFrame) -> None:
        """Switch commands as slices on their switch's track; Rx power and loop lag as counters."""
        pending: dict[str, tuple[int, dict[str, Any], Any]] = {}  # switch → its command in flight
        for e in events.to_dict("records"):
            kind, source, t = e["kind"], str(e["source"]), int(e["t_ns"])
            meta = e["meta"] if isinstance(e.get("meta"), dict) else {}
            if kind == "ocs.command":
                keep = {k: meta[k] for k in ("rail", "rails", "attempt", "topo_id") if k in meta}
                pending[source] = (t, keep, e["value"])
            elif kind == "ocs.complete" and source in pending:
                start, command, value = pending.pop(source)
                where = self.track(source.removeprefix("ocs:"), "commands")
                self.slice(where, f"{value} changes", "switch", start, t, {**command, "switch_ns": t - start})
            elif kind == "rx_power" and (dbm := _counter_dbm(e["value"], meta)) is not None:
                self.counter(str(e.get("host") or "?"), f"rx {source.split('/')[-1]} dBm", t, {"dBm": dbm})
            elif kind == "loop.lag" and isinstance(e["value"], int | float):
                self.counter("controller", "loop lag ms", t, {"ms": e["value"] / 1e6})


def trace_events(events: pd.DataFrame, breakdown: pd.DataFrame, origin_ns: int) -> list[dict[str, Any]]:
    """The run's trace events: metadata first, then per-port slices and marks, switch commands, counters."""
    builder = TraceBuilder(origin_ns)
    for row in breakdown.to_dict("records"):
        builder.port({str(k): v for k, v in row.items()})
    builder.stream(events)
    # Time moves forward on every track in file order; at one instant an enclosing slice comes before
    # what it encloses (longer first), and a mark after the slices that start with it.
    ordered = sorted(builder.events, key=lambda e: (e["ts"], e["ph"] != "X", -e.get("dur", 0.0)))
    return builder.meta + ordered


def write_perfetto(run_dir: Path, out: Path) -> int:
    """Write the run's trace to `out` (Chrome trace-event JSON); returns how many trace events it holds."""
    from labctl.analysis.store import load_run

    run = load_run(run_dir)
    origin = int(run.meta.get("timebase", {}).get("mono0_ns") or run.events["t_ns"].min())
    items = trace_events(run.events, run.breakdown, origin)
    metadata = {"run_id": run.meta.get("run_id"), "rx_power_dark_dbm": FLOOR_DBM}
    payload = {"traceEvents": items, "displayTimeUnit": "ns", "metadata": metadata}
    out.write_text(json.dumps(payload, separators=(",", ":")), encoding="utf-8")
    return len(items)
