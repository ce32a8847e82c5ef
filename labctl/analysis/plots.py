"""Plots of a run: the timeline of one reconfiguration (like Opus Fig. 9c, plus a zoom like Fig. 9d) and the
distribution of each phase over all reconfigurations (box plot and one empirical CDF per phase).

Each figure is written as PNG by default, and as SVG (text kept as text) and PDF (TrueType fonts) on
request (`formats`), in labctl's packaged matplotlib style (labctl/analysis/styles/labctl.mplstyle) with
an optional user style on top of it: the `style` argument (a style name or a .mplstyle path), else
$LABCTL_MPLSTYLE.

Artists that tests (and users post-processing a figure) look for carry a gid: `rx-threshold` (the Rx-power
threshold line), `mark-t1` … `mark-t5` (the marks; `mark-tN-spread` the p5–p95 whiskers when ports are
summarized per rail), `rx-rail-R` (a rail's Rx traces), `cdf-PHASE` (a phase's CDF axis).
"""

from __future__ import annotations

import io
import logging
import os
import warnings
from collections.abc import Iterator, Sequence
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
from matplotlib.layout_engine import ConstrainedLayoutEngine
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from labctl.analysis.breakdown import (
    DEFAULT_THRESHOLD_DBM,
    DURATIONS,
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
MAX_PORT_ROWS = 32
"""Above this many ports a timeline draws one row per rail (ports up as a fraction, marks as median with a
p5–p95 whisker) instead of one row per port."""
FLAGS = ("impossible", "unresolved")
PHASE_NAMES = frozenset(c.removesuffix("_ns") for c in DURATIONS)
STYLE_ENV = "LABCTL_MPLSTYLE"
DEFAULT_STYLE = Path(__file__).parent / "styles" / "labctl.mplstyle"
RASTER_FORMATS = frozenset({"png"})
"""Formats savefig rasterises at savefig.dpi (with Agg): their layout is worked out once (_render)."""
LANES = (
    (Kind.LINK_FIRMWARE, "firmware link", "#9467bd"),
    (Kind.CARRIER, "carrier", "#2ca02c"),
    ("traffic", "traffic", "#1f77b4"),
)
LANE_OFFSET = 0.27  # lane j of a row group is centred at y + LANE_OFFSET * (1 - j): the group centre is y
LANE_HEIGHT = 0.23
DOWN_ALPHA = 0.16
# (column, name, marker, colour, marker size, lane it sits on: 0 firmware, 1 carrier, 2 traffic)
MARKS = (
    ("t1_switch_done_ns", "t1 switch done", "|", "#e67e00", 11, 0),
    ("t2_rx_power_ns", "t2 Rx power ≥ threshold", "o", "#d62728", 5, 1),
    ("t3_firmware_up_ns", "t3 firmware up", "D", "#9467bd", 5, 0),
    ("t4_carrier_up_ns", "t4 carrier up", "s", "#2ca02c", 5, 1),
    ("t5_traffic_ns", "t5 traffic", ">", "#1f77b4", 6, 2),
)


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
    with styled(style):
        fig = _draw_timeline(index, frame, reconfig, threshold_dbm)
        try:
            return _save(fig, out, formats)
        finally:
            plt.close(fig)


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
    index: EventIndex, frame: pd.DataFrame, reconfig: int, threshold_dbm: float | None = None
) -> TimelineData:
    """What the timeline of `reconfig` shows (see timeline_figure). It never reaches past the next
    reconfiguration's command, so once that is on record, later events change nothing of it."""
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
        traces={s: _held_trace(index.series(s, Kind.RX_POWER), start, end) for s in sources},
        lanes=_lane_spans(index, rows, sources, rails, per_rail, start, end),
    )


def _window(t0: int, span_ns: int) -> tuple[int, int]:
    """[start, end) of the events a timeline draws: from a little before the command to its span."""
    return t0 - span_ns // 50, t0 + span_ns


def _draw_timeline(index: EventIndex, frame: pd.DataFrame, reconfig: int, threshold_dbm: float | None) -> Any:
    return render_timeline(timeline_data(index, frame, reconfig, threshold_dbm))


def render_timeline(data: TimelineData) -> Any:
    """The timeline figure of `data`, in the style in effect (see timeline_figure); the caller closes it."""
    rows, t0, span_ns, reconfig = data.rows, data.t0, data.span_ns, data.reconfig
    zoom_s = min(ZOOM_S, span_ns / 4e9)
    sources = [str(s) for s in rows["source"]]
    rails = list(dict.fromkeys(rows["rail"].tolist()))
    colours = _rail_colours(rails)
    per_rail = len(sources) > MAX_PORT_ROWS
    n_rows = len(rails) if per_rail else len(sources)
    recovered = rows["total_ns"].dropna()

    font_in = float(plt.rcParams["font.size"]) / 72
    row_in = max(0.3, 3.2 * font_in) * (1.6 if per_rail else 1.0)
    heights = [max(0.7, 0.35 + 2.6 * font_in * len(rails)), max(2.0, 20 * font_in), max(1.2, row_in * n_rows)]
    width = float(plt.rcParams["figure.figsize"][0])
    fig = plt.figure(figsize=(width, sum(heights) + 1.4), layout="constrained")
    axes = fig.subplots(3, 2, sharex="col", gridspec_kw={"height_ratios": heights})

    phase = rows["phase"].iloc[0]
    if recovered.empty:
        outcome = "none recovered"
    else:
        outcome = f"{len(recovered)} recovered, total median {float(recovered.median()) / 1e9:.3f} s"
    n_rails = f"{len(rails)} rail" + ("s" if len(rails) != 1 else "")
    fig.suptitle(f"Reconfiguration {reconfig} → {phase}: {len(sources)} ports on {n_rails}, {outcome}")

    for col, (limit, title) in enumerate(
        ((span_ns / 1e9, "full reconfiguration"), (zoom_s, f"zoom: first {zoom_s:.3g} s"))
    ):
        ax_ocs, ax_rx, ax_lanes = axes[:, col]
        for ax, name in ((ax_ocs, "ocs"), (ax_rx, "rx"), (ax_lanes, "lanes")):
            ax.set_gid(f"{name}-{('full', 'zoom')[col]}")
        ax_ocs.set_title(title)
        _draw_switch(ax_ocs, rows, rails, colours, t0)
        _draw_rx(ax_rx, rows, data.traces, colours, t0, data.threshold, legend=col == 0)
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
        ax_lanes.set_xlabel("time since OCS command (s)")
        ax_lanes.set_xlim(-0.02 * limit, limit)
        ax_lanes.grid(axis="x")
    fig.legend(
        *_lane_legend(),
        loc="outside lower center",
        ncol=5,
        title="per rail: share of ports up; marks = median, whisker p5–p95" if per_rail else None,
    )
    return fig


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
    for tick, rail in zip(ax.get_yticklabels(), rails, strict=True):
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
    """The OCS lane: command → acknowledgement, one bar per rail."""
    for i, rail in enumerate(rails):
        group = rows[rows["rail"] == rail]
        c0, c1 = group["t0_command_ns"].iloc[0], group["t1_switch_done_ns"].iloc[0]
        y = len(rails) - 1 - i
        if not pd.isna(c0) and not pd.isna(c1):
            ax.barh(y, (c1 - c0) / 1e9, left=(c0 - t0) / 1e9, color=MARKS[0][3], height=0.6)
    ax.set_yticks(range(len(rails) - 1, -1, -1), [f"rail {r}" for r in rails])
    for tick, rail in zip(ax.get_yticklabels(), rails, strict=True):
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
) -> None:
    """Rx power per port, one colour per rail; no light on the floor line; the threshold that defines t2."""
    many = len(traces) > MAX_PORT_ROWS
    for source, rail in zip(rows["source"], rows["rail"], strict=True):
        t, v = traces[str(source)]
        ax.step(
            (t - t0) / 1e9,
            np.maximum(v, NO_LIGHT_DBM),
            where="post",
            lw=0.6 if many else 0.9,
            alpha=0.45 if many else 0.8,
            color=colours[rail],
            gid=f"rx-rail-{rail}",
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
        handles = [Line2D([], [], color=colours[r], lw=1.5) for r in colours]
        labels = [f"rail {r} ({int(counts.get(r, 0))} ports)" for r in colours]
        handles.append(Line2D([], [], color="black", lw=0.9, ls="--"))
        labels.append(label)
        ax.legend(handles, labels, loc="center right", ncol=1 if len(labels) <= 5 else 2)


# --- distributions -------------------------------------------------------------------------------------


def plot_distributions(
    frame: pd.DataFrame,
    out: Path,
    *,
    style: str | os.PathLike[str] | None = None,
    formats: Sequence[str] = DEFAULT_FORMATS,
) -> list[Path]:
    """Draw distributions_figure and write it to `out` in each format (.png by default); returns the paths."""
    with styled(style):
        fig = _draw_distributions(frame)
        try:
            return _save(fig, out, formats)
        finally:
            plt.close(fig)


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


def render_distributions(measured: pd.DataFrame) -> Any:
    """The distributions figure of distributions_data, in the style in effect; the caller closes it."""
    left_out = dict.fromkeys(FLAGS, 0)
    names, data = [], []
    for col in DURATIONS:
        keep = measured[col].notna().to_numpy(dtype=bool)
        for flag, rows in _left_out(measured, col.removesuffix("_ns")).items():
            left_out[flag] += int((keep & rows).sum())
            keep = keep & ~rows
        # Each phase over its own unit, as summary.json counts it (one switching time per switch command).
        values = phase_values(measured[keep], col) / 1e6
        if values.size:
            names.append(col.removesuffix("_ns"))
            data.append(np.maximum(values, 1e-4))  # ms; a log axis has no 0 (100 ns floor)
    n_cols = 2 if len(data) > 3 else 1
    n_grid = max(1, -(-len(data) // n_cols))
    width = float(plt.rcParams["figure.figsize"][0])
    fig = plt.figure(
        figsize=(width, max(float(plt.rcParams["figure.figsize"][1]), 1.25 * n_grid + 1)),
        layout="constrained",
    )
    grid = fig.add_gridspec(n_grid, 1 + n_cols, width_ratios=[2.2] + [1] * n_cols)
    ax = fig.add_subplot(grid[:, 0])
    colours = [f"C{i % 10}" for i in range(len(data))]
    if data:
        tick_labels = [f"{name} (n={v.size})" for name, v in zip(names, data, strict=True)]
        ax.boxplot(data, orientation="horizontal", tick_labels=tick_labels, showfliers=False)
        rng = np.random.default_rng(0)
        for i, values in enumerate(data, start=1):
            ax.scatter(
                values, i + rng.uniform(-0.15, 0.15, values.size), s=8, alpha=0.5, color=colours[i - 1]
            )
        ax.set_xscale("log")
    else:
        ax.text(0.5, 0.5, "no phase was timed", transform=ax.transAxes, ha="center", va="center")
        ax.set_yticks([])
    ax.set_xlabel("duration (ms, log scale)")
    ax.grid(axis="x", which="both")
    # Top to bottom like the box plot, whose first phase is at the bottom.
    order = list(range(len(data)))[::-1]
    for slot, i in enumerate(order):
        values, name = data[i], names[i]
        cdf = fig.add_subplot(grid[slot // n_cols, 1 + slot % n_cols])
        cdf.set_gid(f"cdf-{name}")
        median = float(np.median(values))
        unit, scale = next(
            (u, f) for u, f in (("s", 1e3), ("ms", 1.0), ("µs", 1e-3)) if median >= f or u == "µs"
        )
        shown = values / scale
        cdf.ecdf(shown, color=colours[i], lw=1.4, label=f"{name} (n={values.size})")
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
        cdf.set_title(f"{name} (n={values.size})", loc="left", fontsize="medium")
        cdf.set_xlabel(f"{unit}, log scale" if spans_decades else unit, fontsize="small")
        cdf.set_ylim(0, 1.02)
        cdf.set_yticks([0, 0.5, 1])
        cdf.grid(which="major")
        if slot % n_cols == 0:
            cdf.set_ylabel("CDF")
    title = f"Phase durations over {measured['reconfig'].nunique()} reconfigurations × ports"
    flagged = [f"{n} {flag}" for flag, n in left_out.items() if n]
    if flagged:
        plural = "s" if sum(left_out.values()) > 1 else ""
        title += f"; left out: {' and '.join(flagged)} phase value{plural}"
    fig.suptitle(title)
    return fig


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
    """Without `reconfig`: timeline.<format> of the first reconfiguration after the baseline, and
    distributions.<format>, in each of `formats` (png by default; svg, pdf); `figures` picks which of the
    two (labctl.analysis.pool draws them in two processes at once). With it:
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
    data: TimelineData | pd.DataFrame
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
    is on record; None before then (the timeline: once a later reconfiguration's command is, as it draws
    nothing past it; the distributions: any time, so ask once the last reconfiguration is done)."""
    if frame.empty or (figure == "timeline" and not _timeline_on_record(frame)):
        return None
    return _drawn(figure, _figure_data(figure, index, frame, threshold_dbm), style, formats)


def _timeline_on_record(frame: pd.DataFrame) -> bool:
    later = frame.loc[frame["reconfig"] > timeline_reconfig(frame), "t0_command_ns"]
    return bool(later.notna().any())


def _figure_data(
    figure: str, index: EventIndex, frame: pd.DataFrame, threshold_dbm: float | None
) -> TimelineData | pd.DataFrame:
    if figure == "timeline":
        return timeline_data(index, frame, timeline_reconfig(frame), threshold_dbm)
    if figure == "distributions":
        return distributions_data(frame)
    raise ValueError(f"no figure {figure!r} (have: {', '.join(FIGURES)})")


def _drawn(
    figure: str,
    data: TimelineData | pd.DataFrame,
    style: str | os.PathLike[str] | None,
    formats: Sequence[str],
    *,
    render: bool = True,
) -> DrawnFigure:
    """The figure of `data`, rendered in each format (with render=False: only what it would show)."""
    files: dict[str, bytes] = {}
    if render:
        with styled(style):
            fig = render_timeline(data) if isinstance(data, TimelineData) else render_distributions(data)
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
