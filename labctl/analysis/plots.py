"""Plots of a run: the headline (one port's recovery on a log time axis, Opus Fig. 9 style), the timeline of
one reconfiguration (every rail, in full and zoomed on each cluster of marks, like Fig. 9c/9d) and the
distribution of each phase over all reconfigurations (box plots and one empirical CDF per phase, the
recovery phases in pipeline order apart from the down side).

Each figure is written as PNG by default, and as SVG (text kept as text) and PDF (TrueType fonts) on
request (`formats`), in labctl's packaged matplotlib style (labctl/analysis/styles/labctl.mplstyle) with
an optional user style on top of it: the `style` argument (a style name or a .mplstyle path), else
$LABCTL_MPLSTYLE.

Artists that tests (and users post-processing a figure) look for carry a gid: `rx-threshold` (the Rx-power
threshold line), `mark-t1` … `mark-t5` (the marks; `mark-tN-spread` the p5–p95 whiskers when ports are
summarized per rail), `rx-rail-R` (a rail's Rx traces), `ocs-rail-R` (a rail's switch command bar),
`cdf-PHASE` (a phase's CDF axis), `box-recovery` / `box-down` (the box plots); in the headline
`headline-rx` (the port's Rx trace), `headline-rx-spread` (p5–p95 over the ports), `headline-mark-tN`
(a mark's line, label `headline-label-tN`, bracket `headline-bracket-tN`, spread `headline-spread-tN`),
`headline-light-lost` / `headline-light-back` (the shaded brackets the light went out and came back in),
`headline-floor` and `headline-floor-label` (the no-light floor line and its label).
"""

from __future__ import annotations

import io
import itertools
import logging
import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

from labctl.core.events import Kind

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.cbook import pts_to_poststep
from matplotlib.collections import PolyCollection
from matplotlib.font_manager import FontProperties
from matplotlib.layout_engine import ConstrainedLayoutEngine
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter
from matplotlib.transforms import Bbox

from labctl.analysis.breakdown import (
    DEFAULT_THRESHOLD_DBM,
    DURATIONS,
    UNITS,
    EventIndex,
    Series,
    compute_breakdown,
    phase_values,
)
from labctl.analysis.figures import ALL_FORMATS, DEFAULT_FORMATS, FIGURES
from labctl.core.errors import InputError
from labctl.core.fileio import atomic_path

ZOOM_S = 0.7
NO_LIGHT_DBM = -40.0
MAX_PORT_ROWS = 8
"""Above this many ports a timeline draws one row per rail (ports up as a fraction, marks as median with a
p5–p95 whisker) instead of one row per port: 16 port rows of three lanes each are too dense to read, and the
headline figure shows one port in full."""
ZOOM_SPLIT = 0.3
"""The timeline's zoom is split in two windows (a broken axis) where the widest gap between its marks is
more than this share of the time from the command to the last mark: switching in ms, firmware in s."""
FLAGS = ("impossible", "unresolved")
PHASE_NAMES = frozenset(c.removesuffix("_ns") for c in DURATIONS)
STYLE_ENV = "LABCTL_MPLSTYLE"
DEFAULT_STYLE = Path(__file__).parent / "styles" / "labctl.mplstyle"
RASTER_FORMATS = frozenset({"png"})
"""Formats savefig rasterises at savefig.dpi (with Agg): their layout is worked out once (_render)."""
LANES = (
    (Kind.LINK_FIRMWARE, "firmware link", "#9467bd"),
    (Kind.CARRIER, "carrier", "#2ca02c"),
    ("traffic", "traffic", "#8c564b"),
)
LANE_OFFSET = 0.27  # lane j of a row group is centred at y + LANE_OFFSET * (1 - j): the group centre is y
LANE_HEIGHT = 0.23
DOWN_ALPHA = 0.16
# (column, name, marker, colour, marker size, lane it sits on: 0 firmware, 1 carrier, 2 traffic)
# Mark and lane colours stay clear of the rails' (the style's cycle: blue, vermillion, ...).
MARKS = (
    ("t1_switch_done_ns", "t1 switch done", "|", "#000000", 11, 0),
    ("t2_rx_power_ns", "t2 Rx power ≥ threshold", "o", "#e6ab02", 5, 1),
    ("t3_firmware_up_ns", "t3 firmware up", "D", "#9467bd", 5, 0),
    ("t4_carrier_up_ns", "t4 carrier up", "s", "#2ca02c", 5, 1),
    ("t5_traffic_ns", "t5 traffic", ">", "#8c564b", 6, 2),
)
RAIL_DASHES = ("-", "--", "-.", ":")
"""Rx traces of rail i: line style i (and wider the earlier the rail), so a rail whose traces coincide with
a later rail's still shows under them."""


# --- style ---------------------------------------------------------------------------------------------


def resolve_style(style: str | os.PathLike[str] | None = None) -> list[str]:
    """The styles to apply, packaged default first: `style`, else $LABCTL_MPLSTYLE, on top of it. A style is
    a path to a .mplstyle file or a name matplotlib knows (`matplotlib.style.available`, or `labctl`).
    Raises InputError (one line) for anything else."""
    origin = "style"
    if style is None or str(style) == "":
        style, origin = os.environ.get(STYLE_ENV) or None, f"${STYLE_ENV}"
    styles = [str(DEFAULT_STYLE)]
    if style is None:
        return styles
    text = os.fspath(style)
    path = Path(text).expanduser()
    if path.is_file():
        styles.append(str(path))
    elif text in plt.style.available or text == "default":
        styles.append(text)
    elif text != "labctl":
        if path.exists():
            why = "is not a file"
        elif isinstance(style, os.PathLike) or os.sep in text or text.endswith(".mplstyle"):
            why = "no such file"
        else:
            why = (
                "neither a .mplstyle file nor a matplotlib style name "
                "(see matplotlib.style.available, e.g. ggplot, seaborn-v0_8-paper)"
            )
        raise InputError(f"matplotlib {origin} {text!r}: {why}")
    return styles


@contextmanager
def styled(style: str | os.PathLike[str] | None = None) -> Iterator[None]:
    """Draw inside labctl's style plus the user's (see resolve_style). A style file matplotlib cannot read,
    or with a key or value it rejects, is an InputError naming the file and the line."""
    styles = resolve_style(style)
    logged = _Collect()
    log = logging.getLogger("matplotlib")  # where matplotlib reports a bad key or value in a style file
    with ExitStack() as stack:
        log.addHandler(logged)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    stack.enter_context(plt.style.context(styles))
                except (OSError, ValueError, KeyError) as e:
                    raise InputError(f"matplotlib style {styles[-1]!r}: {_one_line(e)}") from None
        finally:
            log.removeHandler(logged)
        problems = [r.getMessage() for r in logged.records]
        for w in caught:
            if issubclass(w.category, DeprecationWarning):
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
            else:
                problems.append(str(w.message))
        if problems:
            raise InputError(f"matplotlib style {styles[-1]!r}: {_first_line(problems[0])}")
        yield


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), text.strip())


def _one_line(what: object) -> str:
    lines = [line.strip() for line in str(what).splitlines() if line.strip()]
    return "; ".join(lines) if lines else type(what).__name__


def _rail_colours(rails: Sequence[Any]) -> dict[Any, str]:
    cycle = [str(c) for c in plt.rcParams["axes.prop_cycle"].by_key().get("color", ["C0"])]
    return {rail: cycle[i % len(cycle)] for i, rail in enumerate(rails)}


# --- signals -------------------------------------------------------------------------------------------


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


def _held_trace(s: Series, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
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


def _left_out(rows: pd.DataFrame, phase: str) -> dict[str, np.ndarray]:
    """Per flag column the frame has (`impossible`, `unresolved`: comma-separated names of the row's phases
    flagged so), the rows whose flag names `phase`: left out of that phase, as from the statistics. A flag
    that names no known phase leaves out every phase of its row."""
    out = {}
    for flag in FLAGS:
        if flag not in rows.columns:
            continue
        column = rows[flag]
        if pd.api.types.is_bool_dtype(column):  # a plain yes/no flag: every phase of the row
            column = column.fillna(False).map({True: "?", False: ""})
        names = [{n.strip() for n in str(v).split(",")} - {""} for v in column.astype("string").fillna("")]
        out[flag] = np.array([phase in n or (bool(n) and not n & PHASE_NAMES) for n in names], dtype=bool)
    return out


def _ns_values(rows: pd.DataFrame, col: str) -> np.ndarray:
    return rows[col].dropna().to_numpy(dtype=np.float64)


# --- output --------------------------------------------------------------------------------------------


def _save(fig: Any, out: Path, formats: Sequence[str] = DEFAULT_FORMATS) -> list[Path]:
    return write_files(out, render_files(fig, formats))


def _draw_and_save(
    draw: Callable[[], Any], out: Path, style: str | os.PathLike[str] | None, formats: Sequence[str]
) -> list[Path]:
    """Draw a figure under `style`, write it to `out` in each format, close it; returns the paths."""
    with styled(style):
        fig = draw()
        try:
            return _save(fig, out, formats)
        finally:
            plt.close(fig)


def render_files(fig: Any, formats: Sequence[str]) -> dict[str, bytes]:
    """The figure as each format's file holds it (what savefig writes), in memory."""
    return {fmt: _render(fig, fmt) for fmt in formats}


def write_files(out: Path, files: dict[str, bytes]) -> list[Path]:
    """Write render_files' output beside `out` (`out.FORMAT`, each atomically); returns the paths."""
    paths = []
    for fmt, blob in files.items():
        path = out.with_suffix("." + fmt)
        with atomic_path(path) as tmp:
            tmp.write_bytes(blob)
        paths.append(path)
    return paths


def _render(fig: Any, fmt: str) -> bytes:
    buf = io.BytesIO()
    engine = fig.get_layout_engine()
    if fmt not in RASTER_FORMATS or not isinstance(engine, ConstrainedLayoutEngine) or _rc_layout():
        fig.savefig(buf, format=fmt)
        return buf.getvalue()
    # savefig lays a figure out inside a draw of its own, rendering nothing, before the draw it writes: a
    # quarter of a PNG's time. Laid out here instead, at the dpi it is saved at (text is measured in
    # pixels), then saved without the engine, it is the same file.
    dpi = plt.rcParams["savefig.dpi"]
    figure_dpi = fig.dpi
    fig.set_dpi(figure_dpi if dpi == "figure" else float(dpi))
    try:
        engine.execute(fig)
    finally:
        fig.set_dpi(figure_dpi)
    fig.set_layout_engine(None)
    try:
        fig.savefig(buf, format=fmt)
    finally:
        fig.set_layout_engine(engine)  # a vector format lays it out again, at its own dpi
    return buf.getvalue()


def _rc_layout() -> bool:
    """Whether a style asks every figure for a layout engine (then a figure cannot be left without one)."""
    return bool(plt.rcParams["figure.autolayout"] or plt.rcParams["figure.constrained_layout.use"])


# --- timeline ------------------------------------------------------------------------------------------


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
    return _draw_and_save(lambda: _draw_timeline(index, frame, reconfig, threshold_dbm), out, style, formats)


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
    """Per row (port, or rail) and lane: see _lane_spans."""

    def same_as(self, other: TimelineData) -> bool:
        return (
            (self.reconfig, self.t0, self.span_ns, self.threshold)
            == (other.reconfig, other.t0, other.span_ns, other.threshold)
            and self.rows.equals(other.rows)
            and self.traces.keys() == other.traces.keys()
            and all(_same_arrays(self.traces[s], other.traces[s]) for s in self.traces)
            and len(self.lanes) == len(other.lanes)
            and all(
                len(a) == len(b) and all(_same_arrays(x, y) for x, y in zip(a, b, strict=True))
                for a, b in zip(self.lanes, other.lanes, strict=True)
            )
        )


def _same_arrays(a: tuple[np.ndarray, np.ndarray] | None, b: tuple[np.ndarray, np.ndarray] | None) -> bool:
    if a is None or b is None:
        return a is b
    return all(np.array_equal(x, y, equal_nan=x.dtype.kind == "f") for x, y in zip(a, b, strict=True))


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
        traces={s: _held_trace(index.series(s, Kind.RX_POWER), start, end) for s in sources}
        if traces
        else {},
        lanes=_lane_spans(index, rows, sources, rails, per_rail, start, end) if traces else [],
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
    colours = _rail_colours(rails)
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
        title = f"zoom: first {_ms(hi * 1e3)}" if lo <= 0 else f"zoom: {_ms(lo * 1e3)} – {_ms(hi * 1e3)}"
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
        _time_ticks(ax_lanes, lo, hi)
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


def _lane_spans(
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
            **_mark_style(marker, colour, size),
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
            **_mark_style(marker, colour, size * 1.2),
            zorder=5,
            gid=f"mark-t{k}",
            label=f"{name} (median)",
        )


def _mark_style(marker: str, colour: str, size: float) -> dict[str, Any]:
    """A filled mark gets a thin black edge (it sits on a bar of its own colour); a line mark: one colour."""
    edge = ("black", 0.5) if marker != "|" else (colour, 1.6)
    return {"marker": marker, "ms": size, "color": colour, "mec": edge[0], "mew": edge[1]}


def _lane_legend() -> tuple[list[Any], list[str]]:
    handles: list[Any] = [Patch(color=c) for _, _, c in LANES]
    labels = [f"{name} up" for _, name, _ in LANES]
    handles.append(Patch(color="0.5", alpha=DOWN_ALPHA * 2))
    labels.append("pale: down (empty: not observed)")
    for _col, name, marker, colour, size, _lane in MARKS:
        handles.append(Line2D([], [], ls="none", **_mark_style(marker, colour, size)))
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


# --- headline: one port's recovery on a log time axis (Opus Figure 9) ------------------------------------


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
    return _draw_and_save(
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
    """The port's firmware, carrier and traffic states (see _lane_spans)."""
    lost: tuple[int, int] | None = None
    """The bracket the port's light went out in after the command (ns; _light_lost)."""

    def same_as(self, other: HeadlineData) -> bool:
        return (
            (self.reconfig, self.pick, self.t0, self.windows, self.threshold, self.lost)
            == (other.reconfig, other.pick, other.t0, other.windows, other.threshold, other.lost)
            and self.rows.equals(other.rows)
            and _same_arrays(self.trace, other.trace)
            and len(self.spread) == len(other.spread)
            and all(
                np.array_equal(x, y, equal_nan=True)
                for a, b in zip(self.spread, other.spread, strict=True)
                for x, y in zip(a, b, strict=True)
            )
            and len(self.lanes) == len(other.lanes)
            and all(_same_arrays(a, b) for a, b in zip(self.lanes, other.lanes, strict=True))
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
        trace=_held_trace(rx, start, end),
        spread=[_rx_spread(index, rows, own_t0, window) for window in windows],
        lanes=_lane_spans(index, rows.iloc[[pick]], [source], rails, False, start, end)[0],
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
    colour = _rail_colours(rails)[row["rail"]]
    n = len(rows)
    # Room for each mark's label beside its line, on its own row, in the style's font (_place_headline_labels)
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
        _time_ticks(rx, lo, hi)
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
    _place_headline_labels(fig, axes[1], marks)
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
        head = f"{what.format(threshold=data.threshold)}: {_ms(x * 1e3)}"
        tail = []
        if since is not None and not pd.isna(row[since]):
            tail.append(f"(+{_ms((float(row[col]) - float(row[since])) / 1e6)})")
        res_col = RESOLUTIONS.get(col, "")
        res = float(row[res_col]) if res_col in rows.columns and not pd.isna(row[res_col]) else None
        if res:
            tail.append(f"[bracket {_ms(res / 1e6)}]")
        what_text = what.format(threshold=data.threshold)
        texts = (
            " ".join([head, *tail]),
            *(["\n".join([head, " ".join(tail)])] if tail else []),
            "\n".join([f"{what_text}:", " ".join([_ms(x * 1e3), *tail])]),
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
    ports (whisker); its label above the row (placed by _place_headline_labels)."""
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
        **_mark_style(mark.marker, mark.colour, mark.size),
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


LABEL_PAD_PT = 3.0
"""Points between a label and the mark line it stands beside."""
NEAR_PX = 3.0
"""Mark lines closer than this (pixels) would hide one another: the later is drawn dashed over the other."""
FLOOR_TEXT = f"floor {NO_LIGHT_DBM:g} dBm: no light".replace("-", "−")


def _place_headline_labels(fig: Any, rx_axes: Sequence[Any], marks: Sequence[_HeadlineMark]) -> None:
    """Place each mark's label (top to bottom in pipeline order) and the floor's label where it stays inside
    its axes, crosses no mark line and overlaps no other label, marker, bracket or spread: the label's text
    measured (renderer extents, after the figure's layout) beside its own line, on the side with room,
    then wrapped, then beside the next line over (a mark too close to its neighbour is labelled beside the
    pair, on its own row); failing all, the candidate with the least overlap. Mark lines closer than
    NEAR_PX are drawn dashed over one another so both show."""
    engine = fig.get_layout_engine()
    if engine is not None:
        engine.execute(fig)  # labels stay out of the layout (in_layout False): it holds after they move
    renderer = fig.canvas.get_renderer()
    placed: list[Any] = []  # Bboxes of the labels placed so far
    for ax in rx_axes:
        lines = [a for a in ax.get_lines() if str(a.get_gid()).startswith("headline-mark-")]
        px = {str(a.get_gid()).removeprefix("headline-mark-"): _px(ax, a.get_xdata()[0]) for a in lines}
        order = sorted(lines, key=lambda a: px[str(a.get_gid()).removeprefix("headline-mark-")])
        for before, after in itertools.pairwise(order):
            if abs(_px(ax, after.get_xdata()[0]) - _px(ax, before.get_xdata()[0])) < NEAR_PX:
                after.set_linestyle((0, (3, 2)))
                states_line = next(
                    (a for a in fig.findobj(Line2D) if a.get_gid() == f"{after.get_gid()}-states"), None
                )
                if states_line is not None:
                    states_line.set_linestyle((0, (3, 2)))
        obstacles = {  # a label may stand beside its own marker (a tall '|' for t0, t1), not on others'
            str(a.get_gid()): _padded(a.get_window_extent(renderer), 0.5 * a.get_linewidth() * fig.dpi / 72)
            for a in ax.get_lines()
            if str(a.get_gid()).startswith(("headline-bracket-", "headline-spread-", "headline-marker-"))
        }
        lines_px = sorted(px.values())
        for mark in marks:
            label = next((t for t in ax.texts if t.get_gid() == f"headline-label-{mark.name}"), None)
            if label is None:
                continue
            own = px[mark.name]
            right = [own, *(p for p in lines_px if p > own)]
            left = [own, *sorted((p for p in lines_px if p < own), reverse=True)]
            room_right = (right[1] if len(right) > 1 else ax.bbox.x1) - own
            room_left = own - (left[1] if len(left) > 1 else ax.bbox.x0)
            sides = ("right", "left") if room_right >= room_left else ("left", "right")
            candidates = [
                (anchors[rank], side, text)
                for rank in range(len(lines_px))
                for text in mark.texts
                for side, anchors in ((s, right if s == "right" else left) for s in sides)
                if rank < len(anchors)
            ]
            others = [box for gid, box in obstacles.items() if gid != f"headline-marker-{mark.name}"]
            placed.append(_place(label, ax, candidates, renderer, lines_px, [*others, *placed]))
    floor: tuple[float, Any, Any] | None = None
    for ax in reversed(list(rx_axes)):  # under the floor line: right end of the last window first
        lines_px = sorted(
            _px(ax, a.get_xdata()[0]) for a in ax.get_lines() if str(a.get_gid()).startswith("headline-mark-")
        )
        label = ax.annotate(
            FLOOR_TEXT,
            (0, NO_LIGHT_DBM - 2),
            xytext=(LABEL_PAD_PT, 0),
            textcoords="offset points",
            ha="left",
            va="center",
            fontsize="x-small",
            color="0.3",
            gid="headline-floor-label",
            annotation_clip=False,
        )
        label.set_in_layout(False)
        ends = [ax.bbox.x1 - 1, ax.bbox.x0 + 1]
        candidates = [
            (ends[0], "left", FLOOR_TEXT),
            *((p, "right", FLOOR_TEXT) for p in reversed(lines_px)),
            *((p, "left", FLOOR_TEXT) for p in lines_px),
            (ends[1], "right", FLOOR_TEXT),
        ]
        box = _place(label, ax, candidates, renderer, lines_px, placed)
        cost = _cost(box, ax.bbox, lines_px, placed)
        if floor is None or cost < floor[0]:
            if floor is not None:
                floor[1].remove()
            floor = (cost, label, box)
        else:
            label.remove()
        if cost == 0:
            break


def _px(ax: Any, x: float) -> float:
    return float(ax.transData.transform((x, 0))[0])


def _padded(box: Any, pad: float) -> Any:
    return Bbox.from_extents(box.x0 - pad, box.y0 - pad, box.x1 + pad, box.y1 + pad)


def _overlap(a: Any, b: Any) -> float:
    w = min(a.x1, b.x1) - max(a.x0, b.x0)
    h = min(a.y1, b.y1) - max(a.y0, b.y0)
    return w * h if w > 0 and h > 0 else 0.0


def _cost(box: Any, inside: Any, lines_px: Sequence[float], taken: Sequence[Any]) -> float:
    """How badly a label's box sits: its area outside the axes, each mark line it crosses, its overlaps."""
    outside = box.width * box.height - _overlap(box, inside)
    crossed = sum(box.x0 < p < box.x1 for p in lines_px)
    return float(10 * outside + 100 * box.height * crossed + sum(_overlap(box, t) for t in taken))


def _place(
    label: Any,
    ax: Any,
    candidates: Sequence[tuple[float, str, str]],
    renderer: Any,
    lines_px: Sequence[float],
    taken: Sequence[Any],
) -> Any:
    """Put `label` at the first candidate (anchor in pixels, side of it, text) that costs nothing, else at
    the cheapest; returns its box (padded by its background)."""
    best: tuple[float, int] | None = None
    for i, candidate in enumerate(candidates):
        cost = _cost(_try(label, ax, candidate, renderer), ax.bbox, lines_px, taken)
        if best is None or cost < best[0]:
            best = (cost, i)
        if cost == 0:
            break
    assert best is not None
    return _try(label, ax, candidates[best[1]], renderer)


def _try(label: Any, ax: Any, candidate: tuple[float, str, str], renderer: Any) -> Any:
    anchor, side, text = candidate
    label.set_text(text)
    x = float(ax.transData.inverted().transform((anchor, 0))[0])
    label.xy = (x, label.xy[1])
    label.xyann = (LABEL_PAD_PT if side == "right" else -LABEL_PAD_PT, 0)
    label.set_horizontalalignment("left" if side == "right" else "right")
    return _padded(label.get_window_extent(renderer), 2.0)


def _time_ticks(ax: Any, lo: float, hi: float) -> None:
    """A window's ticks in the unit that reads best: ms up to a second, s beyond."""
    if max(abs(lo), abs(hi)) < 1.0:
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v * 1e3:.6g} ms" if v else "0"))
    else:
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.6g} s" if v else "0"))
    ax.xaxis.set_major_locator(MaxNLocator(5))


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


# --- distributions -------------------------------------------------------------------------------------


def plot_distributions(
    frame: pd.DataFrame,
    out: Path,
    *,
    style: str | os.PathLike[str] | None = None,
    formats: Sequence[str] = DEFAULT_FORMATS,
) -> list[Path]:
    """Draw distributions_figure and write it to `out` in each format (.png by default); returns the paths."""
    return _draw_and_save(lambda: _draw_distributions(frame), out, style, formats)


def distributions_figure(frame: pd.DataFrame, *, style: str | os.PathLike[str] | None = None) -> Any:
    """Every phase over the measured reconfigurations (not the baseline): a box plot with each port row as a
    dot (left, log scale), beside one empirical CDF per phase (axes gid cdf-PHASE; log scale where the phase
    spans a decade or more), n in every label. A phase's values in rows whose `impossible` or `unresolved`
    column (where the frame has them) names it are left out, as from the statistics, and counted in the
    title. The caller closes the figure."""
    with styled(style):
        return _draw_distributions(frame)


# t0/t1 name a row's switch command: one switching time per command, however many rails it carried
DISTRIBUTION_COLUMNS = (
    "run_id",
    "reconfig",
    "rail",
    "source",
    "peer",
    "t0_command_ns",
    "t1_switch_done_ns",
    *DURATIONS,
    *FLAGS,
)
"""The breakdown columns the distributions draw from (of the measured reconfigurations' rows)."""


def distributions_data(frame: pd.DataFrame) -> pd.DataFrame:
    """What the distributions figure shows: the measured reconfigurations' rows (not the baseline's), in
    the columns it reads (DISTRIBUTION_COLUMNS)."""
    measured = frame[frame["reconfig"] > 0]
    return measured[[c for c in DISTRIBUTION_COLUMNS if c in measured.columns]].reset_index(drop=True)


def _draw_distributions(frame: pd.DataFrame) -> Any:
    return render_distributions(distributions_data(frame))


RECOVERY_PHASES = ("switch_ns", "optical_ns", "firmware_ns", "carrier_ns", "transport_ns", "total_ns")
"""The recovery phases in pipeline order (switch → light → firmware → carrier → traffic), then the total."""
DOWN_PHASES = ("carrier_down_ns", "traffic_lost_ns")
"""The down side: how long after the command the carrier fell and traffic was first lost."""
PHASE_SPANS = {
    "switch": "t0 → t1",
    "optical": "t0 → t2",
    "firmware": "t2 → t3",
    "carrier": "t3 → t4",
    "transport": "t4 → t5",
    "total": "t0 → t5",
    "carrier_down": "t0 → carrier down",
    "traffic_lost": "t0 → traffic lost",
}
PHASE_COLOURS = {
    "switch": MARKS[0][3],
    "optical": MARKS[1][3],
    "firmware": MARKS[2][3],
    "carrier": MARKS[3][3],
    "transport": MARKS[4][3],
    "total": "#555555",
    "carrier_down": "#CC79A7",
    "traffic_lost": "#56B4E9",
}
"""A phase in the colour of the mark it ends at (the timeline's)."""


def render_distributions(measured: pd.DataFrame) -> Any:
    """The distributions figure of distributions_data, in the style in effect; the caller closes it.

    Two sections, each a box plot (log scale, one dot per value) beside one CDF per phase: the recovery
    phases in pipeline order (top to bottom in the box plot, left to right and down in the CDFs), then the
    down side. Each CDF's title names its span of marks and n with its unit (ports × reconfigurations)."""
    left_out = dict.fromkeys(FLAGS, 0)
    sections: list[tuple[str, str, list[tuple[str, np.ndarray, str]]]] = []
    for title, gid, columns in (
        ("recovery after the command, in pipeline order", "box-recovery", RECOVERY_PHASES),
        ("down side after the command", "box-down", DOWN_PHASES),
    ):
        phases = []
        for col in columns:
            if col not in measured.columns:
                continue
            keep = measured[col].notna().to_numpy(dtype=bool)
            for flag, rows in _left_out(measured, col.removesuffix("_ns")).items():
                left_out[flag] += int((keep & rows).sum())
                keep = keep & ~rows
            # Each phase over its own unit, as summary.json counts it (one switching time per switch command).
            kept = measured[keep]
            values = phase_values(kept, col) / 1e6
            if values.size:  # ms; a log axis has no 0 (100 ns floor)
                phases.append(
                    (col.removesuffix("_ns"), np.maximum(values, 1e-4), _n_text(kept, col, values.size))
                )
        if phases:
            sections.append((title, gid, phases))
    n_cols = 2
    grid_rows = [max(1, -(-len(phases) // n_cols)) for _, _, phases in sections] or [1]
    width = float(plt.rcParams["figure.figsize"][0])
    fig = plt.figure(
        figsize=(width, max(float(plt.rcParams["figure.figsize"][1]), 1.45 * sum(grid_rows) + 1.2)),
        layout="constrained",
    )
    grid = fig.add_gridspec(
        sum(grid_rows),
        1 + n_cols,
        width_ratios=[2.0] + [1] * n_cols,
        height_ratios=[1 for _ in range(sum(grid_rows))],
    )
    if not sections:
        ax = fig.add_subplot(grid[:, 0])
        ax.text(0.5, 0.5, "no phase was timed", transform=ax.transAxes, ha="center", va="center")
        ax.set_yticks([])
        ax.set_xlabel("duration (ms, log scale)")
    first_row = 0
    box_axes: list[Any] = []
    for (title, gid, phases), n_rows in zip(sections, grid_rows, strict=False):  # [1] without sections
        ax = fig.add_subplot(
            grid[first_row : first_row + n_rows, 0], sharex=box_axes[0] if box_axes else None
        )
        box_axes.append(ax)
        ax.set_gid(gid)
        data = [values for _, values, _ in phases]
        positions = list(range(len(phases), 0, -1))  # the first phase on top
        # Boxes over the dots (drawn faint beneath): a box a few pixels wide on a log axis still reads; its
        # median is written under the phase's name, so the number never depends on reading the box.
        ax.boxplot(
            data,
            positions=positions,
            orientation="horizontal",
            tick_labels=[
                f"{name} (n={values.size})\nmedian {_ms(float(np.median(values)))}"
                for name, values, _ in phases
            ],
            showfliers=False,
            widths=0.6,
            boxprops={"linewidth": 1.3, "zorder": 3},
            whiskerprops={"linewidth": 1.1, "zorder": 3},
            capprops={"linewidth": 1.1, "zorder": 3},
            medianprops={"color": "black", "linewidth": 2.2, "zorder": 4},
        )
        rng = np.random.default_rng(0)
        for y, (name, values, _) in zip(positions, phases, strict=True):
            ax.scatter(
                values,
                y + rng.uniform(-0.22, 0.22, values.size),
                s=6,
                alpha=0.35,
                color=PHASE_COLOURS[name],
                lw=0,
                zorder=2,
            )
        ax.set_xscale("log")
        ax.set_title(title, loc="left", fontsize="medium")
        ax.set_xlabel("duration (log scale)")
        ax.grid(axis="x", which="both")
        ax.tick_params(axis="y", labelsize="small")
        for slot, (name, values, n_text) in enumerate(phases):
            cdf = fig.add_subplot(grid[first_row + slot // n_cols, 1 + slot % n_cols])
            _draw_cdf(cdf, name, values, n_text)
            if slot % n_cols == 0:
                cdf.set_ylabel("CDF")
        first_row += n_rows
    if len(box_axes) > 1:  # one duration axis for both sections: the down side reads against recovery
        box_axes[0].tick_params(labelbottom=True)
    if box_axes:
        shown = np.concatenate([values for _, _, phases in sections for _, values, _ in phases])
        lo, hi = float(shown.min()) / 1.5, float(shown.max()) * 1.5
        box_axes[0].set_xlim(lo, hi)
        _log_duration_ticks(box_axes[0], lo, hi, width * 2 / (2 + n_cols))
    title = (
        f"Phase durations over {_count_reconfigs(measured)} reconfigurations, each phase over its own unit"
    )
    flagged = [f"{n} {flag}" for flag, n in left_out.items() if n]
    if flagged:
        plural = "s" if sum(left_out.values()) > 1 else ""
        title += f"; left out: {' and '.join(flagged)} phase value{plural}"
    fig.suptitle(title)
    return fig


def _duration(ms: float) -> str:
    """A tick's duration (given in ms) with its unit, in plain digits: 200 µs, 5 ms, 1 s."""
    if ms >= 1000:
        return f"{ms / 1000:.4g} s"
    if ms >= 1:
        return f"{ms:.4g} ms"
    return f"{ms * 1000:.4g} µs"


def _log_duration_ticks(ax: Any, lo: float, hi: float, width_in: float) -> None:
    """Label a log duration axis (ms) in plain units at 1-2-5, 1-3 or 1 per decade: as many as its width
    holds without the labels running into one another (a label ~6 characters of the tick font)."""
    decades = max(np.log10(hi / lo), 1e-9)
    per_decade_pt = 0.8 * width_in * 72 / decades  # the axes take ~80% of their grid cell
    label_pt = 6 * 0.6 * float(FontProperties(size=plt.rcParams["xtick.labelsize"]).get_size_in_points())
    need = 1.4 * label_pt  # between two labels' centres
    if per_decade_pt * np.log10(2) >= need:
        ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    elif per_decade_pt * np.log10(3) >= need:
        ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 3.0)))
    else:  # a decade per label, or every other decade where one is too narrow for its label
        ax.xaxis.set_major_locator(LogLocator(base=10.0 if per_decade_pt >= need else 100.0))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: _duration(v)))
    ax.xaxis.set_minor_formatter(NullFormatter())


def _draw_cdf(cdf: Any, name: str, values: np.ndarray, n_text: str) -> None:
    """One phase's empirical CDF (values in ms) in the unit that reads best, log scale where it spans a
    decade or more, its median marked; the title names the span of marks and n with its unit."""
    cdf.set_gid(f"cdf-{name}")
    colour = PHASE_COLOURS.get(name, "C0")
    median = float(np.median(values))
    unit, scale = next((u, f) for u, f in (("s", 1e3), ("ms", 1.0), ("µs", 1e-3)) if median >= f or u == "µs")
    shown = values / scale
    cdf.ecdf(shown, color=colour, lw=1.4, label=f"{name} (n={values.size})")
    spans_decades = values.min() > 0 and values.max() / values.min() >= 10
    if spans_decades:
        cdf.set_xscale("log")
    cdf.axvline(median / scale, color="0.4", lw=0.7, ls=":")
    # A CDF never passes below 0.5 right of its median, nor above it left of it: room for the label.
    lo, hi = (np.log10(x) if spans_decades else x for x in cdf.get_xlim())
    at = np.log10(median / scale) if spans_decades else median / scale
    right = hi > lo and (at - lo) / (hi - lo) < 0.6
    cdf.annotate(
        f"median {_ms(median)}",
        (median / scale, 0.04 if right else 0.96),
        xycoords=("data", "axes fraction"),
        xytext=(3 if right else -3, 0),
        textcoords="offset points",
        ha="left" if right else "right",
        va="bottom" if right else "top",
        fontsize="x-small",
        color="0.3",
    )
    cdf.set_title(f"{name} ({PHASE_SPANS.get(name, name)})\n{n_text}", loc="left", fontsize="small")
    cdf.set_xlabel(f"{unit}, log scale" if spans_decades else unit, fontsize="small")
    cdf.set_ylim(0, 1.02)
    cdf.set_yticks([0, 0.5, 1])
    cdf.grid(which="major")


def _count_reconfigs(rows: pd.DataFrame) -> int:
    keys = [c for c in ("run_id", "reconfig") if c in rows.columns]
    return len(rows[keys].drop_duplicates()) if keys else 0


def _n_text(kept: pd.DataFrame, col: str, n: int) -> str:
    """n of a phase with its unit (UNITS): switch commands, or ports / circuit ends × reconfigurations
    ("n=120 of 16 ports × 8 reconfigurations" where some are missing or left out)."""
    reconfigs = _count_reconfigs(kept)
    plural = "s" if reconfigs != 1 else ""
    unit = UNITS.get(col, "port")
    if unit == "switch command":
        return f"n={n} switch command{'s' if n != 1 else ''} ({reconfigs} reconfiguration{plural})"
    if unit == "circuit end":
        kept = kept[kept["peer"].fillna("") != ""] if "peer" in kept.columns else kept
    ids = [c for c in ("source",) if c in kept.columns] or [c for c in ("rail", "peer") if c in kept.columns]
    units = len(kept[ids].drop_duplicates()) if ids else n
    word = "circuit ends" if unit == "circuit end" else "ports"
    if units == 1:
        word = word[:-1]
    if n == units * reconfigs:
        return f"n={n}: {units} {word} × {reconfigs} reconfiguration{plural}"
    return f"n={n} of {units} {word} × {reconfigs} reconfiguration{plural}"


def _ms(value: float) -> str:
    """A duration given in ms, in the unit that reads best (as the breakdown table prints it)."""
    if value >= 1000:
        return f"{value / 1000:.3f} s"
    if value >= 1:
        return f"{value:.3g} ms" if value < 100 else f"{value:.0f} ms"
    return f"{value * 1000:.3g} µs"


# --- a run ---------------------------------------------------------------------------------------------


def plot_run(
    run_dir: Path,
    *,
    reconfig: int | None = None,
    frame: pd.DataFrame | None = None,
    index: EventIndex | None = None,
    out_dir: Path | None = None,
    style: str | os.PathLike[str] | None = None,
    threshold_dbm: float | None = None,
    formats: Sequence[str] = DEFAULT_FORMATS,
    figures: Sequence[str] = FIGURES,
    drawn: Sequence[DrawnFigure] = (),
) -> list[Path]:
    """Without `reconfig`: headline.<format> and timeline.<format> of the first reconfiguration after the
    baseline, and distributions.<format>, in each of `formats` (png by default; svg, pdf); `figures` picks
    which of them (labctl.analysis.pool draws them in two processes at once). With it:
    timeline-reconfig-N.<format> only, so each reconfiguration keeps its own. Written into `out_dir`
    (default: the run directory). `style`: a matplotlib style name or
    .mplstyle path applied over labctl's (default: $LABCTL_MPLSTYLE); a bad one is an InputError.
    `threshold_dbm`: the Rx-power threshold line (default: the run's, from its run.start event).
    `drawn`: figures draw_ahead rendered earlier (while the run went on): one's files are written if it
    shows the same data in the same style and formats as the figure due, else that figure is drawn again."""
    resolve_style(style)  # a bad style fails before the events are read
    index = index or EventIndex.from_file(run_dir / "events.jsonl")
    frame = frame if frame is not None else compute_breakdown(index, threshold_dbm)
    out_dir = out_dir or run_dir
    if frame.empty:
        return []
    options: dict[str, Any] = {"threshold_dbm": threshold_dbm, "style": style, "formats": formats}
    if reconfig is not None:
        return plot_timeline(index, frame, reconfig, out_dir / f"timeline-reconfig-{reconfig}", **options)
    paths: list[Path] = []
    for figure in (f for f in FIGURES if f in figures):
        due = _drawn(figure, _figure_data(figure, index, frame, threshold_dbm), style, formats, render=False)
        ahead = next((d for d in drawn if d.shows(due)), None)
        if ahead is not None:
            ahead.kept = True
        else:
            ahead = _drawn(figure, due.data, style, formats)
        paths += write_files(out_dir / figure, ahead.files)
    return paths


# --- figures drawn ahead (labctl.analysis.pool) --------------------------------------------------------


@dataclass(eq=False)
class DrawnFigure:
    """One of a run's figures (FIGURES) rendered in memory with the data it shows (draw_ahead), for
    plot_run to write later if the figure due then shows the same. Each figure is a function of its data
    (timeline_data, distributions_data), the style and the format alone, so the files are the same."""

    figure: str
    data: TimelineData | HeadlineData | pd.DataFrame
    looks: tuple[tuple[str, ...], tuple[str, ...]]
    """The styles and the formats it was rendered in."""
    files: dict[str, bytes]
    """Per format, the file's bytes."""
    kept: bool = False
    """Set by plot_run when it wrote these files rather than draw the figure again."""

    def shows(self, other: DrawnFigure) -> bool:
        """Whether `other` would be drawn the same: the same figure, looks and data."""
        if (self.figure, self.looks) != (other.figure, other.looks):
            return False
        if isinstance(self.data, TimelineData):
            return isinstance(other.data, TimelineData) and self.data.same_as(other.data)
        if isinstance(self.data, HeadlineData):
            return isinstance(other.data, HeadlineData) and self.data.same_as(other.data)
        return isinstance(other.data, pd.DataFrame) and self.data.equals(other.data)


def draw_ahead(
    figure: str,
    index: EventIndex,
    frame: pd.DataFrame,
    *,
    threshold_dbm: float | None = None,
    style: str | os.PathLike[str] | None = None,
    formats: Sequence[str] = DEFAULT_FORMATS,
) -> DrawnFigure | None:
    """One of the run's figures as plot_run would write it from these events, in memory, once what it shows
    is on record; None before then (the headline and the timeline: once a later reconfiguration's command
    is, as they draw nothing past it; the distributions: any time, so ask once the last reconfiguration is
    done)."""
    if frame.empty or (figure in ("headline", "timeline") and not _timeline_on_record(frame)):
        return None
    return _drawn(figure, _figure_data(figure, index, frame, threshold_dbm), style, formats)


def _timeline_on_record(frame: pd.DataFrame) -> bool:
    later = frame.loc[frame["reconfig"] > timeline_reconfig(frame), "t0_command_ns"]
    return bool(later.notna().any())


def _figure_data(
    figure: str, index: EventIndex, frame: pd.DataFrame, threshold_dbm: float | None
) -> TimelineData | HeadlineData | pd.DataFrame:
    if figure == "headline":
        return headline_data(index, frame, timeline_reconfig(frame), threshold_dbm)
    if figure == "timeline":
        return timeline_data(index, frame, timeline_reconfig(frame), threshold_dbm)
    if figure == "distributions":
        return distributions_data(frame)
    raise ValueError(f"no figure {figure!r} (have: {', '.join(FIGURES)})")


def _drawn(
    figure: str,
    data: TimelineData | HeadlineData | pd.DataFrame,
    style: str | os.PathLike[str] | None,
    formats: Sequence[str],
    *,
    render: bool = True,
) -> DrawnFigure:
    """The figure of `data`, rendered in each format (with render=False: only what it would show)."""
    files: dict[str, bytes] = {}
    if render:
        with styled(style):
            if isinstance(data, TimelineData):
                fig = render_timeline(data)
            elif isinstance(data, HeadlineData):
                fig = render_headline(data)
            else:
                fig = render_distributions(data)
            try:
                files = render_files(fig, formats)
            finally:
                plt.close(fig)
    return DrawnFigure(figure, data, (tuple(resolve_style(style)), tuple(formats)), files)


# --- step time vs switching delay (Opus Figure 10; labctl.workload.sweep) ------------------------------


def plot_step_time_vs_delay(
    rows: Sequence[dict[str, Any]], out: Path, *, title: str = "", style: str | os.PathLike[str] | None = None
) -> list[Path]:
    """Step time over native against the switching delay: measured on demand and with provisioning, the
    estimate T_native + T_reconfig × N, and the stall model Σ max(0, T − Wᵢ) from the trace's windows.
    `rows`: one per (switching_ms, mode) with step_ns, native_ns, estimate_ns, model_ns (sweep.csv)."""
    with styled(style):
        fig, ax = plt.subplots(figsize=(6.4, 4.0))
        for mode, colour, marker in (("on-demand", "C0", "o"), ("provisioning", "C1", "s")):
            mine = sorted((r for r in rows if r["mode"] == mode), key=lambda r: float(r["switching_ms"]))
            if not mine:
                continue
            x = [float(r["switching_ms"]) for r in mine]
            ax.plot(
                x,
                [int(r["step_ns"]) / int(r["native_ns"]) for r in mine],
                marker=marker,
                color=colour,
                label=f"{mode} (replayed)",
            )
            if mode == "provisioning":
                ax.plot(
                    x,
                    [int(r["model_ns"]) / int(r["native_ns"]) for r in mine],
                    ls=":",
                    color=colour,
                    label="stall model Σ max(0, T − Wᵢ)",
                )
            else:
                ax.plot(
                    x,
                    [int(r["estimate_ns"]) / int(r["native_ns"]) for r in mine],
                    ls="--",
                    color="0.4",
                    label="estimate T_native + T × N",
                )
        ax.axhline(1.0, color="0.7", lw=0.8, label="native")
        ax.set_xlabel("switching delay (ms)")
        ax.set_ylabel("step time / native")
        if title:
            ax.set_title(title)
        ax.legend(fontsize="small")
        fig.tight_layout()
        paths = _save(fig, out, ALL_FORMATS)  # one figure per sweep, for a paper: its vector forms too
        plt.close(fig)
    return paths
