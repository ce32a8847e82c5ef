"""What the timeline and the headline read of a port's signals: its Rx-power trace held from sample to
sample, when its firmware link, carrier and traffic were up, and the run's Rx-power threshold."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from labctl.analysis.breakdown import DEFAULT_THRESHOLD_DBM
from labctl.analysis.event_index import EventIndex, Series
from labctl.analysis.plot_style import LANES
from labctl.core.events import Kind


def _up_intervals(index: EventIndex, source: str, kind: str, start: int, end: int) -> list[tuple[int, int]]:
    """Intervals in [start, end) where a 0/1 signal (or traffic ok/lost) is up."""
    if kind == "traffic":
        ok, lost = index.series(source, Kind.TRAFFIC_OK), index.series(source, Kind.TRAFFIC_LOST)
        t = np.concatenate([ok.t, lost.t])
        v = np.concatenate([np.ones(ok.t.size), np.zeros(lost.t.size)])
        order = np.argsort(t, kind="stable")
        t, v = t[order], v[order]
    else:
        s = index.series(source, kind)
        t, v = s.t, s.v
    state = 0.0
    before = np.flatnonzero(t < start)
    if before.size:
        state = v[before[-1]]
    out, up_since = [], (start if state == 1 else None)
    for ti, vi in zip(t[(t >= start) & (t < end)], v[(t >= start) & (t < end)], strict=True):
        if vi == 1 and up_since is None:
            up_since = int(ti)
        elif vi != 1 and up_since is not None:
            out.append((up_since, int(ti)))
            up_since = None
    if up_since is not None:
        out.append((up_since, end))
    return out


def _observed(index: EventIndex, source: str, kind: str) -> bool:
    """Whether the run recorded this signal for this port at all (firmware link state is not observable on
    every lab): an unobserved lane stays empty rather than being drawn as down."""
    if kind == "traffic":
        return bool(
            index.series(source, Kind.TRAFFIC_OK).t.size or index.series(source, Kind.TRAFFIC_LOST).t.size
        )
    return bool(index.series(source, kind).t.size)


def held_trace(s: Series, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
    """Samples in [start, end) with the value held from before `start` and carried to `end`: probes report
    changes and heartbeats, so the last report holds until the next one."""
    i = max(int(np.searchsorted(s.t, start, "left")) - 1, 0)
    j = int(np.searchsorted(s.t, end, "left"))
    t, v = s.t[i:j].copy(), s.v[i:j].copy()
    if t.size == 0:
        return t, v
    t[0] = max(t[0], start)
    return np.append(t, end), np.append(v, v[-1])


def threshold_of(index: EventIndex) -> float:
    """The Rx-power threshold the run used, as compute_breakdown reads it: run.start's meta, else -10 dBm."""
    start = next((e for e in index.control if e.kind == Kind.RUN_START), None)
    if start is None:
        return DEFAULT_THRESHOLD_DBM
    return float(start.meta.get("rx_power_threshold_dbm", DEFAULT_THRESHOLD_DBM))


def lane_spans(
    index: EventIndex,
    rows: pd.DataFrame,
    sources: list[str],
    rails: list[Any],
    per_rail: bool,
    start: int,
    end: int,
) -> list[list[tuple[np.ndarray, np.ndarray] | None]]:
    """Per row (port, or rail) and lane: (t, share of the row's ports up from t on) as a step function, or
    None where no port of the row observed that signal. A port's share is 0 or 1."""
    groups = (
        [[s] for s in sources]
        if not per_rail
        else [[s for s, r in zip(sources, rows["rail"], strict=True) if r == rail] for rail in rails]
    )
    out: list[list[tuple[np.ndarray, np.ndarray] | None]] = []
    for group in groups:
        row: list[tuple[np.ndarray, np.ndarray] | None] = []
        for kind, _name, _colour in LANES:
            observed = [s for s in group if _observed(index, s, kind)]
            if not observed:
                row.append(None)
                continue
            edges: list[tuple[int, int]] = [(start, 0), (end, 0)]
            for s in observed:
                for a, b in _up_intervals(index, s, kind, start, end):
                    edges += [(a, 1), (b, -1)]
            edges.sort()
            t = np.array([e[0] for e in edges], dtype=np.int64)
            share = np.cumsum([e[1] for e in edges]) / len(observed)
            row.append((t, share))
        out.append(row)
    return out


def same_arrays(a: tuple[np.ndarray, np.ndarray] | None, b: tuple[np.ndarray, np.ndarray] | None) -> bool:
    if a is None or b is None:
        return a is b
    return all(np.array_equal(x, y, equal_nan=x.dtype.kind == "f") for x, y in zip(a, b, strict=True))
