"""Runs on disk: runs/<run-id>/ with run.json, events.jsonl, breakdown.csv/.parquet, summary.json, plots.

run.json is rewritten atomically (write to a temporary file, then rename) so a run killed at any moment
leaves a readable directory: run.json says `running` with the pid of the process that never finished,
and events.jsonl is readable up to its last flush.
"""

from __future__ import annotations

import json
import os
import platform
import secrets
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from labctl.core.errors import InputError
from labctl.core.events import Event, read_events, torn_tail
from labctl.core.fileio import write_json_atomic

if TYPE_CHECKING:  # a run directory is made and updated without pandas: only reading one back needs it
    import pandas as pd

RUN_JSON = "run.json"
EVENTS = "events.jsonl"
BREAKDOWN_CSV = "breakdown.csv"
BREAKDOWN_PARQUET = "breakdown.parquet"
SUMMARY = "summary.json"
STATUSES = ("running", "completed", "failed", "aborted")


def new_run_id(name: str) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    return f"{stamp}-{name}-{secrets.token_hex(2)}"


def versions() -> dict[str, str]:
    from labctl.core.version import __version__

    return {"labctl": __version__, "python": sys.version.split()[0], "platform": platform.platform()}


class RunDir:
    """A run directory being written."""

    def __init__(self, path: Path, meta: dict[str, Any]) -> None:
        self.path = path
        self.meta = meta

    @classmethod
    def create(cls, out_dir: Path, run_id: str, meta: dict[str, Any]) -> RunDir:
        path = out_dir / run_id
        try:
            path.mkdir(parents=True, exist_ok=False)
        except FileExistsError:
            raise InputError(f"{path}: run directory already exists") from None
        except OSError as e:
            raise InputError(f"{path}: cannot create run directory: {e.strerror}") from None
        run = cls(path, {"run_id": run_id, "status": "running", "pid": os.getpid(), **meta})
        run.save()
        return run

    @property
    def events_path(self) -> Path:
        return self.path / EVENTS

    def update(self, **fields: Any) -> None:
        self.meta.update(fields)
        self.save()

    def save(self) -> None:
        write_json_atomic(self.path / RUN_JSON, self.meta)


@dataclass
class Run:
    """A run read back from disk. `events` and `breakdown` are pandas frames."""

    path: Path
    meta: dict[str, Any]
    events: pd.DataFrame
    breakdown: pd.DataFrame
    summary: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    """What was wrong on disk and how it was worked around (a torn last event line, a damaged file)."""

    @property
    def status(self) -> str:
        return str(self.meta.get("status", "unknown"))


def events_frame(events: list[Event]) -> pd.DataFrame:
    import pandas as pd

    frame = pd.DataFrame(
        {
            "seq": pd.array([e.seq for e in events], dtype="int64"),
            "t_ns": pd.array([e.t_ns for e in events], dtype="int64"),
            "wall_ns": pd.array([e.wall_ns for e in events], dtype="Int64"),
            "host": [e.host for e in events],
            "source": [e.source for e in events],
            "kind": [e.kind for e in events],
            "value": [e.value for e in events],
            "reconfig": pd.array([e.reconfig for e in events], dtype="Int64"),
            "meta": [e.meta for e in events],
        }
    )
    for col in ("host", "source", "kind"):
        frame[col] = frame[col].astype("category")
    return frame


def resolve_run_path(path: Path | str) -> Path:
    """A run directory, or the newest run inside a runs/ directory."""
    path = Path(path)
    if (path / RUN_JSON).is_file():
        return path
    if path.is_dir():
        runs = sorted(
            (p for p in path.iterdir() if (p / RUN_JSON).is_file()), key=lambda p: p.stat().st_mtime
        )
        if runs:
            return runs[-1]
        raise InputError(f"{path}: no run directory in it (no {RUN_JSON} here or one level down)")
    raise InputError(f"{path}: no such run directory")


def events_file(run_path: Path) -> Path:
    """The run's events.jsonl; its absence is one clear InputError."""
    path = run_path / EVENTS
    if not path.is_file():
        raise InputError(f"{run_path}: no {EVENTS} (not a labctl run directory, or a damaged one)")
    return path


def load_run(path: Path | str) -> Run:
    """Read a run directory (or the newest run in a runs/ folder) into pandas frames.

    If the run never finished (killed), its breakdown is computed from the events on disk.
    """
    import pandas as pd

    from labctl.analysis.breakdown import compute_breakdown
    from labctl.analysis.breakdown_table import read_breakdown_csv
    from labctl.analysis.clock_uncertainty import clock_uncertainties

    run_path = resolve_run_path(path)
    meta = _json_object(run_path / RUN_JSON)
    notes = damage_notes(run_path)
    events = list(read_events(events_file(run_path)))
    breakdown: pd.DataFrame | None = None
    if (run_path / BREAKDOWN_CSV).exists():
        try:
            breakdown = read_breakdown_csv(run_path / BREAKDOWN_CSV)
        except (pd.errors.EmptyDataError, pd.errors.ParserError, ValueError, KeyError, TypeError) as e:
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            notes.append(f"{BREAKDOWN_CSV} is damaged ({reason}): recomputed from {EVENTS}")
    if breakdown is not None and "impossible" not in breakdown:
        # Written before phases were flagged: its negative durations would be printed as measurements.
        notes.append(f"{BREAKDOWN_CSV} predates the impossible/unresolved flags: recomputed from {EVENTS}")
        breakdown = None
    if breakdown is None:
        breakdown = compute_breakdown(events, None, clock_uncertainties(meta.get("clock_offsets") or {}))
    summary: dict[str, Any] = {}
    if (run_path / SUMMARY).exists():
        try:
            summary = _json_object(run_path / SUMMARY)
            if "flagged_rows" not in summary:  # per port row, unflagged: recomputed from the breakdown
                notes.append(f"{SUMMARY} predates per-unit statistics and flags: recomputed")
                summary = {}
        except InputError as e:
            notes.append(f"{SUMMARY} is damaged ({str(e).split(': ', 1)[-1]}): recomputed from the breakdown")
    return Run(run_path, meta, events_frame(events), breakdown, summary, notes)


def damage_notes(run_path: Path) -> list[str]:
    """What a reader of this run should be told about events.jsonl (today: a torn last line)."""
    torn = torn_tail(events_file(run_path))
    if not torn:
        return []
    return [
        f"{EVENTS}: the last line is torn ({torn} bytes; the writer was killed): every complete line is used"
    ]


def read_run_json(run_dir: Path) -> dict[str, Any]:
    """A run's run.json (InputError if it is not a readable JSON object)."""
    return _json_object(run_dir / RUN_JSON)


def _json_object(path: Path) -> dict[str, Any]:
    """A run's JSON file, which must hold an object: anything else is one clear InputError."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: cannot read: {e}") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data
