"""The link-up breakdown: per reconfiguration and affected NIC port, from the event stream alone.

Marks (DESIGN.md): t0 `ocs.command` sent · t1 `ocs.complete` · t2 first Rx power ≥ threshold after the
light was seen lost (or after t1 if the loss fell between samples) · t3 `link.firmware` up · t4 `carrier`
up · t5 first `traffic.ok` after t4. Each mark is searched in the window from t0 to the next
reconfiguration. A missing mark is empty (pandas <NA>, an empty CSV cell), never 0.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from labctl.errors import InputError
from labctl.events import Event, Kind
from labctl.fileio import atomic_path

COLUMNS = [
    "reconfig",
    "phase",
    "rail",
    "host",
    "port",
    "t0_command_ns",
    "t1_switch_done_ns",
    "t2_rx_power_ns",
    "t3_firmware_up_ns",
    "t4_carrier_up_ns",
    "t5_traffic_ns",
    "switch_ns",
    "optical_ns",
    "firmware_ns",
    "carrier_ns",
    "transport_ns",
    "total_ns",
    "carrier_down_ns",
    "traffic_lost_ns",
    "timed_out",
    # added after the first release; append only
    "source",
    "peer",
]
DURATIONS = [c for c in COLUMNS if c.endswith("_ns") and not re.match(r"t\d_", c)]
"""The phase durations (and the two down-side delays): every *_ns column that is not a mark t0..t5."""
INT_COLUMNS = [c for c in COLUMNS if c.endswith("_ns")] + ["reconfig", "rail"]
DEFAULT_THRESHOLD_DBM = -10.0
CONTROL_KINDS = frozenset({Kind.PHASE, Kind.OCS_COMMAND, Kind.OCS_COMPLETE, Kind.RUN_TIMEOUT, Kind.RUN_START})
SIGNAL_KINDS = (Kind.RX_POWER, Kind.LINK_FIRMWARE, Kind.CARRIER, Kind.TRAFFIC_OK, Kind.TRAFFIC_LOST)


class _LiteMeta(msgspec.Struct, frozen=True):
    peer: str | None = None


class _Lite(msgspec.Struct):
    """The fields the breakdown needs from every event; decoding skips the rest of meta cheaply."""

    t_ns: int
    source: str
    kind: str
    value: int | float | str | None = None
    meta: _LiteMeta = _LiteMeta()


def _ok_to(peer: str) -> str:
    """The index key of traffic.ok events that reached `peer` (traffic probes name their peer in meta)."""
    return f"traffic.ok>{peer}"


@dataclass
class Series:
    t: np.ndarray
    v: np.ndarray


class EventIndex:
    """Events grouped by (source, kind) into time-sorted arrays, plus the few control events in full."""

    def __init__(self) -> None:
        self._t: dict[tuple[str, str], list[int]] = defaultdict(list)
        self._v: dict[tuple[str, str], list[float]] = defaultdict(list)
        self.control: list[Event] = []
        self._series: dict[tuple[str, str], Series] = {}

    @property
    def last_ns(self) -> int:
        """The latest time stamped on any indexed event (0 if none)."""
        return max([max(ts) for ts in self._t.values() if ts] + [e.t_ns for e in self.control], default=0)

    def add(self, t_ns: int, source: str, kind: str, value: Any, peer: str | None = None) -> None:
        v = -math.inf if value is None else float(value) if not isinstance(value, str) else 0.0
        keys = [(source, kind)]
        if kind == Kind.TRAFFIC_OK and peer:
            keys.append((source, _ok_to(peer)))
        for key in keys:
            self._t[key].append(t_ns)
            self._v[key].append(v)

    @classmethod
    def from_events(cls, events: Iterable[Event]) -> EventIndex:
        index = cls()
        for e in events:
            if e.kind in CONTROL_KINDS:
                index.control.append(e)
            elif e.kind in SIGNAL_KINDS:
                index.add(e.t_ns, e.source, e.kind, e.value, e.meta.get("peer"))
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
                index.add(e.t_ns, e.source, e.kind, e.value, e.meta.peer)
        return index

    def series(self, source: str, kind: str) -> Series:
        key = (source, kind)
        s = self._series.get(key)
        if s is None:
            t = np.asarray(self._t.get(key, ()), dtype=np.int64)
            v = np.asarray(self._v.get(key, ()), dtype=np.float64)
            order = np.argsort(t, kind="stable")
            s = self._series[key] = Series(t[order], v[order])
        return s


def _first(s: Series, start: int, end: float, mask: np.ndarray | None = None) -> int | None:
    """Time of the first sample in [start, end) (where mask holds), or None."""
    i = int(np.searchsorted(s.t, start, "left"))
    j = int(np.searchsorted(s.t, end, "left")) if end != math.inf else len(s.t)
    if i >= j:
        return None
    if mask is None:
        return int(s.t[i])
    hits = np.flatnonzero(mask[i:j])
    return int(s.t[i + hits[0]]) if hits.size else None


def _sub(a: int | None, b: int | None) -> int | None:
    return a - b if a is not None and b is not None else None


def compute_breakdown(
    events: Iterable[Event] | EventIndex, threshold_dbm: float | None = None
) -> pd.DataFrame:
    """One row per measured reconfiguration × affected port; columns as in COLUMNS."""
    index = events if isinstance(events, EventIndex) else EventIndex.from_events(events)
    control = sorted(index.control, key=lambda e: (e.t_ns, e.seq))
    if threshold_dbm is None:
        start = next((e for e in control if e.kind == Kind.RUN_START), None)
        threshold_dbm = (
            float(start.meta.get("rx_power_threshold_dbm", DEFAULT_THRESHOLD_DBM))
            if start
            else DEFAULT_THRESHOLD_DBM
        )
    phases = [e for e in control if e.kind == Kind.PHASE]
    commands: dict[tuple[int | None, Any], int] = {}
    completes: dict[tuple[int | None, Any], int] = {}
    timed_out: dict[int | None, set[str]] = defaultdict(set)
    for e in control:
        key = (e.reconfig, e.meta.get("rail"))
        if e.kind == Kind.OCS_COMMAND:
            commands.setdefault(key, e.t_ns)
        elif e.kind == Kind.OCS_COMPLETE:
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
            }
            if t0 is None:
                rows.append(row)
                continue
            rx = index.series(source, Kind.RX_POWER)
            dark = rx.v < threshold_dbm
            t_dark = _first(rx, t0, end, dark)
            if t_dark is not None:
                t2 = _first(rx, t_dark, end, ~dark)
            else:
                t2 = _first(rx, t1, end, ~dark) if t1 is not None else None
            fw = index.series(source, Kind.LINK_FIRMWARE)
            t3 = _first(fw, t0, end, fw.v == 1)
            carrier = index.series(source, Kind.CARRIER)
            t4 = _first(carrier, t0, end, carrier.v == 1)
            t_carrier_down = _first(carrier, t0, end, carrier.v == 0)
            lost = index.series(source, Kind.TRAFFIC_LOST)
            t_lost = _first(lost, t0, end)
            peer = p.get("peer")
            to_peer = index.series(source, _ok_to(peer)) if peer else None
            if to_peer is not None and to_peer.t.size:
                # Traffic that reached the new peer: the old circuit can never be mistaken for it.
                t5 = _first(to_peer, t4 if t4 is not None else t0, end)
            else:
                ok = index.series(source, Kind.TRAFFIC_OK)
                if t4 is not None:
                    t5 = _first(ok, t4, end)
                else:  # carrier not observed: traffic back after it was seen lost
                    t5 = _first(ok, t_lost, end) if t_lost is not None else None
            row.update(
                {
                    "t2_rx_power_ns": t2,
                    "t3_firmware_up_ns": t3,
                    "t4_carrier_up_ns": t4,
                    "t5_traffic_ns": t5,
                    "switch_ns": _sub(t1, t0),
                    "optical_ns": _sub(t2, t0),
                    "firmware_ns": _sub(t3, t2),
                    "carrier_ns": _sub(t4, t3 if t3 is not None else t2),
                    "transport_ns": _sub(t5, t4),
                    "total_ns": _sub(t5, t0),
                    "carrier_down_ns": _sub(t_carrier_down, t0),
                    "traffic_lost_ns": _sub(t_lost, t0),
                }
            )
            rows.append(row)
    return _frame(rows)


def _frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=COLUMNS)
    for col in INT_COLUMNS:
        frame[col] = pd.array([None if pd.isna(x) else int(x) for x in frame[col]], dtype="Int64")
    frame["timed_out"] = frame["timed_out"].fillna(False).astype(bool)
    for col in ("phase", "host", "port", "source", "peer"):
        frame[col] = frame[col].astype("string")
    return frame


def read_breakdown_csv(path: Path) -> pd.DataFrame:
    frame = pd.read_csv(
        path, dtype={c: "Int64" for c in INT_COLUMNS if c != "timed_out"} | {"phase": "string"}
    )
    frame["timed_out"] = frame["timed_out"].astype(bool)
    return frame


def write_breakdown(frame: pd.DataFrame, run_dir: Path) -> None:
    with atomic_path(run_dir / "breakdown.csv") as tmp:
        frame.to_csv(tmp, index=False)
    with atomic_path(run_dir / "breakdown.parquet") as tmp:
        frame.to_parquet(tmp, index=False)


STAT_NAMES = ("count", "min", "p5", "median", "p95", "max")


def summarize(frame: pd.DataFrame, *, exclude_setup: bool = True) -> dict[str, Any]:
    """min/p5/median/p95/max per phase duration (integer ns) over the measured reconfigurations."""
    rows = frame[frame["reconfig"] > 0] if exclude_setup else frame
    phases: dict[str, dict[str, int | None]] = {}
    for col in DURATIONS:
        values = rows[col].dropna().to_numpy(dtype=np.int64)
        name = col.removesuffix("_ns")
        if values.size == 0:
            phases[name] = {"count": 0, "min": None, "p5": None, "median": None, "p95": None, "max": None}
            continue
        p5, median, p95 = np.percentile(values, [5, 50, 95], method="linear")
        phases[name] = {
            "count": int(values.size),
            "min": int(values.min()),
            "p5": round(float(p5)),
            "median": round(float(median)),
            "p95": round(float(p95)),
            "max": int(values.max()),
        }
    return {
        "unit": "ns",
        "reconfigurations": int(rows["reconfig"].nunique()),
        "rows": len(rows),
        "timed_out": int(rows["timed_out"].sum()),
        "incomplete": int(rows["t5_traffic_ns"].isna().sum()),
        "phases": phases,
    }


# Phases that subtract a controller mark (t0: the command) from one stamped on a host (an agent's clock).
CROSS_CLOCK = ("optical_ns", "total_ns", "carrier_down_ns", "traffic_lost_ns")


def clock_caveats(frame: pd.DataFrame, offsets: dict[str, Any]) -> list[str]:
    """Where a host's clock-offset uncertainty is larger than the median of a phase that crosses from the
    controller's clock to that host's: that phase is not resolved there (one line per host and phase)."""
    rows = frame[frame["reconfig"] > 0]
    out = []
    for host, estimate in sorted(offsets.items()):
        history = estimate.get("history") or [estimate]
        uncertainty = max(int(e.get("uncertainty_ns", 0)) for e in history)
        mine = rows[rows["host"] == host]
        for col in CROSS_CLOCK:
            values = mine[col].dropna().to_numpy(dtype=np.int64)
            if values.size and uncertainty > (median := float(np.median(values))):
                phase = col.removesuffix("_ns")
                out.append(
                    f"{host}: clock offset uncertainty ±{uncertainty / 1e6:.3f} ms exceeds its {phase} phase "
                    f"(median {median / 1e6:.3f} ms over {values.size} port rows): not resolved there"
                )
    return out
