"""The distributions figure: every phase over all measured reconfigurations, a box plot of each section
beside one empirical CDF per phase, the recovery phases in pipeline order apart from the down side.

Artists that tests (and users post-processing a figure) look for carry a gid: `cdf-PHASE` (a phase's CDF
axis), `box-recovery` / `box-down` (the box plots).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.font_manager import FontProperties
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from labctl.analysis.breakdown_table import DURATIONS
from labctl.analysis.figures import DEFAULT_FORMATS
from labctl.analysis.phase_stats import UNITS, phase_values
from labctl.analysis.plot_files import draw_and_save
from labctl.analysis.plot_style import PHASE_COLOURS, format_ms, styled

FLAGS = ("impossible", "unresolved")
PHASE_NAMES = frozenset(c.removesuffix("_ns") for c in DURATIONS)


def plot_distributions(
    frame: pd.DataFrame,
    out: Path,
    *,
    style: str | os.PathLike[str] | None = None,
    formats: Sequence[str] = DEFAULT_FORMATS,
) -> list[Path]:
    """Draw distributions_figure and write it to `out` in each format (.png by default); returns the paths."""
    return draw_and_save(lambda: _draw_distributions(frame), out, style, formats)


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
                f"{name} (n={values.size})\nmedian {format_ms(float(np.median(values)))}"
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
        f"median {format_ms(median)}",
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
