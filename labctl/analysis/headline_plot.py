"""The headline figure: one port's recovery after one reconfiguration, as Figure 9 of the Opus paper shows
it: its Rx power and its marks t0–t5 on one time axis (broken in two where seconds follow milliseconds),
each labelled with its time, its bracket and its spread over the reconfiguration's ports; above it, the
port's OCS, firmware, carrier and traffic states.

Artists that tests (and users post-processing a figure) look for carry a gid: `headline-rx` (the port's Rx
trace), `headline-rx-spread` (p5–p95 over the ports), `headline-mark-tN` (a mark's line, label
`headline-label-tN`, bracket `headline-bracket-tN`, spread `headline-spread-tN`), `headline-light-lost` /
`headline-light-back` (the shaded brackets the light went out and came back in), `headline-floor` and
`headline-floor-label` (the no-light floor line and its label), `rx-threshold` (the Rx-power threshold line).
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
from matplotlib.collections import PolyCollection
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from labctl.analysis.event_index import EventIndex, Series
from labctl.analysis.figures import DEFAULT_FORMATS
from labctl.analysis.headline_labels import LABEL_PAD_PT, place_headline_labels
from labctl.analysis.plot_files import draw_and_save
from labctl.analysis.plot_signals import held_trace, lane_spans, same_arrays
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
from labctl.analysis.timeline_plot import TIMELINE_COLUMNS, timeline_data, zoom_windows
from labctl.core.events import Kind


def plot_headline(
    index: EventIndex,
    frame: pd.DataFrame,
    reconfig: int,
    out: Path,
    *,
    threshold_dbm: float | None = None,
    style: str | os.PathLike[str] | None = None,
    formats: Sequence[str] = DEFAULT_FORMATS,
) -> list[Path]:
    """Draw headline_figure and write it to `out` in each format (.png by default); returns their paths."""
    return draw_and_save(
        lambda: render_headline(headline_data(index, frame, reconfig, threshold_dbm)), out, style, formats
    )


def headline_figure(
    index: EventIndex,
    frame: pd.DataFrame,
    reconfig: int,
    *,
    threshold_dbm: float | None = None,
    style: str | os.PathLike[str] | None = None,
) -> Any:
    """One reconfiguration as Figure 9 of the Opus paper shows it: one port (the median of the
    reconfiguration's ports by total recovery time), its Rx power and, on the same time axis, its marks
    t0 (command), t1 (switch done), t2 (light), t3 (firmware link), t4 (carrier) and t5 (traffic), each
    labelled with its time, with the bracket of a sampled mark (the sample before it → the mark) and the
    p5–p95 of that mark over all the reconfiguration's ports; above it, the port's OCS, firmware, carrier and
    traffic states. Where seconds follow milliseconds (firmware link-up after the light) the time axis is
    broken in two linear windows (zoom_windows: the marks of every port in each). Axes gids:
    headline-states, headline-rx (first window), headline-states-2, headline-rx-2 (second). The caller
    closes the figure."""
    with styled(style):
        return render_headline(headline_data(index, frame, reconfig, threshold_dbm))


HEADLINE_GRID = 400
"""Points per time window the ports' Rx-power spread is worked out on."""
RESOLUTIONS = {
    "t2_rx_power_ns": "t2_resolution_ns",
    "t3_firmware_up_ns": "t3_resolution_ns",
    "t4_carrier_up_ns": "t4_resolution_ns",
    "t5_traffic_ns": "t5_resolution_ns",
}
HEADLINE_COLUMNS = (*TIMELINE_COLUMNS, *RESOLUTIONS.values())
"""The breakdown columns the headline draws from (of its reconfiguration's rows)."""
# (mark, what it is, the mark the phase ending at it starts from: shown as "+duration")
HEADLINE_MARKS = (
    ("t1_switch_done_ns", "t1 OCS switch done", None),
    ("t2_rx_power_ns", "t2 light: Rx ≥ {threshold:g} dBm", None),
    ("t3_firmware_up_ns", "t3 firmware link up", "t2_rx_power_ns"),
    ("t4_carrier_up_ns", "t4 carrier up", "t3_firmware_up_ns"),
    ("t5_traffic_ns", "t5 traffic back", "t4_carrier_up_ns"),
)


@dataclass(frozen=True, eq=False)
class HeadlineData:
    """Everything the headline figure of one reconfiguration shows (headline_data); like TimelineData, the
    figure is a function of it and the style alone, and it never reaches past the next reconfiguration's
    command."""

    reconfig: int
    rows: pd.DataFrame
    """The reconfiguration's port rows (HEADLINE_COLUMNS), by rail in the experiment's order."""
    pick: int
    """The row of the port shown (median_port)."""
    t0: int
    """Its switch command."""
    windows: list[tuple[float, float]]
    """The time axis: one or two windows (s since t0; zoom_windows)."""
    threshold: float
    trace: tuple[np.ndarray, np.ndarray]
    """The port's Rx power (t ns, dBm) over the windows."""
    spread: list[tuple[np.ndarray, np.ndarray, np.ndarray]]
    """Per window (s since each port's command, p5, p95): the Rx power of the reconfiguration's ports."""
    lanes: list[tuple[np.ndarray, np.ndarray] | None]
    """The port's firmware, carrier and traffic states (see lane_spans)."""
    lost: tuple[int, int] | None = None
    """The bracket the port's light went out in after the command (ns; _light_lost)."""

    def same_as(self, other: HeadlineData) -> bool:
        return (
            (self.reconfig, self.pick, self.t0, self.windows, self.threshold, self.lost)
            == (other.reconfig, other.pick, other.t0, other.windows, other.threshold, other.lost)
            and self.rows.equals(other.rows)
            and same_arrays(self.trace, other.trace)
            and len(self.spread) == len(other.spread)
            and all(
                np.array_equal(x, y, equal_nan=True)
                for a, b in zip(self.spread, other.spread, strict=True)
                for x, y in zip(a, b, strict=True)
            )
            and len(self.lanes) == len(other.lanes)
            and all(same_arrays(a, b) for a, b in zip(self.lanes, other.lanes, strict=True))
        )


def median_port(rows: pd.DataFrame) -> int:
    """The row of the port whose total recovery time (t5 − t0) is the median of the rows' (the lower one of
    an even count; ties by source); without any: the same by optical time (t2 − t0), else the first row."""
    for col in ("total_ns", "optical_ns"):
        if col not in rows.columns:
            continue
        values = rows[col].to_numpy(dtype=np.float64, na_value=np.nan)
        ok = np.flatnonzero(np.isfinite(values))
        if ok.size:
            order = sorted(ok, key=lambda i: (values[i], str(rows["source"].iloc[i])))
            return int(order[(len(order) - 1) // 2])
    return 0


def headline_data(
    index: EventIndex, frame: pd.DataFrame, reconfig: int, threshold_dbm: float | None = None
) -> HeadlineData:
    """What the headline of `reconfig` shows (see headline_figure): the timeline's rows and window, one
    port of them."""
    timeline = timeline_data(index, frame, reconfig, threshold_dbm, traces=False)
    rows = frame[frame["reconfig"] == reconfig].sort_values("rail", kind="stable", na_position="last")
    rows = rows[[c for c in HEADLINE_COLUMNS if c in rows.columns]].reset_index(drop=True)
    pick = median_port(rows)
    t0 = timeline.t0
    windows = zoom_windows(rows, t0, timeline.span_ns)
    source = str(rows["source"].iloc[pick])
    rx = index.series(source, Kind.RX_POWER)
    t2 = rows["t2_rx_power_ns"].iloc[pick] if "t2_rx_power_ns" in rows.columns else None
    t0_own = int(rows["t0_command_ns"].iloc[pick]) if not pd.isna(rows["t0_command_ns"].iloc[pick]) else t0
    lost = _light_lost(
        rx,
        t0_own,
        t0 + int(windows[0][1] * 1e9) if t2 is None or pd.isna(t2) else int(t2),
        timeline.threshold,
    )
    if lost is not None:  # the first window opens on the port's last sample that saw light
        lo, hi = windows[0]
        windows[0] = (min(lo, (lost[0] - t0) / 1e9 - 0.05 * (hi - lo)), hi)
    start, end = t0 + int(windows[0][0] * 1e9) - 1, t0 + int(windows[-1][1] * 1e9) + 1
    rails = list(dict.fromkeys(rows["rail"].tolist()))
    commands = rows["t0_command_ns"].to_numpy(dtype=np.float64, na_value=np.nan)
    own_t0 = np.where(np.isfinite(commands), commands, float(t0)).astype(np.int64)
    return HeadlineData(
        reconfig=reconfig,
        rows=rows,
        pick=pick,
        t0=t0,
        windows=windows,
        threshold=timeline.threshold,
        trace=held_trace(rx, start, end),
        spread=[_rx_spread(index, rows, own_t0, window) for window in windows],
        lanes=lane_spans(index, rows.iloc[[pick]], [source], rails, False, start, end)[0],
        lost=lost,
    )


def _light_lost(s: Series, t0: int, end: int, threshold: float) -> tuple[int, int] | None:
    """Where the port's light went out after the command `t0`, as its samples bracket it: (the last sample
    that saw light, the first below the threshold), found before `end` (t2). None where the port was dark
    at the command already, never went dark, or the probe stamped the loss as it happened (no bracket)."""
    k = int(np.searchsorted(s.t, t0, "left"))
    dark = np.flatnonzero(s.v[k:] < threshold)
    if not dark.size:
        return None
    k += int(dark[0])
    if k == 0 or s.t[k] > end or s.v[k - 1] < threshold or s.prev[k] < 0:
        return None
    return max(int(s.prev[k]), int(s.t[k - 1])), int(s.t[k])


def _rx_spread(
    index: EventIndex, rows: pd.DataFrame, own_t0: np.ndarray, window: tuple[float, float]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """p5 and p95 of the ports' Rx power (no light on the floor line), each from its own command, on a grid
    of HEADLINE_GRID points over `window` (s)."""
    grid = np.linspace(window[0], window[1], HEADLINE_GRID)
    offsets = np.round(grid * 1e9).astype(np.int64)
    values = np.full((len(rows), grid.size), np.nan)
    for i, source in enumerate(rows["source"]):
        s = index.series(str(source), Kind.RX_POWER)
        if not s.t.size:
            continue
        at = np.searchsorted(s.t, own_t0[i] + offsets, "right") - 1
        values[i] = np.where(at >= 0, np.maximum(s.v[np.maximum(at, 0)], NO_LIGHT_DBM), np.nan)
    seen = np.isfinite(values).any(axis=0)
    lo = np.full(grid.size, np.nan)
    hi = np.full(grid.size, np.nan)
    if seen.any():
        lo[seen], hi[seen] = np.nanpercentile(values[:, seen], [5, 95], axis=0)
    return grid, lo, hi


def render_headline(data: HeadlineData) -> Any:
    """The headline figure of `data`, in the style in effect (see headline_figure); the caller closes it."""
    rows, pick, t0 = data.rows, data.pick, data.t0
    row = rows.iloc[pick]
    rails = list(dict.fromkeys(rows["rail"].tolist()))
    colour = rail_colours(rails)[row["rail"]]
    n = len(rows)
    # Room for each mark's label beside its line, on its own row, in the style's font (place_headline_labels)
    width = 0.75 * float(plt.rcParams["figure.figsize"][0])
    font_in = float(plt.rcParams["font.size"]) / 72
    fig = plt.figure(figsize=(width, max(5.8, 46 * font_in)), layout="constrained")
    axes = fig.subplots(
        2,
        len(data.windows),
        sharex="col",
        sharey="row",
        squeeze=False,
        gridspec_kw={"height_ratios": [1.0, 3.2], "wspace": 0.02},
    )
    marks = _headline_marks(data, row)
    light = _light_brackets(data, row)
    for w, (lo, hi) in enumerate(data.windows):
        states, rx = axes[:, w]
        suffix = "" if w == 0 else f"-{w + 1}"
        states.set_gid(f"headline-states{suffix}")
        rx.set_gid(f"headline-rx{suffix}")
        _draw_headline_states(states, row, data.lanes, t0, colour)
        grid, p5, p95 = data.spread[w]
        if n > 1 and np.isfinite(p5).any():
            rx.fill_between(
                grid, p5, p95, step="post", color=colour, alpha=0.2, lw=0, gid="headline-rx-spread"
            )
        _draw_headline_rx(rx, data, light, colour, lo, hi)
        rx.axhline(NO_LIGHT_DBM, color="0.5", lw=0.6, ls=":", gid="headline-floor")
        rx.axhline(data.threshold, color="black", lw=0.8, ls="--", gid="rx-threshold")
        rx.set_ylim(NO_LIGHT_DBM - 4, max(3.0, data.threshold + 3))
        rx.set_xlim(lo, hi)
        time_ticks(rx, lo, hi)
        rx.grid(axis="both")
        states.grid(axis="x")
        for mark in marks:
            if lo <= mark.x <= hi:
                _headline_mark(rx, states, mark)
        if w > 0:  # a broken axis: the break drawn on both sides
            _break(axes[:, w - 1], axes[:, w])
    axes[1, 0].set_ylabel("Rx power (dBm)")
    for ax, text in zip(axes[1], _headline_xlabels(data.windows), strict=True):
        ax.set_xlabel(text)
    port = f"{row['host']}/{row['port']}"
    by = "by recovery time" if rows["total_ns"].notna().any() else "by light back (none recovered)"
    fig.suptitle(
        f"Reconfiguration {data.reconfig} → {row['phase']}: port {port} (rail {row['rail']}),\n"
        f"the median of {n} port{'s' if n != 1 else ''} {by}; spreads: p5–p95 over the {n}"
    )
    handles: list[Any] = [
        Line2D([], [], color=colour, lw=1.4),
        Patch(color=colour, alpha=0.2),
        Line2D([], [], color="black", lw=0.8, ls="--"),
    ]
    labels = [
        f"Rx power of {port}",
        f"Rx power p5–p95 over {n} ports",
        f"threshold {data.threshold:g} dBm (t2)",
    ]
    # The swatches are the plotted artists' own colour, alpha and width, never a stand-in's.
    bracket = next((a for a in fig.findobj(Line2D) if str(a.get_gid()).startswith("headline-bracket-")), None)
    if bracket is not None:
        handles.append(
            Line2D(
                [],
                [],
                color=bracket.get_color(),
                alpha=bracket.get_alpha(),
                lw=bracket.get_linewidth(),
                solid_capstyle="butt",
            )
        )
        labels.append("bracket (in the mark's colour): sample before → sampled mark")
    for name, what in (("lost", "light lost"), ("back", "light back (t2)")):
        span = next((a for a in fig.findobj(PolyCollection) if a.get_gid() == f"headline-light-{name}"), None)
        if span is not None:
            rgba = np.asarray(span.get_facecolor(), dtype=float)[0]
            handles.append(Patch(facecolor=(rgba[0], rgba[1], rgba[2], rgba[3]), lw=0))
            labels.append(f"{what} between these two samples")
    handles.append(Line2D([], [], color="black", lw=0.8, marker="|", ms=6))
    labels.append(f"mark p5–p95 over {n} ports")
    fig.legend(handles, labels, loc="outside lower center", ncol=3, fontsize="x-small")
    place_headline_labels(fig, axes[1], marks)
    return fig


@dataclass(frozen=True)
class _HeadlineMark:
    """A mark as the headline draws it: its line, its row (label above the row, its bracket, spread and
    marker on it) and the forms its label may take (one line, then wrapped)."""

    name: str
    x: float
    """s since the command."""
    row: float
    """dBm: the row its marker, bracket and spread sit on; the label sits just above it."""
    colour: str
    texts: tuple[str, ...]
    bracket_s: float | None
    spread: tuple[float, float] | None
    marker: str
    size: float


LABEL_ABOVE_ROW = 1.0
"""dBm between a mark's row and the bottom of its label."""


def _headline_marks(data: HeadlineData, row: pd.Series) -> list[_HeadlineMark]:
    """t0 (the command) and each of t1–t5 the port has, on rows top to bottom in pipeline order, between
    the threshold and the floor."""
    rows, t0 = data.rows, data.t0
    own = rows["t0_command_ns"].to_numpy(dtype=np.float64, na_value=np.nan)
    own = np.where(np.isfinite(own), own, float(t0))
    top = max(min(data.threshold - 2.5, -12.5), NO_LIGHT_DBM + 20)
    row_ys = np.linspace(top, NO_LIGHT_DBM + 1.5, 1 + len(HEADLINE_MARKS))
    marks = [_HeadlineMark("t0", 0.0, float(row_ys[0]), "black", ("t0 OCS command",), None, None, "|", 6)]
    for k, (col, what, since) in enumerate(HEADLINE_MARKS, start=1):
        if col not in rows.columns or pd.isna(row[col]):
            continue
        x = (float(row[col]) - t0) / 1e9
        head = f"{what.format(threshold=data.threshold)}: {format_ms(x * 1e3)}"
        tail = []
        if since is not None and not pd.isna(row[since]):
            tail.append(f"(+{format_ms((float(row[col]) - float(row[since])) / 1e6)})")
        res_col = RESOLUTIONS.get(col, "")
        res = float(row[res_col]) if res_col in rows.columns and not pd.isna(row[res_col]) else None
        if res:
            tail.append(f"[bracket {format_ms(res / 1e6)}]")
        what_text = what.format(threshold=data.threshold)
        texts = (
            " ".join([head, *tail]),
            *(["\n".join([head, " ".join(tail)])] if tail else []),
            "\n".join([f"{what_text}:", " ".join([format_ms(x * 1e3), *tail])]),
        )
        values = (rows[col].to_numpy(dtype=np.float64, na_value=np.nan) - own) / 1e9
        values = values[np.isfinite(values)]
        spread = (
            (float(np.percentile(values, 5)), float(np.percentile(values, 95))) if values.size > 1 else None
        )
        _, _, marker, mark_colour, size, _ = MARKS[k - 1]
        marks.append(
            _HeadlineMark(
                f"t{k}",
                x,
                float(row_ys[k]),
                mark_colour,
                texts,
                res / 1e9 if res else None,
                spread,
                marker,
                size,
            )
        )
    return marks


def _light_brackets(data: HeadlineData, row: pd.Series) -> list[tuple[str, int, int]]:
    """The port's light changes as the samples bracket them (ns): ("lost", the last sample that saw light,
    the first that did not) and ("back", t2 − its bracket, t2)."""
    out: list[tuple[str, int, int]] = []
    if data.lost is not None:
        out.append(("lost", *data.lost))
    t2, res = row.get("t2_rx_power_ns"), row.get("t2_resolution_ns")
    if t2 is not None and not pd.isna(t2) and res is not None and not pd.isna(res) and res > 0:
        out.append(("back", int(t2) - int(res), int(t2)))
    return out


LIGHT_COLOURS = {"lost": "#888888", "back": MARKS[1][3]}
"""The shade of the bracket the light went out in (grey) and came back in (t2's colour)."""


def _draw_headline_rx(
    rx: Any, data: HeadlineData, light: list[tuple[str, int, int]], colour: str, lo: float, hi: float
) -> None:
    """The port's Rx power as its samples saw it: each sample's value held (a 'post' step) until the next,
    but not across a change's bracket: there the trace breaks, the bracket shaded from the floor to the
    light's level (the light changed somewhere in it, not at the sample that saw it)."""
    t0 = data.t0
    t, v = data.trace
    inside = slice(
        max(int(np.searchsorted(t, t0 + lo * 1e9, "right")) - 1, 0),
        int(np.searchsorted(t, t0 + hi * 1e9, "left")) + 1,
    )
    x = (t[inside] - t0) / 1e9
    y = np.maximum(v[inside], NO_LIGHT_DBM)
    for name, start, end in light:
        a, b = (start - t0) / 1e9, (end - t0) / 1e9
        k = int(np.searchsorted(x, b, "left"))
        if 0 < k < x.size and x[k] == b:
            level = max(float(y[k - 1]), float(y[k]))
            x = np.insert(x, k, max(a, float(x[k - 1])))
            y = np.insert(y, k, np.nan)  # the held value stops where the bracket starts
        else:
            level = max(float(np.nanmax(y)) if y.size else NO_LIGHT_DBM, NO_LIGHT_DBM)
        if b >= lo and a <= hi:
            rx.fill_between(
                [a, b],
                NO_LIGHT_DBM,
                level,
                color=LIGHT_COLOURS[name],
                alpha=0.3,
                lw=0,
                zorder=1.2,
                gid=f"headline-light-{name}",
            )
    rx.step(x, y, where="post", color=colour, lw=1.4, gid="headline-rx-trace")


def _headline_xlabels(windows: Sequence[tuple[float, float]]) -> list[str]:
    """Each window's x label: the time since the command in the unit its ticks read, the break named."""
    units = ["ms" if max(abs(lo), abs(hi)) < 1.0 else "s" for lo, hi in windows]
    first = f"time since the OCS command t0 ({units[0]})"
    return [first, *(f"the same time axis after a break ({unit})" for unit in units[1:])]


HEADLINE_STATES = ("OCS switching", *(name for _, name, _ in LANES))


def _draw_headline_states(
    ax: Any, row: pd.Series, lanes: list[tuple[np.ndarray, np.ndarray] | None], t0: int, colour: str
) -> None:
    """The port's states, as in Figure 9c: the switch moving (command → done), then firmware link, carrier
    and traffic: solid while up, pale while down, "not observed" where the run has no such signal."""
    y_of = {name: len(HEADLINE_STATES) - 1 - i for i, name in enumerate(HEADLINE_STATES)}
    c0, c1 = row["t0_command_ns"], row["t1_switch_done_ns"]
    if not pd.isna(c0) and not pd.isna(c1):
        ax.broken_barh(
            [((c0 - t0) / 1e9, (c1 - c0) / 1e9)],
            (y_of[HEADLINE_STATES[0]] - 0.35, 0.7),
            color=colour,
            gid="headline-ocs",
        )
    for j, (_kind, name, lane_colour) in enumerate(LANES):
        step = lanes[j]
        y = y_of[name]
        if step is None:
            ax.text(
                0.5,
                y,
                "not observed",
                transform=ax.get_yaxis_transform(),
                ha="center",
                va="center",
                fontsize="x-small",
                color="0.4",
            )
            continue
        t, share = step
        x = (t - t0) / 1e9
        ax.broken_barh([(x[0], x[-1] - x[0])], (y - 0.35, 0.7), color=lane_colour, alpha=DOWN_ALPHA, lw=0)
        ups = [(x[k], x[k + 1] - x[k]) for k in range(x.size - 1) if share[k] > 0]
        if ups:
            ax.broken_barh(ups, (y - 0.35, 0.7), color=lane_colour, lw=0, gid=f"headline-lane-{j}")
    ax.set_yticks([y_of[name] for name in HEADLINE_STATES], list(HEADLINE_STATES))
    ax.set_ylim(-0.6, len(HEADLINE_STATES) - 0.4)
    ax.tick_params(axis="y", length=0)


def _headline_mark(rx: Any, states: Any, mark: _HeadlineMark) -> None:
    """A mark: its line across both axes; on its row, the mark, its bracket (thick), its spread over the
    ports (whisker); its label above the row (placed by place_headline_labels)."""
    name, x, y = mark.name, mark.x, mark.row
    rx.axvline(x, color=mark.colour, lw=0.9, alpha=0.75, zorder=1.5, gid=f"headline-mark-{name}")
    states.axvline(x, color=mark.colour, lw=0.9, alpha=0.75, zorder=1.5, gid=f"headline-mark-{name}-states")
    if mark.spread is not None:
        rx.plot(
            list(mark.spread),
            [y, y],
            color="black",
            lw=0.8,
            marker="|",
            ms=6,
            gid=f"headline-spread-{name}",
            zorder=4,
        )
    if mark.bracket_s:
        rx.plot(
            [x - mark.bracket_s, x],
            [y, y],
            color=mark.colour,
            lw=5,
            alpha=0.6,
            solid_capstyle="butt",
            gid=f"headline-bracket-{name}",
            zorder=4,
        )
    rx.plot(
        [x],
        [y],
        ls="none",
        zorder=5,
        gid=f"headline-marker-{name}",
        **mark_style(mark.marker, mark.colour, mark.size),
    )
    rx.annotate(
        mark.texts[0],
        (x, y + LABEL_ABOVE_ROW),
        xytext=(LABEL_PAD_PT, 0),
        textcoords="offset points",
        ha="left",
        va="bottom",
        fontsize="x-small",
        gid=f"headline-label-{name}",
        bbox={"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.85},
        zorder=6,
        annotation_clip=False,
    ).set_in_layout(False)


def _break(left: Any, right: Any) -> None:
    """Draw the axes columns `left` and `right` as one broken axis: the spines between them hidden, a
    pair of slashes on each side."""
    for a, b in zip(left, right, strict=True):
        a.spines["right"].set_visible(False)
        b.spines["left"].set_visible(False)
        b.tick_params(axis="y", length=0)
        kwargs: dict[str, Any] = {
            "marker": [(-1, -1.5), (1, 1.5)],
            "markersize": 8,
            "linestyle": "none",
            "color": "black",
            "mec": "black",
            "mew": 0.9,
            "clip_on": False,
        }
        a.plot([1, 1], [0, 1], transform=a.transAxes, **kwargs)
        b.plot([0, 0], [0, 1], transform=b.transAxes, **kwargs)
