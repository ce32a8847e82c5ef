"""A run's catalogue record: its row of the catalogue (identity, experiment and its hash, lab, inventory
hash, profile, seed, labctl version, start and end, status, per-phase summary) from its run.json and
summary.json, written as `runs/<id>/catalog.json` when the run ends (`write_record`; decision 0058).
Nothing here imports pandas or duckdb."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from labctl.core.errors import InputError
from labctl.core.fileio import write_json_atomic

RECORD = "catalog.json"
"""A finished run's row of the catalogue, in its own directory."""
CATALOG_VERSION = 1
"""Bumped when a row's columns change: a cache or record of another version is re-derived."""


PHASES = ("switch", "optical", "firmware", "carrier", "transport", "total", "carrier_down", "traffic_lost")
"""The breakdown's phases (labctl.analysis.breakdown_table.DURATIONS without `_ns`; a test holds them
equal)."""
PHASE_STATS = ("n", "min", "median", "p95", "max")

_TEXT, _INT, _BOOL = "VARCHAR", "BIGINT", "BOOLEAN"
COLUMNS: dict[str, str] = {
    "run_id": _TEXT,
    "dir": _TEXT,  # the run's directory name in the runs directory
    "experiment": _TEXT,
    "experiment_hash": _TEXT,
    "lab": _TEXT,
    "inventory_hash": _TEXT,
    "profile": _TEXT,
    "profile_hash": _TEXT,
    "seed": _INT,
    "labctl_version": _TEXT,
    "git": _TEXT,
    "host": _TEXT,
    "pid": _INT,
    "recorded_status": _TEXT,
    "error": _TEXT,
    "started_ns": _INT,
    "finished_ns": _INT,
    "events": _INT,
    "reconfigurations": _INT,
    "port_rows": _INT,
    "timed_out": _INT,
    "flagged_rows": _INT,
    "has_breakdown": _BOOL,
    **{f"{phase}_{stat}" + ("" if stat == "n" else "_ns"): _INT for phase in PHASES for stat in PHASE_STATS},
    "source": _TEXT,  # what the row was read from: record (catalog.json) or run.json
    "fingerprint": _TEXT,  # the source files' mtimes and sizes when it was read: unchanged, not re-read
    "catalog_version": _INT,
}
"""Every column of a row and its DuckDB type; the cache adds `started` and `finished` as TIMESTAMPs (UTC)."""
RECORD_KEYS = [c for c in COLUMNS if c not in ("dir", "source", "fingerprint")]
"""What catalog.json holds: a row without where and how it was read."""


def _digest(value: Any) -> str | None:
    """A short content hash of a JSON value (keys sorted): equal experiments or inventories hash equal."""
    if value is None:
        return None
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def read_json_object(path: Path) -> dict[str, Any] | None:
    """A JSON object from `path`, or None where it is missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _section(data: dict[str, Any], key: str) -> dict[str, Any]:
    """data[key] where it is a JSON object, else empty (a field an older or damaged run.json lacks)."""
    value = data.get(key)
    return value if isinstance(value, dict) else {}


def record_of(run_dir: Path, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """A run's catalogue row (RECORD_KEYS) from its run.json and summary.json. InputError where run.json
    is not readable (not a run directory, or a damaged one)."""
    if meta is None:
        meta = read_json_object(run_dir / "run.json")
        if meta is None:
            raise InputError(f"{run_dir}: run.json is missing or not a readable JSON object")
    experiment, inventory = _section(meta, "experiment"), _section(meta, "inventory")
    profile, versions = _section(meta, "profile"), _section(meta, "versions")
    controller = _section(_section(meta, "time_sync"), "controller")
    summary = read_json_object(run_dir / "summary.json") or {}
    phases = _section(summary, "phases")
    row: dict[str, Any] = {
        "run_id": str(meta.get("run_id") or run_dir.name),
        "experiment": experiment.get("name"),
        "experiment_hash": _digest(meta.get("experiment")),
        "lab": inventory.get("lab"),
        "inventory_hash": _digest(meta.get("inventory")),
        "profile": profile.get("name"),
        "profile_hash": _digest({k: v for k, v in profile.items() if k != "name"} if profile else None),
        "seed": _int(meta.get("seed")),
        "labctl_version": versions.get("labctl"),
        "git": versions.get("git"),
        "host": controller.get("host"),
        "pid": _int(meta.get("pid")),
        "recorded_status": str(meta.get("status", "unknown")),
        "error": None if meta.get("error") is None else str(meta.get("error")),
        "started_ns": _int(meta.get("started_wall_ns")),
        "finished_ns": _int(meta.get("finished_wall_ns")),
        "events": _int(meta.get("events")),
        "reconfigurations": _int(summary.get("reconfigurations")),
        "port_rows": _int(summary.get("rows")),
        "timed_out": _int(summary.get("timed_out")),
        "flagged_rows": _int(summary.get("flagged_rows")),
        "has_breakdown": (run_dir / "breakdown.parquet").is_file(),
        "catalog_version": CATALOG_VERSION,
    }
    for phase in PHASES:
        stats = _section(phases, phase)
        for stat in PHASE_STATS:
            row[f"{phase}_{stat}" + ("" if stat == "n" else "_ns")] = _int(stats.get(stat))
    return row


def write_record(run_dir: Path) -> dict[str, Any]:
    """Write the run's catalogue row (catalog.json) from its run.json and summary.json, atomically: the
    last thing a run writes, so a run with one has finished writing its directory."""
    record = record_of(run_dir)
    write_json_atomic(run_dir / RECORD, record)
    return record
