"""The link-up breakdown: per reconfiguration and affected NIC port, from the event stream alone.

Marks (DESIGN.md): t0 `ocs.command` sent · t1 `ocs.complete` · t2 first Rx power ≥ threshold after the
light was seen lost (or after t1 if the loss fell between samples) · t3 `link.firmware` up · t4 `carrier`
up · t5 first `traffic.ok` after t4. Each mark is searched in the window from t0 to the next
reconfiguration. A missing mark is empty (pandas <NA>, an empty CSV cell), never 0.

Brackets: a sampled mark is the first sample that saw the new state; the sample before it (its event's
`meta.prev_ns`, or `meta.after_ns` from the carrier and link-state polls) did not, so the change
happened in (prev_ns, t]. `tN_resolution_ns` is that width (plus a module's DOM update interval for t2,
where it is longer than the sampling period; 0 for marks stamped as they happen). A host's marks also
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
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import msgspec
import numpy as np
import pandas as pd

from labctl.core.errors import InputError
from labctl.core.events import Event, Kind
from labctl.core.fileio import atomic_path

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
    "t2_resolution_ns",
    "t3_resolution_ns",
    "t4_resolution_ns",
    "t5_resolution_ns",
    "clock_uncertainty_ns",
    "impossible",
    "unresolved",
    "transport",
    "t2_source",
    "link_setting",
]
DURATIONS = COLUMNS[COLUMNS.index("switch_ns") : COLUMNS.index("traffic_lost_ns") + 1]
"""The phase durations (and the two down-side delays): switch_ns .. traffic_lost_ns."""
FLAG_COLUMNS = ("impossible", "unresolved")
INT_COLUMNS = [c for c in COLUMNS if c.endswith("_ns")] + ["reconfig", "rail"]
DEFAULT_THRESHOLD_DBM = -10.0
T2_SOURCES = ("dom", "power-meter", "auto")
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


def _ok_to(peer: str) -> str:
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
            keys.append((source, _ok_to(peer)))
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


class Mark(NamedTuple):
    """A mark's time and its bracket's width: the change happened in (t - resolution, t]."""

    t: int
    resolution: int


def _find(s: Series, start: int | None, end: float, mask: np.ndarray | None = None) -> Mark | None:
    """The first sample in [start, end) (where mask holds), with its bracket, or None."""
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
    """One row per measured reconfiguration × affected port; columns as in COLUMNS.

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
    frame = _frame(rows)
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
    to_peer = index.series(source, _ok_to(peer)) if peer else None
    if to_peer is not None and to_peer.t.size:
        # Traffic that reached the new peer: the old circuit can never be mistaken for it.
        t5 = _find(to_peer, t4.t if t4 is not None else h0, end)
    else:
        ok = index.series(source, Kind.TRAFFIC_OK)
        # Carrier not observed: traffic back after it was seen lost.
        after = t4 if t4 is not None else lost
        t5 = _find(ok, after.t, end) if after is not None else None
    exact = {"t0": Mark(t0, 0), "t1": Mark(t1, 0) if t1 is not None else None}
    return {**exact, "t2": t2, "t3": t3, "t4": t4, "t5": t5, "down": down, "lost": lost}


def _t2_key(index: EventIndex, source: str, t2_source: str) -> str:
    """The series t2 of this port is searched in: its DOM readings, or the meter's on its fiber."""
    if t2_source == "dom" or (t2_source == "auto" and not index.series(source, METER).t.size):
        return Kind.RX_POWER
    return METER


def _res(mark: Mark | None, extra: int = 0) -> int | None:
    return mark.resolution + extra if mark is not None else None


def _frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=COLUMNS)
    for col in INT_COLUMNS:
        frame[col] = pd.array([None if pd.isna(x) else int(x) for x in frame[col]], dtype="Int64")
    frame["timed_out"] = frame["timed_out"].fillna(False).astype(bool)
    for col in ("phase", "host", "port", "source", "peer", "transport"):
        frame[col] = frame[col].astype("string")
    frame["t2_source"] = frame["t2_source"].astype("string").fillna("")
    frame["link_setting"] = frame["link_setting"].astype("string").fillna("")
    for col in FLAG_COLUMNS:
        frame[col] = frame[col].fillna("").astype("string")
    return frame


def read_breakdown_csv(path: Path) -> pd.DataFrame:
    frame = pd.read_csv(
        path,
        dtype={c: "Int64" for c in INT_COLUMNS if c != "timed_out"}
        | {"phase": "string"}
        | dict.fromkeys(FLAG_COLUMNS, "string"),
    )
    frame["timed_out"] = frame["timed_out"].astype(bool)
    if "link_setting" in frame:
        frame["link_setting"] = frame["link_setting"].astype("string").fillna("")
    for col in FLAG_COLUMNS:  # breakdowns written before these columns existed have none flagged
        frame[col] = (
            frame[col].fillna("") if col in frame else pd.Series("", index=frame.index, dtype="string")
        )
    return frame


def write_breakdown(frame: pd.DataFrame, run_dir: Path) -> None:
    with atomic_path(run_dir / "breakdown.csv") as tmp:
        frame.to_csv(tmp, index=False)
    with atomic_path(run_dir / "breakdown.parquet") as tmp:
        frame.to_parquet(tmp, index=False)


STAT_NAMES = ("n", "min", "p5", "median", "p95", "max")

UNITS: dict[str, str] = {
    "switch_ns": "switch command",
    "optical_ns": "port",
    "firmware_ns": "port",
    "carrier_ns": "port",
    "transport_ns": "circuit end",
    "total_ns": "circuit end",
    "carrier_down_ns": "port",
    "traffic_lost_ns": "port",
}
"""What one value of each phase is: a switch command moves all its ports at once, the ports of every rail
it carries (one switching time per command, however many ports or rails: decision 0054); optical,
firmware and carrier are each port's own; transport and total are per end of a new circuit (a port going
dark has none)."""

BOOTSTRAP_RESAMPLES = 2000
CI_LEVEL = 0.95
CLUSTER = "reconfiguration"
"""What the median's bootstrap resamples: the ports of one reconfiguration move together (one command,
one switch, one host's scheduling), so they are one draw, not many (decision 0042)."""
POOLED_CLUSTER = "run × reconfiguration"
"""The same over several runs: reconfiguration n of one run and of another are different draws."""


def cluster_keys(rows: pd.DataFrame) -> list[str]:
    """The columns naming a row's cluster: its reconfiguration, within its run where rows are pooled."""
    return ["run_id", "reconfig"] if "run_id" in rows else ["reconfig"]


def cluster_name(rows: pd.DataFrame) -> str:
    return POOLED_CLUSTER if "run_id" in rows else CLUSTER


def _keep(rows: pd.DataFrame, column: str) -> pd.Series:
    """The rows that give one value of a phase over its own unit, flagged rows left out."""
    name = column.removesuffix("_ns")
    keep = rows[column].notna() & ~_flagged_for(rows, name)
    if UNITS[column] == "switch command":
        # a command is its (t0, t1): rails it carried together share them, separate commands never do
        # (rows without the marks, as a hand-made frame may come: one command per rail, as before 0054)
        marks = ["t0_command_ns", "t1_switch_done_ns"] if "t0_command_ns" in rows else ["rail"]
        command = ["reconfig", *marks]
        keep &= ~rows.duplicated(["run_id", *command] if "run_id" in rows else command)
    elif UNITS[column] == "circuit end":
        keep &= rows["peer"].fillna("") != ""
    return keep


def phase_values(rows: pd.DataFrame, column: str) -> np.ndarray:
    """The values of one phase over its own unit, flagged rows left out (integer ns)."""
    values: np.ndarray = rows.loc[_keep(rows, column), column].to_numpy(dtype=np.int64)
    return values


def phase_clustered(rows: pd.DataFrame, column: str) -> tuple[np.ndarray, np.ndarray]:
    """phase_values and, aligned with them, each value's cluster (0..k-1: its reconfiguration, within its
    run where rows carry `run_id`)."""
    keep = _keep(rows, column)
    kept = rows.loc[keep]
    keys = cluster_keys(rows)
    clusters = kept.groupby(keys, sort=True, dropna=False).ngroup().to_numpy(dtype=np.int64)
    return kept[column].to_numpy(dtype=np.int64), clusters


def _has(rows: pd.DataFrame, flag: str, phase: str) -> pd.Series:
    """Rows whose flag column (a comma-separated list of phase names) names `phase`."""
    if flag not in rows:
        return pd.Series(False, index=rows.index)
    return rows[flag].fillna("").str.split(",").apply(lambda names: phase in names).astype(bool)


def _flagged_for(rows: pd.DataFrame, phase: str) -> pd.Series:
    return _has(rows, "impossible", phase) | _has(rows, "unresolved", phase)


def bootstrap_medians(values: np.ndarray, *, seed: int = 0, clusters: np.ndarray | None = None) -> np.ndarray:
    """BOOTSTRAP_RESAMPLES medians of resamples of `values` (a fixed seed: the same data gives the same
    interval). Without `clusters` each value is drawn on its own, with replacement; with them (one label
    per value), as many whole clusters as there are are drawn with replacement and each resample's median
    is that of every value in the clusters drawn (a cluster drawn twice counts twice)."""
    if clusters is not None:
        return _cluster_bootstrap_medians(values, clusters, seed)
    rng = np.random.default_rng(seed)
    medians = np.empty(BOOTSTRAP_RESAMPLES)
    chunk = max(1, 4_000_000 // max(values.size, 1))  # bound the resample matrix's memory
    for i in range(0, BOOTSTRAP_RESAMPLES, chunk):
        k = min(chunk, BOOTSTRAP_RESAMPLES - i)
        medians[i : i + k] = np.median(rng.choice(values, (k, values.size)), axis=1)
    return medians


def _cluster_bootstrap_medians(values: np.ndarray, clusters: np.ndarray, seed: int) -> np.ndarray:
    """The cluster bootstrap without building the resampled arrays: a resample is a count per cluster, so
    its median is a weighted median of the values sorted once (weight: how often the value's cluster was
    drawn), the same number np.median gives for the values written out."""
    if values.shape != clusters.shape:
        raise ValueError(f"{values.size} values but {clusters.size} cluster labels")
    _, labels = np.unique(clusters, return_inverse=True)
    k = int(labels.max()) + 1 if labels.size else 0
    if k == 0:
        return np.full(BOOTSTRAP_RESAMPLES, np.nan)
    rng = np.random.default_rng(seed)
    # All draws at once (BOOTSTRAP_RESAMPLES × k cluster indices): chunking below cannot change them.
    drawn = rng.integers(0, k, (BOOTSTRAP_RESAMPLES, k))
    offsets = np.arange(BOOTSTRAP_RESAMPLES)[:, None] * k
    counts = np.bincount((drawn + offsets).ravel(), minlength=BOOTSTRAP_RESAMPLES * k)
    counts = counts.reshape(BOOTSTRAP_RESAMPLES, k)
    order = np.argsort(values, kind="stable")
    ranked, ranked_labels = values[order].astype(np.float64), labels[order]
    medians = np.empty(BOOTSTRAP_RESAMPLES)
    chunk = max(1, 4_000_000 // values.size)  # bound the (resamples × values) matrices' memory
    for i in range(0, BOOTSTRAP_RESAMPLES, chunk):
        cum = np.cumsum(counts[i : i + chunk][:, ranked_labels], axis=1)  # resampled values ≤ each
        total = cum[:, -1:]
        # The two middle positions of each resample written out sorted (equal when its size is odd), and
        # the value at each: the first whose cumulative count passes the position.
        lo = (cum <= (total - 1) // 2).sum(axis=1)
        hi = (cum <= total // 2).sum(axis=1)
        medians[i : i + chunk] = (ranked[lo] + ranked[hi]) / 2
    return medians


def percentile_interval(samples: np.ndarray) -> tuple[int, int]:
    tail = (1 - CI_LEVEL) / 2 * 100
    lo, hi = np.percentile(samples, [tail, 100 - tail])
    return round(float(lo)), round(float(hi))


def median_ci(
    values: np.ndarray, *, seed: int = 0, clusters: np.ndarray | None = None
) -> tuple[int, int] | None:
    """A percentile-bootstrap confidence interval (CI_LEVEL) for the median: resampling whole clusters
    where `clusters` labels each value (None for fewer than two clusters: one reconfiguration says nothing
    about how the next would differ), else values independently (None for fewer than two values)."""
    if values.size < 2 or (clusters is not None and np.unique(clusters).size < 2):
        return None
    return percentile_interval(bootstrap_medians(values, seed=seed, clusters=clusters))


MedianCi = Callable[[np.ndarray, "np.ndarray | None"], "tuple[int, int] | None"]
"""How a median's CI is made from (values, clusters): `median_ci` here, or the pooled-runs bootstrap of
labctl.analysis.compare (same draws, cheaper over many runs)."""


def describe(
    values: np.ndarray,
    unit: str,
    *,
    clusters: np.ndarray | None = None,
    cluster: str = CLUSTER,
    ci: MedianCi | None = None,
) -> dict[str, Any]:
    """n, min/p5/median/p95/max and the median's CI of one phase's values (integer ns), and what the CI
    resampled: `cluster` (clusters labelling each value) and how many, else the values themselves."""
    stats: dict[str, Any] = {"unit": unit, "n": int(values.size), "count": int(values.size)}
    resampling = {
        "median_ci_resampling": cluster if clusters is not None else unit,
        "median_ci_clusters": int(np.unique(clusters).size) if clusters is not None else int(values.size),
    }
    if values.size == 0:
        return stats | dict.fromkeys(("min", "p5", "median", "p95", "max", "median_ci")) | resampling
    p5, median, p95 = np.percentile(values, [5, 50, 95], method="linear")
    return (
        stats
        | {
            "min": int(values.min()),
            "p5": round(float(p5)),
            "median": round(float(median)),
            "p95": round(float(p95)),
            "max": int(values.max()),
            "median_ci": (ci(values, clusters) if ci is not None else median_ci(values, clusters=clusters)),
        }
        | resampling
    )


def ci_text(cluster: str = CLUSTER) -> str:
    """summary.json's `ci`: how every phase's median_ci was made."""
    what = "reconfigurations" if cluster == CLUSTER else "reconfigurations of each run"
    return (
        f"{CI_LEVEL:.0%} percentile bootstrap of the median, resampling {what} (clusters), "
        f"{BOOTSTRAP_RESAMPLES} resamples"
    )


def summarize(frame: pd.DataFrame, *, exclude_setup: bool = True) -> dict[str, Any]:
    """Per phase, over its own unit (UNITS): n, min/p5/median/p95/max (integer ns), a bootstrap CI of the
    median resampling reconfigurations (with how many there were), and how many rows were left out as
    impossible or unresolved."""
    rows = frame[frame["reconfig"] > 0] if exclude_setup else frame
    cluster = cluster_name(rows)
    phases: dict[str, dict[str, Any]] = {}
    for col in DURATIONS:
        name = col.removesuffix("_ns")
        values, clusters = phase_clustered(rows, col)
        phases[name] = describe(values, UNITS[col], clusters=clusters, cluster=cluster)
        for flag in FLAG_COLUMNS:
            phases[name][flag] = int(_has(rows, flag, name).sum())
    flagged = pd.Series(False, index=rows.index)
    for flag in FLAG_COLUMNS:
        if flag in rows:
            flagged |= rows[flag].fillna("") != ""
    return {
        "unit": "ns",
        "ci": ci_text(cluster),
        "reconfigurations": int(rows["reconfig"].nunique()),
        "rows": len(rows),
        "timed_out": int(rows["timed_out"].sum()),
        "incomplete": int(rows["t5_traffic_ns"].isna().sum()),
        "flagged_rows": int(flagged.sum()),
        "resolution": _resolution(rows),
        "phases": phases,
        "t2_source": _t2_sources(rows),
    }


def _t2_sources(rows: pd.DataFrame) -> dict[str, int]:
    """How many rows took their t2 from each source (dom, power-meter)."""
    if "t2_source" not in rows:
        return {}
    counts = rows["t2_source"].fillna("").value_counts()
    return {str(name): int(n) for name, n in counts.items() if name}


def _resolution(rows: pd.DataFrame) -> dict[str, Any]:
    """The median and worst bracket of each sampled mark (ns), over the rows that have it."""
    out: dict[str, Any] = {}
    for col in ("t2_resolution_ns", "t3_resolution_ns", "t4_resolution_ns", "t5_resolution_ns"):
        if col not in rows:
            continue
        values = rows[col].dropna().to_numpy(dtype=np.int64)
        if values.size:
            mark = col.removesuffix("_resolution_ns")
            out[mark] = {"n": int(values.size), "median": int(np.median(values)), "max": int(values.max())}
    return out


def clock_uncertainties(offsets: Mapping[str, Any]) -> dict[str, int]:
    """Per host, the uncertainty of the clock offset its stamps were moved by (run.json's `clock_offsets`):
    the run's clock model states it (`source` says which: shared-clock, exchange, a daemon; decision 0040);
    runs recorded before it give the largest uncertainty of every re-measurement in their history."""
    out = {}
    for host, estimate in offsets.items():
        if "source" in estimate:
            out[host] = int(estimate.get("uncertainty_ns", 0))
            continue
        history = estimate.get("history") or [estimate]
        out[host] = max(int(e.get("uncertainty_ns", 0)) for e in history)
    return out


# Phases that subtract a controller mark (t0: the command) from one stamped on a host (an agent's clock).
CROSS_CLOCK = ("optical_ns", "total_ns", "carrier_down_ns", "traffic_lost_ns")


def clock_caveats(frame: pd.DataFrame, offsets: dict[str, Any]) -> list[str]:
    """Where a host's clock-offset uncertainty is larger than the median of a phase that crosses from the
    controller's clock to that host's: that phase is not resolved there (one line per host and phase)."""
    rows = frame[frame["reconfig"] > 0]
    out = []
    for host, uncertainty in sorted(clock_uncertainties(offsets).items()):
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
