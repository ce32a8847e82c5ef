"""A tune run's figures by link setting (issue 40 part 2, decision 0080), drawn by `labctl plot RUN`:

- `settings-distributions.<fmt>`: one panel per setting (top to bottom, in the order measured), each a box
  plot of every recovery phase over its own unit (log ms, one dot per value), the panel titled with the
  setting, its reconfigurations and whether it is the reference; every panel on one x axis.
- `settings-timeline.<fmt>`: one Figure-9 style timeline per setting, side by side on one time axis: the
  circuit end whose total link-up is that setting's median, each phase a bar from the command (t0) in
  pipeline order (switch, optical, firmware, carrier, transport), the total written at its end.

Plots in the conventions of labctl.analysis.plots' figures: their style (`styled`) and phase colours
(labctl.analysis.plot_style), atomic files per format (labctl.analysis.plot_files).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import MaxNLocator

from labctl.analysis.distributions_plot import RECOVERY_PHASES
from labctl.analysis.figures import DEFAULT_FORMATS
from labctl.analysis.phase_stats import UNITS, phase_values
from labctl.analysis.plot_files import draw_and_save
from labctl.analysis.plot_style import PHASE_COLOURS

__all__ = [
    "SETTINGS_FIGURES",
    "plot_settings",
    "settings_distributions_figure",
    "settings_of",
    "settings_timeline_figure",
]

SETTINGS_FIGURES = ("settings-distributions", "settings-timeline")
TIMELINE_PHASES = ("switch_ns", "optical_ns", "firmware_ns", "carrier_ns", "transport_ns")
"""The lanes of a setting's timeline: switch and optical from the command (t0 → t1, t0 → t2), then each from
the mark the one before ends at (t2 → t3, t3 → t4, t4 → t5)."""


def settings_of(frame: pd.DataFrame) -> list[str]:
    """The link settings of a breakdown's measured rows in the order measured; empty for a run that is not
    a tune run."""
    if "link_setting" not in frame:
        return []
    rows = frame[(frame["reconfig"] > 0) & (frame["link_setting"].fillna("") != "")]
    return list(dict.fromkeys(rows.sort_values("reconfig")["link_setting"].tolist()))


def _rows(frame: pd.DataFrame, label: str) -> pd.DataFrame:
    return frame[(frame["reconfig"] > 0) & (frame["link_setting"] == label)]


def _title(label: str, rows: pd.DataFrame, reference: str | None) -> str:
    k = rows["reconfig"].nunique()
    return f"{label}{' (reference)' if label == reference else ''}: {k} reconfiguration{'s' * (k != 1)}"


def settings_distributions_figure(frame: pd.DataFrame, reference: str | None = None) -> Any:
    """One panel per setting, each a box plot of every recovery phase (ms, log scale); the caller closes
    it. Each phase's label gives n with its unit."""
    labels = settings_of(frame)
    fig, axes = plt.subplots(
        len(labels), 1, figsize=(8, 0.4 + 1.9 * len(labels)), sharex=True, squeeze=False, layout="constrained"
    )
    for ax, label in zip(axes[:, 0], labels, strict=True):
        rows = _rows(frame, label)
        data, names, colours = [], [], []
        for col in reversed(RECOVERY_PHASES):  # pipeline order top to bottom
            values = phase_values(rows, col) / 1e6
            values = values[values > 0]
            if not values.size:
                continue
            name = col.removesuffix("_ns")
            data.append(values)
            names.append(f"{name} (n={values.size} {UNITS[col]}s)")
            colours.append(PHASE_COLOURS[name])
        if data:
            box = ax.boxplot(data, orientation="horizontal", tick_labels=names, showfliers=False, widths=0.6)
            for patch, colour in zip(box["medians"], colours, strict=True):
                patch.set_color(colour)
            for y, (values, colour) in enumerate(zip(data, colours, strict=True), 1):
                jitter = np.linspace(-0.15, 0.15, values.size) if values.size > 1 else np.zeros(1)
                ax.scatter(values, y + jitter, s=4, alpha=0.4, color=colour, linewidths=0)
        ax.set_xscale("log")
        ax.grid(axis="x", which="both", alpha=0.3)
        ax.set_title(_title(label, rows, reference), loc="left", fontsize="medium")
    axes[-1, 0].set_xlabel("duration (ms, log scale)")
    fig.suptitle("link-up phases by link setting")
    return fig


def _median_end(rows: pd.DataFrame) -> pd.Series | None:
    """The circuit end whose total link-up is the setting's median (the lower of the two middle ones)."""
    ends = rows[(rows["peer"].fillna("") != "") & rows["total_ns"].notna()]
    ends = ends[ends[list(TIMELINE_PHASES)].notna().all(axis=1)]
    if ends.empty:
        return None
    ordered = ends.sort_values("total_ns", kind="stable")
    row: pd.Series = ordered.iloc[(len(ordered) - 1) // 2]
    return row


def settings_timeline_figure(frame: pd.DataFrame, reference: str | None = None) -> Any:
    """One Figure-9 style timeline per setting, side by side on one time axis (ms after the command); the
    caller closes it."""
    labels = settings_of(frame)
    fig, axes = plt.subplots(
        1,
        len(labels),
        figsize=(1.2 + 3.1 * len(labels), 3.2),
        sharex=True,
        squeeze=False,
        layout="constrained",
    )
    lanes = [c.removesuffix("_ns") for c in TIMELINE_PHASES]
    for ax, label in zip(axes[0, :], labels, strict=True):
        rows = _rows(frame, label)
        row = _median_end(rows)
        ax.set_yticks(range(len(lanes)), lanes if ax is axes[0, 0] else [""] * len(lanes))
        ax.set_ylim(len(lanes) - 0.5, -0.5)
        ax.set_title(
            f"{label}{' (reference)' if label == reference else ''}", loc="left", fontsize="small", wrap=False
        )
        if row is None:
            ax.text(
                0.5, 0.5, "no complete circuit end", transform=ax.transAxes, ha="center", fontsize="small"
            )
            continue
        mark = 0.0  # switch and optical both from t0; firmware from t2, carrier from t3, transport from t4
        for y, col in enumerate(TIMELINE_PHASES):
            name = col.removesuffix("_ns")
            width = float(row[col]) / 1e6
            begin = 0.0 if name == "switch" else mark
            ax.broken_barh([(begin, width)], (y - 0.35, 0.7), color=PHASE_COLOURS[name])
            if name != "switch":
                mark = begin + width
        total = float(row["total_ns"]) / 1e6
        ax.axvline(total, color=PHASE_COLOURS["total"], lw=0.8, ls="--")
        ax.set_xlabel(f"ms after t0; median total {total:.3g} ms", fontsize="small")
        ax.grid(axis="x", alpha=0.3)
    axes[0, 0].set_xlim(left=0)
    for ax in axes[0, :]:
        ax.xaxis.set_major_locator(MaxNLocator(nbins=4))  # a few ticks: four-digit ms labels fit a panel
    fig.suptitle("one circuit end per link setting (the median total link-up): phases from the command")
    return fig


def plot_settings(
    frame: pd.DataFrame,
    out_dir: Path,
    *,
    reference: str | None = None,
    style: str | os.PathLike[str] | None = None,
    formats: Sequence[str] = DEFAULT_FORMATS,
) -> list[Path]:
    """settings-distributions.<fmt> and settings-timeline.<fmt> in `out_dir`; none for a breakdown without
    link settings."""
    if not settings_of(frame):
        return []
    return [
        *draw_and_save(
            lambda: settings_distributions_figure(frame, reference),
            out_dir / SETTINGS_FIGURES[0],
            style,
            formats,
        ),
        *draw_and_save(
            lambda: settings_timeline_figure(frame, reference), out_dir / SETTINGS_FIGURES[1], style, formats
        ),
    ]
