"""Plots of a run: the timeline of one reconfiguration (like Opus Fig. 9c, plus a zoom like Fig. 9d) and the
distribution of each phase over all reconfigurations."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

from labctl.events import Kind

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.patches import Rectangle

from labctl.breakdown import DURATIONS, EventIndex, Series, compute_breakdown
from labctl.errors import InputError
from labctl.fileio import atomic_path

matplotlib.rcParams["svg.fonttype"] = "none"  # SVG text stays text: searchable, editable for a paper

ZOOM_S = 0.7
NO_LIGHT_DBM = -40.0
LANES = (
    (Kind.LINK_FIRMWARE, "firmware link", "#9467bd"),
    (Kind.CARRIER, "carrier", "#2ca02c"),
    ("traffic", "traffic", "#1f77b4"),
)


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


def _save(fig: Any, path: Path) -> None:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format=path.suffix.removeprefix("."))


def plot_timeline(index: EventIndex, frame: pd.DataFrame, reconfig: int, out: Path) -> list[Path]:
    rows = frame[frame["reconfig"] == reconfig]
    if rows.empty:
        known = sorted({int(r) for r in frame["reconfig"].dropna()})
        raise InputError(f"reconfiguration {reconfig} has no affected ports in this run (have: {known})")
    t0 = int(rows["t0_command_ns"].dropna().min())
    last = rows[["t5_traffic_ns", "t4_carrier_up_ns", "t2_rx_power_ns"]].max(skipna=True).max(skipna=True)
    recovered = rows["total_ns"].dropna()
    if len(recovered) < len(rows) or pd.isna(last):
        # Some port never came back (timed out, or the run stopped): draw until the run moved on or ended,
        # not just past the last mark that happened.
        last = max(int(last) if not pd.isna(last) else t0, index.last_ns)
    span_ns = max(int((int(last) - t0) * 1.25), 1_000_000)
    later = frame.loc[frame["reconfig"] > reconfig, "t0_command_ns"].dropna()
    if not later.empty:  # never draw into the next reconfiguration
        span_ns = min(span_ns, int(later.min()) - t0)
    end = t0 + span_ns
    zoom_s = min(ZOOM_S, span_ns / 4e9)
    sources = list(rows["source"])
    labels = [f"{h}/{p}" for h, p in zip(rows["host"], rows["port"], strict=True)]

    fig, axes = plt.subplots(
        3,
        2,
        figsize=(15, 3 + 0.38 * len(sources)),
        sharex="col",
        gridspec_kw={"height_ratios": [0.6, 2.2, max(2.0, 0.32 * len(sources))]},
    )
    phase = rows["phase"].iloc[0]
    if recovered.empty:
        outcome = "none recovered"
    else:
        outcome = f"{len(recovered)} recovered, total median {float(recovered.median()) / 1e9:.3f} s"
    fig.suptitle(f"Reconfiguration {reconfig} → {phase}: {len(sources)} ports, {outcome}")
    for col, (limit, title) in enumerate(
        ((span_ns / 1e9, "full reconfiguration"), (zoom_s, f"zoom: first {zoom_s:.3g} s"))
    ):
        ax_ocs, ax_rx, ax_lanes = axes[:, col]
        ax_ocs.set_title(title, fontsize=10)
        for rail, group in rows.groupby("rail"):
            c0, c1 = group["t0_command_ns"].iloc[0], group["t1_switch_done_ns"].iloc[0]
            if not pd.isna(c0) and not pd.isna(c1):
                ax_ocs.barh(
                    f"rail {rail}", (c1 - c0) / 1e9, left=(c0 - t0) / 1e9, color="#ff7f0e", height=0.6
                )
        ax_ocs.set_ylabel("OCS", rotation=0, ha="right", va="center")
        ax_ocs.tick_params(axis="y", labelsize=7)
        for source, label in zip(sources, labels, strict=True):
            t, v = _held_trace(index.series(source, Kind.RX_POWER), t0 - span_ns // 50, end)
            ax_rx.step((t - t0) / 1e9, np.maximum(v, NO_LIGHT_DBM), where="post", lw=0.8, label=label)
        ax_rx.axhline(NO_LIGHT_DBM, color="0.5", lw=0.6, ls=":")
        ax_rx.text(
            0.995,
            NO_LIGHT_DBM + 1,
            "no light",
            transform=ax_rx.get_yaxis_transform(),
            ha="right",
            fontsize=7,
            color="0.4",
        )
        ax_rx.set_ylim(NO_LIGHT_DBM - 3, 3)
        ax_rx.set_ylabel("Rx power\n(dBm)")
        ax_rx.grid(alpha=0.3)
        for i, source in enumerate(sources):
            y = len(sources) - 1 - i
            for j, (kind, _name, color) in enumerate(LANES):
                spans = [
                    ((a - t0) / 1e9, (b - a) / 1e9) for a, b in _up_intervals(index, source, kind, t0, end)
                ]
                ax_lanes.broken_barh(spans, (y + 0.68 - 0.28 * j, 0.24), color=color)
        ax_lanes.set_yticks(range(len(sources)), labels[::-1], fontsize=7)
        ax_lanes.set_ylim(-0.2, len(sources))
        ax_lanes.set_xlabel("time since OCS command (s)")
        ax_lanes.set_xlim(-0.02 * limit, limit)
        ax_lanes.grid(axis="x", alpha=0.3)
    handles = [Rectangle((0, 0), 1, 1, color=c) for _, _, c in LANES]
    axes[2, 1].legend(handles, [n + " up" for _, n, _ in LANES], loc="lower right", fontsize=7)
    fig.tight_layout()
    paths = [out.with_suffix(".png"), out.with_suffix(".svg")]
    for p in paths:
        _save(fig, p)
    plt.close(fig)
    return paths


def plot_distributions(frame: pd.DataFrame, out: Path) -> Path:
    rows = frame[frame["reconfig"] > 0]
    names, data = [], []
    for col in DURATIONS:
        values = rows[col].dropna().to_numpy(dtype=np.float64) / 1e6
        if values.size:
            names.append(col.removesuffix("_ns"))
            data.append(np.maximum(values, 1e-4))
    fig, ax = plt.subplots(figsize=(10, 4.5))
    if data:
        ax.boxplot(data, orientation="horizontal", tick_labels=names, showfliers=False)
        rng = np.random.default_rng(0)
        for i, values in enumerate(data, start=1):
            ax.scatter(values, i + rng.uniform(-0.15, 0.15, values.size), s=8, alpha=0.5)
        ax.set_xscale("log")
    ax.set_xlabel("duration (ms, log scale)")
    ax.set_title(f"Phase durations over {rows['reconfig'].nunique()} reconfigurations × ports")
    ax.grid(axis="x", alpha=0.3, which="both")
    fig.tight_layout()
    path = out.with_suffix(".png")
    _save(fig, path)
    plt.close(fig)
    return path


def plot_run(
    run_dir: Path,
    *,
    reconfig: int | None = None,
    frame: pd.DataFrame | None = None,
    index: EventIndex | None = None,
    out_dir: Path | None = None,
) -> list[Path]:
    """Without `reconfig`: timeline.png/.svg of the first reconfiguration after the baseline, and
    distributions.png. With it: timeline-reconfig-N.png/.svg only, so each reconfiguration keeps its own.
    Written into `out_dir` (default: the run directory)."""
    index = index or EventIndex.from_file(run_dir / "events.jsonl")
    frame = frame if frame is not None else compute_breakdown(index)
    out_dir = out_dir or run_dir
    if frame.empty:
        return []
    if reconfig is not None:
        return plot_timeline(index, frame, reconfig, out_dir / f"timeline-reconfig-{reconfig}")
    measured = sorted(int(r) for r in frame["reconfig"].dropna().unique())
    first = next((r for r in measured if r > 0), measured[0])
    paths = plot_timeline(index, frame, first, out_dir / "timeline")
    paths.append(plot_distributions(frame, out_dir / "distributions"))
    return paths
