"""The link-up breakdown: per reconfiguration and affected NIC port, from the event stream alone.

Marks (DESIGN.md): t0 `ocs.command` sent · t1 `ocs.complete` · t2 first Rx power ≥ threshold after the
light was seen lost (or after t1 if the loss fell between samples) · t3 `link.firmware` up · t4 `carrier`
up · t5 first `traffic.ok` after t4. Each mark is searched in the window from t0 to the next
reconfiguration. A missing mark is empty (pandas <NA>, an empty CSV cell), never 0.

Brackets: a sampled mark is the first sample that saw the new state; the sample before it (its event's
`meta.prev_ns`, or `meta.after_ns` from the carrier and link-state polls) did not, so the change
happened in (prev_ns, t]. `tN_resolution_ns` is that width (plus a module's DOM update interval for t2,
where it is longer than the sampling period; 0 for marks stamped as they happen). A first `traffic.ok`
with no ping of its circuit before it (a circuit whose first ping got through) is bracketed from where
its search starts, carrier up (t4): traffic came back somewhere in (t4, t5]. A host's marks also
carry its clock-offset uncertainty (`clock_uncertainty_ns`) against the controller's t0/t1. A phase
whose end precedes its start by more than the brackets allow is physically impossible (`impossible`
names it: a wrong clock, a mislabelled event); one that is negative within them is shorter than the
marks resolve (`unresolved`, e.g. a starved sampler). Both are excluded from the summary, counted, and
named by the report: a negative duration is never printed as a measurement.

t2's source (the run's `analysis.t2_source`, recorded in run.start): `dom`, the port's transceiver
(`rx_power` of the port itself, the default); `power-meter`, a bench meter channel tapping the port's
receive fiber (`rx_power` whose `meta.nic` names the port); `auto`, the meter where one taps the port, else
the DOM. The `t2_source` column says which supplied each row's t2 (empty: no t2), summary.json counts them.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from labctl.analysis.breakdown_table import breakdown_frame
from labctl.analysis.event_index import METER, EventIndex, Series, traffic_ok_key
from labctl.core.errors import InputError
from labctl.core.events import Event, Kind

DEFAULT_THRESHOLD_DBM = -10.0
T2_SOURCES = ("dom", "power-meter", "auto")


class Mark(NamedTuple):
    """A mark's time and its bracket's width: the change happened in (t - resolution, t]."""

    t: int
    resolution: int


def _find(
    s: Series, start: int | None, end: float, mask: np.ndarray | None = None, *, sampled: bool = False
) -> Mark | None:
    """The first sample in [start, end) (where mask holds), with its bracket, or None. A sample with no
    sample before it is exact (an event stamped as it happened), unless `sampled`: then nothing says when
    the change came after `start`, and that is its bracket (a new circuit's first ping got through)."""
    if start is None:
        return None
    i = int(np.searchsorted(s.t, start, "left"))
    j = int(np.searchsorted(s.t, end, "left")) if end != math.inf else len(s.t)
    if i >= j:
        return None
    if mask is not None:
        hits = np.flatnonzero(mask[i:j])
        if not hits.size:
            return None
        i += int(hits[0])
    t, prev = int(s.t[i]), int(s.prev[i])
    if prev < 0 and sampled:
        return Mark(t, max(t - start, 0))
    return Mark(t, t - prev if 0 <= prev <= t else 0)


def _at(mark: Mark | None) -> int | None:
    return mark.t if mark is not None else None


def _sub(a: int | None, b: int | None) -> int | None:
    return a - b if a is not None and b is not None else None


# Each phase: (duration column, start mark, end mark, whether the marks are on different clocks: t0/t1
# on the controller's, the others on the host that observed them).
PHASES: tuple[tuple[str, str, str, bool], ...] = (
    ("switch_ns", "t0", "t1", False),
    ("optical_ns", "t0", "t2", True),
    ("firmware_ns", "t2", "t3", False),
    ("carrier_ns", "t3|t2", "t4", False),
    ("transport_ns", "t4", "t5", False),
    ("total_ns", "t0", "t5", True),
    ("carrier_down_ns", "t0", "down", True),
    ("traffic_lost_ns", "t0", "lost", True),
)


def compute_breakdown(
    events: Iterable[Event] | EventIndex,
    threshold_dbm: float | None = None,
    clock_uncertainty_ns: Mapping[str, int] | None = None,
    t2_source: str | None = None,
) -> pd.DataFrame:
    """One row per measured reconfiguration × affected port; columns as in
    labctl.analysis.breakdown_table.COLUMNS.

    `clock_uncertainty_ns`: per host, the uncertainty of its measured clock offset (agents' hosts); it
    widens the brackets of phases that subtract a controller mark from one of that host's.
    `t2_source` (T2_SOURCES; None: as the run recorded it, else dom) picks where t2 comes from."""
    index = events if isinstance(events, EventIndex) else EventIndex.from_events(events)
    uncertainty = clock_uncertainty_ns or {}
    control = sorted(index.control, key=lambda e: (e.t_ns, e.seq))
    start = next((e for e in control if e.kind == Kind.RUN_START), None)
    transport = str(start.meta.get("transport", "udp")) if start else "udp"
    if t2_source is None:
        t2_source = str(start.meta.get("t2_source", "dom")) if start else "dom"
    if t2_source not in T2_SOURCES:
        raise InputError(f"t2_source {t2_source!r} is not one of {', '.join(T2_SOURCES)}")
    if threshold_dbm is None:
        threshold_dbm = (
            float(start.meta.get("rx_power_threshold_dbm", DEFAULT_THRESHOLD_DBM))
            if start
            else DEFAULT_THRESHOLD_DBM
        )
    phases = [e for e in control if e.kind == Kind.PHASE]
    settings = _settings_applied(control)
    reference = next(
        (str(e.value) for e in control if e.kind == Kind.LINK_SETTINGS and e.meta.get("reference")), None
    )
    commands: dict[tuple[int | None, Any], int] = {}
    completes: dict[tuple[int | None, Any], int] = {}
    timed_out: dict[int | None, set[str]] = defaultdict(set)
    for e in control:
        if e.kind == Kind.OCS_COMMAND or e.kind == Kind.OCS_COMPLETE:
            # one command can carry several rails of one switch (`rails`, decision 0054)
            rails = e.meta.get("rails") or [e.meta.get("rail")]
            for rail in rails:
                key = (e.reconfig, rail)
                if e.kind == Kind.OCS_COMMAND:
                    commands.setdefault(key, e.t_ns)
                else:
                    completes[key] = e.t_ns  # the last acknowledgement (after any retry)
        elif e.kind == Kind.RUN_TIMEOUT:
            timed_out[e.reconfig].update(e.meta.get("pending", ()))

    rows = []
    for n, phase in enumerate(phases):
        if not phase.meta.get("measured", False):
            continue
        reconfig = phase.reconfig
        end: float = phases[n + 1].t_ns if n + 1 < len(phases) else math.inf
        for p in phase.meta.get("ports", ()):
            source, rail = p["source"], p["rail"]
            t0 = commands.get((reconfig, rail))
            t1 = completes.get((reconfig, rail))
            row: dict[str, Any] = {
                "reconfig": reconfig,
                "phase": phase.value,
                "rail": rail,
                "host": p["host"],
                "port": p["port"],
                "source": source,
                "peer": p.get("peer") or "",
                "t0_command_ns": t0,
                "t1_switch_done_ns": t1,
                "timed_out": source in timed_out.get(reconfig, ()),
                "impossible": "",
                "unresolved": "",
                "transport": transport,  # what carried the ping-pong whose first success is t5
                "t2_source": "",
                "link_setting": _setting_at(settings.get(source), phase.t_ns),
            }
            if t0 is None:
                rows.append(row)
                continue
            u = int(uncertainty.get(p["host"], 0))
            rx_key = _t2_key(index, source, t2_source)
            marks = _marks(index, p, t0, t1, end, threshold_dbm, u, rx_key)
            dom = rx_key == Kind.RX_POWER
            row.update(
                {
                    "t2_rx_power_ns": _at(marks["t2"]),
                    "t3_firmware_up_ns": _at(marks["t3"]),
                    "t4_carrier_up_ns": _at(marks["t4"]),
                    "t5_traffic_ns": _at(marks["t5"]),
                    "t2_resolution_ns": _res(marks["t2"], index.update_ns.get(source, 0) if dom else 0),
                    "t3_resolution_ns": _res(marks["t3"]),
                    "t4_resolution_ns": _res(marks["t4"]),
                    "t5_resolution_ns": _res(marks["t5"]),
                    "clock_uncertainty_ns": u,
                    "t2_source": ("dom" if dom else "power-meter") if marks["t2"] is not None else "",
                }
            )
            if marks["t2"] is not None and dom and source in index.update_ns:
                marks["t2"] = Mark(marks["t2"].t, marks["t2"].resolution + index.update_ns[source])
            impossible: list[str] = []
            unresolved: list[str] = []
            for column, a_name, b_name, cross in PHASES:
                a = marks.get(a_name) if "|" not in a_name else marks["t3"] or marks["t2"]
                b = marks.get(b_name)
                if a is None or b is None:
                    row[column] = None
                    continue
                duration = b.t - a.t
                row[column] = duration
                if duration >= 0:
                    continue
                # The true start is at most a.resolution earlier than its mark, the true end no later than
                # its mark; across clocks either may be off by the offset's uncertainty.
                longest = duration + a.resolution + (u if cross else 0)
                (impossible if longest < 0 else unresolved).append(column.removesuffix("_ns"))
            row["impossible"] = ",".join(impossible)
            row["unresolved"] = ",".join(unresolved)
            rows.append(row)
    frame = breakdown_frame(rows)
    if reference is not None:
        frame.attrs["link_setting_reference"] = reference
    return frame


def _settings_applied(control: list[Event]) -> dict[str, list[tuple[int, str]]]:
    """Per port source, (time, label) of each `link.settings` event that set it (a tune experiment's apply:
    the sweep's setting; its restore: none), in time order."""
    out: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for e in control:
        if e.kind == Kind.LINK_SETTINGS and e.meta.get("stage") in ("apply", "restore"):
            out[e.source].append((e.t_ns, str(e.value) if e.meta.get("stage") == "apply" else ""))
    return out


def _setting_at(applied: list[tuple[int, str]] | None, t_ns: int) -> str:
    """The sweep's setting a port held at t_ns ("" where none was applied)."""
    label = ""
    for t, value in applied or ():
        if t > t_ns:
            break
        label = value
    return label


def _marks(
    index: EventIndex,
    p: dict[str, Any],
    t0: int,
    t1: int | None,
    end: float,
    threshold_dbm: float,
    uncertainty_ns: int = 0,
    rx_key: str = Kind.RX_POWER,
) -> dict[str, Mark | None]:
    """Every mark of one port's row, searched from t0 to the next reconfiguration. The host's own marks
    are searched from as early as its clock's uncertainty allows (a host clock read slightly behind must
    not push its first sample out of the window); what then lands before t0 is a flag, not a fix."""
    source = p["source"]
    h0 = t0 - uncertainty_ns
    rx = index.series(source, rx_key)
    dark = rx.v < threshold_dbm
    t_dark = _find(rx, h0, end, dark)
    before = int(np.searchsorted(rx.t, h0, "left")) - 1
    if t_dark is not None:
        t2 = _find(rx, t_dark.t, end, ~dark)
    elif before >= 0 and dark[before]:
        # Dark since before the command (the baseline's first circuits, a port that had none): the first
        # sample that saw light, bracketed by the sample before it, as any other.
        t2 = _find(rx, h0, end, ~dark)
    else:
        # The dark gap fell between samples: the first sample at or above the threshold after the switch
        # acknowledged. Every sample since the command saw light (old or new), so the light came back
        # somewhere after t0: that is the mark's bracket.
        t2 = _find(rx, t1 - uncertainty_ns if t1 is not None else None, end, ~dark)
        if t2 is not None:
            t2 = Mark(t2.t, max(t2.t - t0, 0))
    fw = index.series(source, Kind.LINK_FIRMWARE)
    t3 = _find(fw, h0, end, fw.v == 1)
    carrier = index.series(source, Kind.CARRIER)
    t4 = _find(carrier, h0, end, carrier.v == 1)
    down = _find(carrier, h0, end, carrier.v == 0)
    lost = _find(index.series(source, Kind.TRAFFIC_LOST), h0, end)
    peer = p.get("peer")
    to_peer = index.series(source, traffic_ok_key(peer)) if peer else None
    if to_peer is not None and to_peer.t.size:
        # Traffic that reached the new peer: the old circuit can never be mistaken for it.
        t5 = _find(to_peer, t4.t if t4 is not None else h0, end, sampled=True)
    else:
        ok = index.series(source, Kind.TRAFFIC_OK)
        # Carrier not observed: traffic back after it was seen lost.
        after = t4 if t4 is not None else lost
        t5 = _find(ok, after.t, end, sampled=True) if after is not None else None
    exact = {"t0": Mark(t0, 0), "t1": Mark(t1, 0) if t1 is not None else None}
    return {**exact, "t2": t2, "t3": t3, "t4": t4, "t5": t5, "down": down, "lost": lost}


def _t2_key(index: EventIndex, source: str, t2_source: str) -> str:
    """The series t2 of this port is searched in: its DOM readings, or the meter's on its fiber."""
    if t2_source == "dom" or (t2_source == "auto" and not index.series(source, METER).t.size):
        return Kind.RX_POWER
    return METER


def _res(mark: Mark | None, extra: int = 0) -> int | None:
    return mark.resolution + extra if mark is not None else None
