"""An independent check of a Chrome trace-event JSON file (the format Perfetto's UI and chrome://tracing
read): what the format requires of each event, complete slices that nest on their track, and time moving
forward on every track in file order. Written from the format's document, not from labctl's exporter."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

PHASES = set("BEXiIcCbneNODsftPM")  # every `ph` the format defines
EPS_US = 1e-6  # one femtosecond: float µs of integer ns are exact to far below this


def trace_format_problems(events: Iterable[dict[str, Any]]) -> list[str]:
    """Every breach found, one line each; an empty list is a trace that passes."""
    problems: list[str] = []
    last_ts: dict[tuple[Any, Any], float] = {}
    open_slices: dict[tuple[Any, Any], list[tuple[float, float, str]]] = defaultdict(list)
    for i, e in enumerate(events):
        where = f"event {i} ({e.get('name')!r})"
        for key in ("ph", "pid", "tid"):
            if key not in e:
                problems.append(f"{where}: no {key}")
        ph = e.get("ph")
        if ph not in PHASES:
            problems.append(f"{where}: unknown ph {ph!r}")
            continue
        if ph == "M":
            continue  # metadata: the format gives it no time
        ts = e.get("ts")
        if not isinstance(ts, int | float):
            problems.append(f"{where}: no numeric ts")
            continue
        track = (e.get("pid"), e.get("tid"))
        if ts < last_ts.get(track, float("-inf")):
            problems.append(f"{where}: ts {ts} before the track's previous event at {last_ts[track]}")
        last_ts[track] = ts
        if ph != "X":
            continue
        dur = e.get("dur")
        if not isinstance(dur, int | float) or dur < 0:
            problems.append(f"{where}: complete event with dur {dur!r}")
            continue
        stack = open_slices[track]
        while stack and stack[-1][1] <= ts + EPS_US:  # slices that ended: closed
            stack.pop()
        if stack and ts + dur > stack[-1][1] + EPS_US:
            parent = stack[-1]
            problems.append(
                f"{where}: [{ts}, {ts + dur}] overlaps {parent[2]!r} [{parent[0]}, {parent[1]}] without nesting"
            )
        stack.append((ts, ts + dur, str(e.get("name"))))
    return problems
