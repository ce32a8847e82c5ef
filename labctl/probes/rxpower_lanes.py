"""The Rx power poller's per-lane state: every reported lane of every polled port as rows of arrays (what
the last sample and report were, the dense window, the module update estimates), and how each row is read
(`labctl.probes.rxpower` ticks over it)."""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from itertools import repeat

import numpy as np

from labctl.probes.base import RxPowerBatch
from labctl.probes.rxpower_ports import PolledModule

UPDATE_MIN_CHANGES = 20  # value changes a module must show before its update interval is estimated


LANE_FIELDS = (
    "live", "reported", "reported_t", "last_dbm", "last_mw", "sampled_t", "window_until", "seen_dark",
    "force", "moving", "dark_seen", "steady_ns", "value_changes", "heartbeat_ns",
)  # fmt: skip
"""The per-lane arrays of `Lanes` that a tick of a few lanes works on as lists (`_LaneLists`)."""


class _LaneField:
    """One of `Lanes`' per-lane arrays (LANE_FIELDS). While a lane-by-lane tick holds them as lists
    between its ticks (`Lanes.lists`), getting or setting the attribute writes the lists back first
    (`Lanes.flush`): whatever reads or writes the array (the array tick, windows, switch notices, stats,
    tests) finds it current, and the next lane-by-lane tick takes the lists again. (A reference to the
    array kept across a lane-by-lane tick would miss it: take the attribute each time.)"""

    def __set_name__(self, owner: type, name: str) -> None:
        self.key = f"_{name}"

    def __get__(self, lanes: Lanes, owner: type | None = None) -> np.ndarray:
        if lanes.lists is not None:
            lanes.flush()
        array: np.ndarray = lanes.__dict__[self.key]
        return array

    def __set__(self, lanes: Lanes, array: np.ndarray) -> None:
        if lanes.lists is not None:
            lanes.flush()
        lanes.__dict__[self.key] = array


class _LaneLists:
    """`Lanes`' per-lane arrays (LANE_FIELDS) as Python lists: a tick of a few lanes reads and writes an
    element of a list per lane where a numpy element read or write costs several times more, and keeps
    them from tick to tick instead of a `tolist()` and a write back per array per tick."""

    __slots__ = LANE_FIELDS
    live: list[bool]
    reported: list[bool]
    reported_t: list[int]
    last_dbm: list[float]
    last_mw: list[float]
    sampled_t: list[int]
    window_until: list[int]
    seen_dark: list[bool]
    force: list[bool]
    moving: list[bool]
    dark_seen: list[bool]
    steady_ns: list[int]
    value_changes: list[int]
    heartbeat_ns: list[int]

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        for name in LANE_FIELDS:
            setattr(self, name, arrays[f"_{name}"].tolist())


class Lanes:
    """Every reported lane of every polled port as rows of arrays (what the last sample and report were,
    the dense window), and how each row is read: in a model's batch, or by its own module read."""

    live = _LaneField()
    reported = _LaneField()
    reported_t = _LaneField()
    last_dbm = _LaneField()
    last_mw = _LaneField()
    sampled_t = _LaneField()
    window_until = _LaneField()
    seen_dark = _LaneField()
    force = _LaneField()  # report the next sample whatever it shows
    moving = _LaneField()  # a reconfiguration is moving this lane's light (open_window)
    dark_seen = _LaneField()  # ...and a sample has seen it below the threshold since
    steady_ns = _LaneField()
    value_changes = _LaneField()
    heartbeat_ns = _LaneField()

    def __init__(self, polled: Sequence[PolledModule]) -> None:
        self.lists: _LaneLists | None = None
        """The per-lane arrays as lists, the current copy while ticks of a few lanes run one after another
        (`take_lists`); None: the arrays are."""
        self.owner: list[tuple[PolledModule, int]] = [(p, i) for p in polled for i in range(len(p.lanes))]
        self.n = n = len(self.owner)
        self.by_port: dict[int, np.ndarray] = {}
        self.by_source: dict[str, np.ndarray] = {}
        k = 0
        for p in polled:
            self.by_port[id(p)] = self.by_source[p.port.source] = np.arange(k, k + len(p.lanes))
            k += len(p.lanes)
        self.one_lane: dict[str, int] | None = None
        """Each port's row, where every port reports one lane (`rows_of` without an array a port)."""
        if all(len(p.lanes) == 1 for p in polled):
            self.one_lane = {source: int(rows[0]) for source, rows in self.by_source.items()}
        groups: dict[int, tuple[RxPowerBatch, list[int], list[int]]] = {}
        self.unbatched = [p for p in polled if not p.batched]
        for p in polled:
            if p.batched and p.port.batch is not None:
                batch, slot = p.port.batch
                entry = groups.setdefault(id(batch), (batch, [], []))
                entry[1].append(slot)
                entry[2].append(int(self.by_port[id(p)][0]))
        self.batches = [
            (batch, np.array(slots, np.int64), np.array(at, np.int64)) for batch, slots, at in groups.values()
        ]
        self.batch_rows = [at for _, _, at in groups.values()]
        """Each batch's lane rows as a list (`RxPowerProbe._tick_lanes`)."""
        self.one_batch = self.batch_rows == [list(range(n))]
        """One batch reads every lane, in row order (a model's ports, nothing else)."""
        self.live = np.ones(n, bool)
        self.reported = np.zeros(n, bool)
        self.reported_t = np.zeros(n, np.int64)
        self.last_dbm = np.full(n, -math.inf)
        self.last_mw = np.full(n, -1.0)
        self.sampled_t = np.zeros(n, np.int64)
        self.window_until = np.zeros(n, np.int64)
        self.seen_dark = np.zeros(n, bool)
        self.force = np.zeros(n, bool)
        self.moving = np.zeros(n, bool)
        # False only where the array is known to hold no True (no window open: window_until all 0; every
        # lane reported once): what a tick can skip. Only `open_window` and `switched` set them.
        self.any_force = False
        self.any_window = False
        self.any_moving = False
        self.all_reported = False
        self.dark_seen = np.zeros(n, bool)
        self.steady_ns = np.zeros(n, np.int64)
        self.value_changes = np.zeros(n, np.int64)
        self.update_reported = np.zeros(n)
        self.update_checked_t = 0
        self.heartbeat_ns = np.full(n, 100_000_000, np.int64)

    def take_lists(self) -> _LaneLists:
        """The per-lane state as lists, current from now on until an array is got or set (`flush`)."""
        if self.lists is None:
            self.lists = _LaneLists(self.__dict__)
        return self.lists

    def flush(self) -> None:
        """The arrays current again: the lists written back and let go."""
        lists, self.lists = self.lists, None
        if lists is not None:
            for name in LANE_FIELDS:
                self.__dict__[f"_{name}"][:] = getattr(lists, name)

    def rows_of(self, sources: Collection[str] | None) -> np.ndarray:
        """The lane rows of these port sources (None: every row)."""
        if sources is None:
            return np.arange(self.n)
        if self.one_lane is not None:  # a lane a port (a model's modules): one look-up a port, in C
            rows = np.fromiter(map(self.one_lane.get, sources, repeat(-1)), np.int64, len(sources))
            return rows[rows >= 0]
        found = [self.by_source[s] for s in sources if s in self.by_source]
        return np.concatenate(found) if found else np.zeros(0, np.int64)

    def open_window(self, sources: Collection[str] | None, until_ns: int, *, dense: bool = True) -> None:
        at = self.rows_of(sources)
        self.moving[at] = True
        self.dark_seen[at] = False
        self.any_moving = True
        if dense:
            self.window_until[at] = until_ns
            self.seen_dark[at] = False
            self.any_window = True

    def switched(self, sources: Collection[str], *, reported_back_above: float | None = None) -> None:
        """Force the next sample of the moved lanes whose dark gap no sample saw (it fell between two):
        for the others, the light coming back is a change and gets reported anyway, unless it was reported
        already (its last report at or above `reported_back_above`, when given): those again too."""
        at = self.rows_of(sources)
        self.force[at] |= ~self.dark_seen[at]
        if reported_back_above is not None:
            self.force[at] |= self.last_dbm[at] >= reported_back_above
        self.any_force = True
        self.moving[at] = False
        self.any_moving = bool(self.moving.any())
        self.window_until[at] = 0
        self.seen_dark[at] = False

    def update_estimates(self) -> np.ndarray:
        """Each lane's module update interval (ns): steady lit time per value change; 0 where too few
        changes were seen to say (a constant value, or not lit long enough)."""
        enough = self.value_changes >= UPDATE_MIN_CHANGES
        return np.where(enough, self.steady_ns / np.maximum(self.value_changes, 1), 0.0)
