"""The sweep's figure: step time over native against the switching delay (Opus Figure 10; drawn by
labctl.workload.sweep)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt

from labctl.analysis.figures import ALL_FORMATS
from labctl.analysis.plot_files import save_figure
from labctl.analysis.plot_style import styled


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
        paths = save_figure(fig, out, ALL_FORMATS)  # one figure per sweep, for a paper: its vector forms too
        plt.close(fig)
    return paths
