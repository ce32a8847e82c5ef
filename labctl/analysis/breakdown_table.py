"""The breakdown's table: its columns (one row per measured reconfiguration × affected port), their types,
and its files (breakdown.csv, breakdown.parquet).

A missing mark is empty (pandas <NA>, an empty CSV cell), never 0; `impossible` and `unresolved` name the
row's flagged phases, comma-separated (empty: none).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from labctl.core.fileio import atomic_path

COLUMNS = [
    "reconfig",
    "phase",
    "rail",
    "host",
    "port",
    "t0_command_ns",
    "t1_switch_done_ns",
    "t2_rx_power_ns",
    "t3_firmware_up_ns",
    "t4_carrier_up_ns",
    "t5_traffic_ns",
    "switch_ns",
    "optical_ns",
    "firmware_ns",
    "carrier_ns",
    "transport_ns",
    "total_ns",
    "carrier_down_ns",
    "traffic_lost_ns",
    "timed_out",
    # added after the first release; append only
    "source",
    "peer",
    "t2_resolution_ns",
    "t3_resolution_ns",
    "t4_resolution_ns",
    "t5_resolution_ns",
    "clock_uncertainty_ns",
    "impossible",
    "unresolved",
    "transport",
    "t2_source",
    "link_setting",
]
DURATIONS = COLUMNS[COLUMNS.index("switch_ns") : COLUMNS.index("traffic_lost_ns") + 1]
"""The phase durations (and the two down-side delays): switch_ns .. traffic_lost_ns."""
FLAG_COLUMNS = ("impossible", "unresolved")
INT_COLUMNS = [c for c in COLUMNS if c.endswith("_ns")] + ["reconfig", "rail"]


def breakdown_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=COLUMNS)
    for col in INT_COLUMNS:
        frame[col] = pd.array([None if pd.isna(x) else int(x) for x in frame[col]], dtype="Int64")
    frame["timed_out"] = frame["timed_out"].fillna(False).astype(bool)
    for col in ("phase", "host", "port", "source", "peer", "transport"):
        frame[col] = frame[col].astype("string")
    frame["t2_source"] = frame["t2_source"].astype("string").fillna("")
    frame["link_setting"] = frame["link_setting"].astype("string").fillna("")
    for col in FLAG_COLUMNS:
        frame[col] = frame[col].fillna("").astype("string")
    return frame


def read_breakdown_csv(path: Path) -> pd.DataFrame:
    frame = pd.read_csv(
        path,
        dtype={c: "Int64" for c in INT_COLUMNS if c != "timed_out"}
        | {"phase": "string"}
        | dict.fromkeys(FLAG_COLUMNS, "string"),
    )
    frame["timed_out"] = frame["timed_out"].astype(bool)
    if "link_setting" in frame:
        frame["link_setting"] = frame["link_setting"].astype("string").fillna("")
    for col in FLAG_COLUMNS:  # breakdowns written before these columns existed have none flagged
        frame[col] = (
            frame[col].fillna("") if col in frame else pd.Series("", index=frame.index, dtype="string")
        )
    return frame


def write_breakdown(frame: pd.DataFrame, run_dir: Path) -> None:
    with atomic_path(run_dir / "breakdown.csv") as tmp:
        frame.to_csv(tmp, index=False)
    with atomic_path(run_dir / "breakdown.parquet") as tmp:
        frame.to_parquet(tmp, index=False)
