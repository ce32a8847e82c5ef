"""Hosts' clock uncertainty in a breakdown: per host, how uncertain the clock offset its stamps were moved
by is (`clock_uncertainties`, compute_breakdown's input), and where that is larger than a phase that crosses
from the controller's clock to the host's (`clock_caveats`: not resolved there)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd


def clock_uncertainties(offsets: Mapping[str, Any]) -> dict[str, int]:
    """Per host, the uncertainty of the clock offset its stamps were moved by (run.json's `clock_offsets`):
    the run's clock model states it (`source` says which: shared-clock, exchange, a daemon; decision 0040);
    runs recorded before it give the largest uncertainty of every re-measurement in their history."""
    out = {}
    for host, estimate in offsets.items():
        if "source" in estimate:
            out[host] = int(estimate.get("uncertainty_ns", 0))
            continue
        history = estimate.get("history") or [estimate]
        out[host] = max(int(e.get("uncertainty_ns", 0)) for e in history)
    return out


# Phases that subtract a controller mark (t0: the command) from one stamped on a host (an agent's clock).
CROSS_CLOCK = ("optical_ns", "total_ns", "carrier_down_ns", "traffic_lost_ns")


def clock_caveats(frame: pd.DataFrame, offsets: dict[str, Any]) -> list[str]:
    """Where a host's clock-offset uncertainty is larger than the median of a phase that crosses from the
    controller's clock to that host's: that phase is not resolved there (one line per host and phase)."""
    rows = frame[frame["reconfig"] > 0]
    out = []
    for host, uncertainty in sorted(clock_uncertainties(offsets).items()):
        mine = rows[rows["host"] == host]
        for col in CROSS_CLOCK:
            values = mine[col].dropna().to_numpy(dtype=np.int64)
            if values.size and uncertainty > (median := float(np.median(values))):
                phase = col.removesuffix("_ns")
                out.append(
                    f"{host}: clock offset uncertainty ±{uncertainty / 1e6:.3f} ms exceeds its {phase} phase "
                    f"(median {median / 1e6:.3f} ms over {values.size} port rows): not resolved there"
                )
    return out
