"""Plot of the GPU microbenchmarks: round-trip distributions (ECDF per ping-pong variant) and
pointer-chase cycles per hop against the published ranges."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from .pointer_chase import PUBLISHED
from .suite import SuiteReport

GPU_PLOT = "gpu_pingpong.png"


def plot_reports(run_dir: Path, reports: list[tuple[str | None, SuiteReport]]) -> Path:
    fig, (ax_rt, ax_chase) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [3, 2]})
    styles = {"before": "-", "after": "--"}
    colours: dict[tuple[str, str], str] = {}
    any_rt = False
    for stage, report in reports:
        for r in report.pingpong:
            x = np.sort(r.samples_ns.astype(np.float64))
            y = np.arange(1, x.size + 1) / x.size
            where = (
                f"SM{r.sm_ping}/SM{r.sm_pong}"
                if r.scope == "intra-gpu"
                else f"GPU{r.device}-GPU{r.peer_device}"
            )
            prefix = f"{stage}: " if stage else ""
            label = f"{prefix}{r.scope} {r.variant} ({where}), median {r.round_trip_ns.median:.0f} ns"
            key = (r.scope, r.variant)  # one colour per benchmark, line style per stage
            colour = colours.setdefault(key, f"C{len(colours) % 10}")
            ax_rt.step(x, y, where="post", linestyle=styles.get(stage or "", "-"), color=colour, label=label)
            any_rt = True
    ax_rt.set_xlabel("round trip (ns, %globaltimer)")
    ax_rt.set_ylabel("fraction of round trips ≤ x")
    ax_rt.set_title("ping-pong round trips")
    if any_rt:
        ax_rt.set_xscale("log")
        ax_rt.legend(fontsize=7, loc="lower right")
    ax_rt.grid(True, which="both", alpha=0.3)

    levels: list[str] = []
    medians: list[float] = []
    for stage, report in reports:
        for c in report.chase:
            levels.append(f"{c.level}\n{stage}" if stage else c.level)
            medians.append(c.cycles_per_hop.median)
    if levels:
        xs = np.arange(len(levels))
        ax_chase.bar(xs, medians, color="#1f77b4")
        for xi, label, m in zip(xs.tolist(), levels, medians, strict=True):
            p = PUBLISHED.get(label.split("\n")[0])
            if p is not None:
                ax_chase.plot([xi - 0.4, xi + 0.4], [p.low_cycles] * 2, color="#d62728", lw=1)
                ax_chase.plot([xi - 0.4, xi + 0.4], [p.high_cycles] * 2, color="#d62728", lw=1)
            ax_chase.annotate(f"{m:.0f}", (xi, m), ha="center", va="bottom", fontsize=8)
        ax_chase.set_xticks(xs, levels, fontsize=8)
        ax_chase.set_yscale("log")
    ax_chase.set_ylabel("cycles per hop (median over trials)")
    ax_chase.set_title("pointer chase (red: published range, Table 8)")
    ax_chase.grid(True, axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    path = run_dir / GPU_PLOT
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
