"""The timeline figure: one reconfiguration on every rail, in full and zoomed on each cluster of marks (like
Opus Fig. 9c/9d): the switch, each port's Rx power, and when each port's firmware link, carrier and traffic
were up, with the marks t1–t5.

Artists that tests (and users post-processing a figure) look for carry a gid: `rx-threshold` (the Rx-power
threshold line), `mark-t1` … `mark-t5` (the marks; `mark-tN-spread` the p5–p95 whiskers when ports are
summarized per rail), `rx-rail-R` (a rail's Rx traces), `ocs-rail-R` (a rail's switch command bar).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.cbook import pts_to_poststep
from matplotlib.collections import PolyCollection
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from labctl.analysis.event_index import EventIndex
from labctl.analysis.figures import DEFAULT_FORMATS
from labctl.analysis.plot_files import draw_and_save
from labctl.analysis.plot_signals import held_trace, lane_spans, same_arrays, threshold_of
from labctl.analysis.plot_style import (
    DOWN_ALPHA,
    LANES,
    MARKS,
    NO_LIGHT_DBM,
    format_ms,
    mark_style,
    rail_colours,
    styled,
    time_ticks,
)
from labctl.core.errors import InputError
from labctl.core.events import Kind

ZOOM_S = 0.7
MAX_PORT_ROWS = 8
"""Above this many ports a timeline draws one row per rail (ports up as a fraction, marks as median with a
p5–p95 whisker) instead of one row per port: 16 port rows of three lanes each are too dense to read, and the
headline figure shows one port in full."""
ZOOM_SPLIT = 0.3
"""The timeline's zoom is split in two windows (a broken axis) where the widest gap between its marks is
more than this share of the time from the command to the last mark: switching in ms, firmware in s."""
LANE_OFFSET = 0.27  # lane j of a row group is centred at y + LANE_OFFSET * (1 - j): the group centre is y
LANE_HEIGHT = 0.23
RAIL_DASHES = ("-", "--", "-.", ":")
"""Rx traces of rail i: line style i (and wider the earlier the rail), so a rail whose traces coincide with
a later rail's still shows under them."""


def plot_timeline(
    index: EventIndex,
    frame: pd.DataFrame,
    reconfig: int,
    out: Path,
    *,
    threshold_dbm: float | None = None,
    style: str | os.PathLike[str] | None = None,
    formats: Sequence[str] = DEFAULT_FORMATS,
) -> list[Path]:
    """Draw timeline_figure and write it to `out` in each format (.png by default); returns their paths."""
    return draw_and_save(lambda: _draw_timeline(index, frame, reconfig, threshold_dbm), out, style, formats)


def timeline_figure(
    index: EventIndex,
    frame: pd.DataFrame,
    reconfig: int,
    *,
    threshold_dbm: float | None = None,
    style: str | os.PathLike[str] | None = None,
) -> Any:
    """One reconfiguration, in full (left) and zoomed on its start (right). Top: the switch, command →
    acknowledgement per rail. Middle: Rx power per port, coloured by rail, with the threshold that defines t2
    (default: the run's). Bottom: per port (per rail above MAX_PORT_ROWS ports) when firmware, carrier and
    traffic were up, with the marks t1–t5. The caller closes the figure. Axes gids: ocs-, rx-, lanes-
    followed by full or zoom."""
    with styled(style):
        return _draw_timeline(index, frame, reconfig, threshold_dbm)


TIMELINE_COLUMNS = (
    "phase",
    "rail",
    "source",
    "host",
    "port",
    "t0_command_ns",
    *(mark[0] for mark in MARKS),
    "total_ns",
)
"""The breakdown columns a timeline draws from (of its reconfiguration's rows)."""


@dataclass(frozen=True, eq=False)
class TimelineData:
    """Everything the timeline figure of one reconfiguration shows, worked out from the run's events and
    breakdown (timeline_data). The figure is a function of it and of the style alone, so two that are
    `same_as` each other draw the same figure: a timeline drawn while the run goes on is kept at its end
    when the data it was drawn from came out the same (labctl.analysis.pool)."""

    reconfig: int
    rows: pd.DataFrame
    """The reconfiguration's port rows (TIMELINE_COLUMNS), by rail in the experiment's order."""
    t0: int
    span_ns: int
    threshold: float
    traces: dict[str, tuple[np.ndarray, np.ndarray]]
    """Per port: its Rx-power trace over the window drawn."""
    lanes: list[list[tuple[np.ndarray, np.ndarray] | None]]
    """Per row (port, or rail) and lane: see lane_spans."""

    def same_as(self, other: TimelineData) -> bool:
        return (
            (self.reconfig, self.t0, self.span_ns, self.threshold)
            == (other.reconfig, other.t0, other.span_ns, other.threshold)
            and self.rows.equals(other.rows)
            and self.traces.keys() == other.traces.keys()
            and all(same_arrays(self.traces[s], other.traces[s]) for s in self.traces)
            and len(self.lanes) == len(other.lanes)
            and all(
                len(a) == len(b) and all(same_arrays(x, y) for x, y in zip(a, b, strict=True))
                for a, b in zip(self.lanes, other.lanes, strict=True)
            )
        )


def timeline_reconfig(frame: pd.DataFrame) -> int:
    """The reconfiguration a run's timeline.png shows: the first after the baseline (the baseline if it is
    all the run has)."""
    measured = sorted(int(r) for r in frame["reconfig"].dropna().unique())
    return next((r for r in measured if r > 0), measured[0])


def timeline_data(
    index: EventIndex,
    frame: pd.DataFrame,
    reconfig: int,
    threshold_dbm: float | None = None,
    *,
    traces: bool = True,
) -> TimelineData:
    """What the timeline of `reconfig` shows (see timeline_figure). It never reaches past the next
    reconfiguration's command, so once that is on record, later events change nothing of it.
    `traces=False`: only its rows and window (no traces or lanes)."""
    rows = frame[frame["reconfig"] == reconfig]
    if rows.empty:
        known = sorted({int(r) for r in frame["reconfig"].dropna()})
        raise InputError(f"reconfiguration {reconfig} has no affected ports in this run (have: {known})")
    threshold = threshold_of(index) if threshold_dbm is None else float(threshold_dbm)
    rows = rows.sort_values("rail", kind="stable", na_position="last")  # by rail, in the experiment's order
    rows = rows[[c for c in TIMELINE_COLUMNS if c in rows.columns]].reset_index(drop=True)
    t0 = int(rows["t0_command_ns"].dropna().min()) if rows["t0_command_ns"].notna().any() else None
    if t0 is None:  # the command was never sent (a run stopped right there): draw from the phase start
        phase_t = [e.t_ns for e in index.control if e.kind == Kind.PHASE and e.reconfig == reconfig]
        t0 = min(phase_t, default=index.last_ns)
    marks = rows[["t5_traffic_ns", "t4_carrier_up_ns", "t2_rx_power_ns"]].to_numpy(dtype=np.float64)
    last = float(np.nanmax(marks)) if np.isfinite(marks).any() else float("nan")
    recovered = rows["total_ns"].dropna()
    if len(recovered) < len(rows) or np.isnan(last):
        # Some port never came back (timed out, or the run stopped): draw until the run moved on or ended,
        # not just past the last mark that happened.
        last = max(t0 if np.isnan(last) else last, index.last_ns)
    span_ns = max(int((int(last) - t0) * 1.25), 1_000_000)
    later = frame.loc[frame["reconfig"] > reconfig, "t0_command_ns"].dropna()
    if not later.empty:  # never draw into the next reconfiguration
        span_ns = max(min(span_ns, int(later.min()) - t0), 1)
    start, end = _window(t0, span_ns)
    sources = [str(s) for s in rows["source"]]
    rails = list(dict.fromkeys(rows["rail"].tolist()))
    per_rail = len(sources) > MAX_PORT_ROWS
    return TimelineData(
        reconfig=reconfig,
        rows=rows,
        t0=t0,
        span_ns=span_ns,
        threshold=threshold,
        traces={s: held_trace(index.series(s, Kind.RX_POWER), start, end) for s in sources} if traces else {},
        lanes=lane_spans(index, rows, sources, rails, per_rail, start, end) if traces else [],
    )


def _window(t0: int, span_ns: int) -> tuple[int, int]:
    """[start, end) of the events a timeline draws: from a little before the command to its span."""
    return t0 - span_ns // 50, t0 + span_ns


def _draw_timeline(index: EventIndex, frame: pd.DataFrame, reconfig: int, threshold_dbm: float | None) -> Any:
    return render_timeline(timeline_data(index, frame, reconfig, threshold_dbm))


def render_timeline(data: TimelineData) -> Any:
    """The timeline figure of `data`, in the style in effect (see timeline_figure); the caller closes it."""
    rows, t0, span_ns, reconfig = data.rows, data.t0, data.span_ns, data.reconfig
    windows = zoom_windows(rows, t0, span_ns)
    sources = [str(s) for s in rows["source"]]
    rails = list(dict.fromkeys(rows["rail"].tolist()))
    colours = rail_colours(rails)
    per_rail = len(sources) > MAX_PORT_ROWS
    n_rows = len(rails) if per_rail else len(sources)
    recovered = rows["total_ns"].dropna()

    font_in = float(plt.rcParams["font.size"]) / 72
    row_in = max(0.3, 3.2 * font_in) * (1.6 if per_rail else 1.0)
    heights = [max(0.5, 0.25 + 1.8 * font_in * len(rails)), max(2.0, 20 * font_in), max(1.2, row_in * n_rows)]
    width = float(plt.rcParams["figure.figsize"][0])
    fig = plt.figure(figsize=(width, sum(heights) + 1.4), layout="constrained")
    axes = fig.subplots(
        3,
        1 + len(windows),
        sharex="col",
        sharey="row",
        gridspec_kw={"height_ratios": heights, "width_ratios": [1.5] + [1.0] * len(windows)},
        squeeze=False,
    )

    phase = rows["phase"].iloc[0]
    if recovered.empty:
        outcome = "none recovered"
    else:
        outcome = f"{len(recovered)} recovered, total median {float(recovered.median()) / 1e9:.3f} s"
    n_rails = f"{len(rails)} rail" + ("s" if len(rails) != 1 else "")
    fig.suptitle(f"Reconfiguration {reconfig} → {phase}: {len(sources)} ports on {n_rails}, {outcome}")

    span_s = span_ns / 1e9
    columns = [(-0.02 * span_s, span_s, "full reconfiguration", "full")]
    for k, (lo, hi) in enumerate(windows):
        title = (
            f"zoom: first {format_ms(hi * 1e3)}"
            if lo <= 0
            else f"zoom: {format_ms(lo * 1e3)} – {format_ms(hi * 1e3)}"
        )
        columns.append((lo, hi, title, "zoom" if k == 0 else f"zoom-{k + 1}"))
    for col, (lo, hi, title, name) in enumerate(columns):
        ax_ocs, ax_rx, ax_lanes = axes[:, col]
        for ax, lane in ((ax_ocs, "ocs"), (ax_rx, "rx"), (ax_lanes, "lanes")):
            ax.set_gid(f"{lane}-{name}")
        ax_ocs.set_title(title)
        _draw_switch(ax_ocs, rows, rails, colours, t0)
        window = (t0 + int(lo * 1e9), t0 + int(hi * 1e9)) if col else None
        _draw_rx(ax_rx, rows, data.traces, colours, t0, data.threshold, legend=col == 0, window=window)
        _draw_lanes(ax_lanes, data.lanes, t0)
        if per_rail:
            _draw_rail_marks(ax_lanes, rows, rails, t0)
            _label_rows(
                ax_lanes, [f"rail {r}\n{(rows['rail'] == r).sum()} ports" for r in rails], rails, colours
            )
        else:
            _draw_port_marks(ax_lanes, rows, t0)
            labels = [f"{h}/{p}" for h, p in zip(rows["host"], rows["port"], strict=True)]
            _label_rows(ax_lanes, labels, rows["rail"].tolist(), colours)
        ax_lanes.set_xlabel("time since OCS command" if col == 0 else "since the command")
        ax_lanes.set_xlim(lo, hi)
        time_ticks(ax_lanes, lo, hi)
        ax_lanes.grid(axis="x")
        if col:  # the rows are labelled once, on the left
            ax_ocs.set_ylabel("")
            ax_rx.set_ylabel("")
    fig.legend(
        *_lane_legend(),
        loc="outside lower center",
        ncol=5,
        title="per rail: share of ports up; marks = median, whisker p5–p95" if per_rail else None,
    )
    return fig


def zoom_windows(rows: pd.DataFrame, t0: int, span_ns: int) -> list[tuple[float, float]]:
    """The timeline's zoom, from its marks (s since `t0`): one window from the command over every mark, or,
    where the widest gap between marks is more than ZOOM_SPLIT of the time to the last one (ms of switching
    and light, then s of firmware), two: from the command over the marks before the gap, and over those
    after it. Where a port did not recover the first window shows at least the first ZOOM_S (at most a
    quarter of the span): its lanes go on to the end of the run. Without marks: the first ZOOM_S."""
    span_s = span_ns / 1e9
    first = min(ZOOM_S, span_s / 4)
    marks = rows[[m[0] for m in MARKS]].to_numpy(dtype=np.float64, na_value=np.nan)
    x = np.unique(np.clip((marks[np.isfinite(marks)] - t0) / 1e9, 0.0, span_s))
    if x.size == 0:
        return [(-0.02 * first, first)]
    gaps = np.diff(x)
    clusters = [x]
    if gaps.size and x[-1] > 0 and gaps.max() > ZOOM_SPLIT * x[-1]:
        cut = int(np.argmax(gaps)) + 1
        clusters = [x[:cut], x[cut:]]
    hi = float(clusters[0][-1])
    pad = max(0.12 * hi, 1e-4)
    end = hi + pad
    if len(clusters) == 1 and rows["total_ns"].isna().any():
        end = max(end, first)
    windows = [(-pad, min(end, span_s))]
    if len(clusters) == 2:
        lo, hi = float(clusters[1][0]), float(clusters[1][-1])
        pad = max(0.12 * (hi - lo), 0.01 * hi, 1e-4)
        windows.append((max(lo - pad, windows[0][1]), min(hi + pad, span_s)))
    return windows


def _draw_lanes(ax: Any, lanes: list[list[tuple[np.ndarray, np.ndarray] | None]], t0: int) -> None:
    """Each row group: three lanes (firmware, carrier, traffic), pale where down, filled where up (for a
    rail: filled to the share of its ports that are up), centred on the row's tick. One collection per lane
    and state (gid lane-down-J, lane-up-J), holding one band per row that observed the signal: the
    polygons ax.fill_between would draw, without its per-call cost (~2 ms each, 6 per port row)."""
    n = len(lanes)
    down: list[list[np.ndarray]] = [[] for _ in LANES]
    up: list[list[np.ndarray]] = [[] for _ in LANES]
    for i, row in enumerate(lanes):
        y = n - 1 - i
        for j, step in enumerate(row):
            if step is None:
                continue
            t, share = step
            x = (t - t0) / 1e9
            lo = y + LANE_OFFSET * (1 - j) - LANE_HEIGHT / 2
            down[j].append(_band(np.array([x[0], x[-1]]), lo, np.full(2, lo + LANE_HEIGHT)))
            if share.max(initial=0) > 0:
                up[j].append(_band(*pts_to_poststep(x, np.full(x.size, lo), lo + LANE_HEIGHT * share)))
    for j, (_kind, _name, colour) in enumerate(LANES):
        for bands, alpha, state in ((down[j], DOWN_ALPHA, "down"), (up[j], None, "up")):
            if bands:
                ax.add_collection(
                    PolyCollection(bands, color=colour, alpha=alpha, lw=0, gid=f"lane-{state}-{j}"),
                    autolim=False,
                )


def _band(x: np.ndarray, lo: np.ndarray | float, hi: np.ndarray) -> np.ndarray:
    """The polygon fill_between(x, lo, hi) draws: along the bottom, then back along the top."""
    n = x.size
    pts = np.empty((2 * n + 2, 2))
    pts[0] = x[0], hi[0]
    pts[1 : n + 1, 0], pts[1 : n + 1, 1] = x, lo
    pts[n + 1] = x[-1], hi[-1]
    pts[n + 2 :, 0], pts[n + 2 :, 1] = x[::-1], hi[::-1]
    return pts


def _label_rows(ax: Any, labels: list[str], rails: list[Any], colours: dict[Any, str]) -> None:
    n = len(labels)
    ax.set_yticks(range(n - 1, -1, -1), labels)
    for tick, rail in zip(ax.get_yticklabels(), rails, strict=False):  # none where hidden (shared)
        tick.set_color(colours.get(rail, "black"))
    ax.tick_params(axis="y", length=0)
    ax.set_ylim(-0.5, n - 0.5)


def _draw_port_marks(ax: Any, rows: pd.DataFrame, t0: int) -> None:
    n = len(rows)
    y_centre = np.arange(n - 1, -1, -1, dtype=np.float64)
    for k, (col, name, marker, colour, size, lane) in enumerate(MARKS, start=1):
        values = rows[col].to_numpy(dtype=np.float64)
        ok = np.isfinite(values)
        y = y_centre[ok] + LANE_OFFSET * (1 - lane)
        ax.plot(
            (values[ok] - t0) / 1e9,
            y,
            ls="none",
            **mark_style(marker, colour, size),
            zorder=5,
            gid=f"mark-t{k}",
            label=name,
        )


def _draw_rail_marks(ax: Any, rows: pd.DataFrame, rails: list[Any], t0: int) -> None:
    n = len(rails)
    for k, (col, name, marker, colour, size, lane) in enumerate(MARKS, start=1):
        xs, ys, lo, hi = [], [], [], []
        for i, rail in enumerate(rails):
            values = _ns_values(rows[rows["rail"] == rail], col)
            if not values.size:
                continue
            p5, p50, p95 = np.percentile(values, [5, 50, 95])
            xs.append((p50 - t0) / 1e9)
            ys.append(n - 1 - i + LANE_OFFSET * (1 - lane))
            lo.append((p5 - t0) / 1e9)
            hi.append((p95 - t0) / 1e9)
        if xs:
            whiskers = ax.errorbar(
                xs,
                ys,
                xerr=[np.subtract(xs, lo), np.subtract(hi, xs)],
                fmt="none",
                ecolor="black",
                elinewidth=0.9,
                capsize=2.5,
                zorder=4,
            )
            for artist in whiskers.lines[2]:
                artist.set_gid(f"mark-t{k}-spread")
        ax.plot(
            xs,
            ys,
            ls="none",
            **mark_style(marker, colour, size * 1.2),
            zorder=5,
            gid=f"mark-t{k}",
            label=f"{name} (median)",
        )


def _lane_legend() -> tuple[list[Any], list[str]]:
    handles: list[Any] = [Patch(color=c) for _, _, c in LANES]
    labels = [f"{name} up" for _, name, _ in LANES]
    handles.append(Patch(color="0.5", alpha=DOWN_ALPHA * 2))
    labels.append("pale: down (empty: not observed)")
    for _col, name, marker, colour, size, _lane in MARKS:
        handles.append(Line2D([], [], ls="none", **mark_style(marker, colour, size)))
        labels.append(name)
    return handles, labels


def _draw_switch(ax: Any, rows: pd.DataFrame, rails: list[Any], colours: dict[Any, str], t0: int) -> None:
    """The OCS lane: command → acknowledgement, one bar per rail in the rail's colour (gid ocs-rail-R)."""
    for i, rail in enumerate(rails):
        group = rows[rows["rail"] == rail]
        c0, c1 = group["t0_command_ns"].iloc[0], group["t1_switch_done_ns"].iloc[0]
        y = len(rails) - 1 - i
        if not pd.isna(c0) and not pd.isna(c1):
            ax.barh(
                y,
                (c1 - c0) / 1e9,
                left=(c0 - t0) / 1e9,
                color=colours[rail],
                height=0.6,
                gid=f"ocs-rail-{rail}",
            )
    ax.set_yticks(range(len(rails) - 1, -1, -1), [f"rail {r}" for r in rails])
    for tick, rail in zip(ax.get_yticklabels(), rails, strict=False):  # none where hidden (shared)
        tick.set_color(colours[rail])
    ax.set_ylim(-0.6, len(rails) - 0.4)
    ax.set_ylabel("OCS", rotation=0, ha="right", va="center")
    ax.tick_params(axis="y", length=0)


def _draw_rx(
    ax: Any,
    rows: pd.DataFrame,
    traces: dict[str, tuple[np.ndarray, np.ndarray]],
    colours: dict[Any, str],
    t0: int,
    threshold: float,
    *,
    legend: bool,
    window: tuple[int, int] | None = None,
) -> None:
    """Rx power per port, one colour and line style per rail (rail_line: an earlier rail is drawn wider and
    under a later one, so coinciding traces show both); no light on the floor line; the threshold that
    defines t2. `window`: [start, end) ns of the trace to draw (a zoom's; default: all of it)."""
    many = len(traces) > MAX_PORT_ROWS
    rails = list(colours)
    for source, rail in zip(rows["source"], rows["rail"], strict=True):
        t, v = traces[str(source)]
        if window is not None and t.size:
            i = max(int(np.searchsorted(t, window[0], "right")) - 1, 0)
            j = min(int(np.searchsorted(t, window[1], "left")) + 1, t.size)
            t, v = t[i:j], v[i:j]
        ax.step(
            (t - t0) / 1e9,
            np.maximum(v, NO_LIGHT_DBM),
            where="post",
            alpha=0.55 if many else 0.8,
            gid=f"rx-rail-{rail}",
            **rail_line(rails.index(rail), len(rails), colours[rail]),
        )
    ax.axhline(NO_LIGHT_DBM, color="0.5", lw=0.6, ls=":")
    ax.text(
        0.995,
        NO_LIGHT_DBM + 1,
        "no light",
        transform=ax.get_yaxis_transform(),
        ha="right",
        fontsize="x-small",
        color="0.4",
    )
    label = f"threshold {threshold:g} dBm (t2)"
    ax.axhline(threshold, color="black", lw=0.9, ls="--", gid="rx-threshold", label=label, zorder=3)
    ax.set_ylim(min(NO_LIGHT_DBM, threshold) - 3, max(3.0, threshold + 3))
    ax.set_ylabel("Rx power\n(dBm)")
    ax.grid()
    if legend:
        counts = rows.groupby("rail", sort=False).size()
        handles = [Line2D([], [], **rail_line(i, len(rails), colours[r])) for i, r in enumerate(rails)]
        labels = [f"rail {r} ({int(counts.get(r, 0))} ports)" for r in rails]
        handles.append(Line2D([], [], color="black", lw=0.9, ls="--"))
        labels.append(label)
        ax.legend(handles, labels, loc="center right", ncol=1 if len(labels) <= 5 else 2)


def rail_line(i: int, n: int, colour: str) -> dict[str, Any]:
    """The line of rail i of n: its colour, style RAIL_DASHES[i], wider the earlier the rail and drawn
    under the later ones."""
    widen = (n - 1 - i) / max(n - 1, 1)
    return {
        "color": colour,
        "ls": RAIL_DASHES[i % len(RAIL_DASHES)],
        "lw": 1.0 + 1.4 * widen,
        "zorder": 2 + i / max(n, 1),
    }


def _ns_values(rows: pd.DataFrame, col: str) -> np.ndarray:
    return rows[col].dropna().to_numpy(dtype=np.float64)
