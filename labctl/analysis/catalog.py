"""The run catalogue: every run of a runs directory as one row (run id, experiment and its hash, lab,
inventory hash, profile, seed, labctl version, start and end, status, per-phase summary), queried with
DuckDB; and the breakdowns of a set of runs, read from their breakdown.parquet files (decision 0058).

Where the rows come from:
- a finished run (completed, failed or aborted) writes its row at its end, atomically, as
  `runs/<id>/catalog.json` (`write_record`: run.json and summary.json flattened);
- a run without one (it crashed, is still going, or predates the catalogue) is indexed from its run.json
  and summary.json when it is read, the same way; so is a run whose run.json is newer than its record;
- `runs/.catalog.parquet` caches every row: each read lists the runs directory, stats each run's record
  (or run.json), re-reads only the runs whose files changed, and writes the cache again (a new file renamed
  over the old) when anything did. No lock: two readers refreshing at once each write a whole, correct
  cache, and the last rename wins. Deleting it loses nothing (`Catalog.rows(rebuild=True)` makes it anew).

A run recorded `running` whose process is gone (same host, the pid dead or since reused) reads `crashed`:
worked out when read, never stored (the run may still be going when the cache is written).

The cache is a plain Parquet file: `duckdb -c "SELECT * FROM 'runs/.catalog.parquet'"` queries it, and
`read_parquet('runs/*/breakdown.parquet', filename = true)` every breakdown, with no labctl involved.
Nothing here imports pandas; duckdb is imported when a catalogue is read.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from labctl.analysis.catalog_filters import Filters
from labctl.analysis.catalog_record import (
    CATALOG_VERSION,
    COLUMNS,
    PHASE_STATS,
    PHASES,
    RECORD,
    RECORD_KEYS,
    read_json_object,
    record_of,
)
from labctl.analysis.run_liveness import effective_status
from labctl.core.errors import InputError

if TYPE_CHECKING:
    import duckdb

CACHE = ".catalog.parquet"
"""Every run's row, in the runs directory (hidden: never taken for a run)."""
EVERY_RUN = Filters()
"""No filter: every run (frozen, so one instance serves as every call's default)."""


def _duckdb() -> Any:
    import duckdb

    return duckdb


def _stat(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except OSError:
        return None


@dataclass
class Catalog:
    """The runs of one runs directory (see the module's docstring)."""

    runs_dir: Path
    skipped: list[str] = field(default_factory=list)
    """Directories that look like runs but could not be indexed, with why (said, never silently dropped)."""

    def __post_init__(self) -> None:
        if not self.runs_dir.is_dir():
            raise InputError(f"{self.runs_dir}: no such runs directory")

    @property
    def cache_path(self) -> Path:
        return self.runs_dir / CACHE

    def _scan(self) -> dict[str, tuple[str, str]]:
        """Each run directory's name -> (source, fingerprint): its record if that is as new as its run.json,
        else its run.json (with its summary.json's time: analysis writes it after run.json)."""
        found: dict[str, tuple[str, str]] = {}
        with os.scandir(self.runs_dir) as entries:
            for entry in entries:
                if entry.name.startswith(".") or not entry.is_dir():
                    continue
                run_json = _stat(f"{entry.path}/run.json")
                if run_json is None:
                    continue  # not a run directory
                record = _stat(f"{entry.path}/{RECORD}")
                if record is not None and record.st_mtime_ns >= run_json.st_mtime_ns:
                    found[entry.name] = ("record", f"r:{record.st_mtime_ns}:{record.st_size}")
                else:
                    summary = _stat(f"{entry.path}/summary.json")
                    parquet = _stat(f"{entry.path}/breakdown.parquet")
                    found[entry.name] = (
                        "run.json",
                        f"j:{run_json.st_mtime_ns}:{run_json.st_size}:"
                        f"{summary.st_mtime_ns if summary else 0}:{int(parquet is not None)}",
                    )
        return found

    def _read(self, name: str, source: str, fingerprint: str) -> dict[str, Any] | None:
        run_dir = self.runs_dir / name
        row: dict[str, Any] | None = None
        if source == "record":
            row = read_json_object(run_dir / RECORD)
            if row is not None and row.get("catalog_version") != CATALOG_VERSION:
                row, source = None, "run.json"  # another labctl's record: derived again
        if row is None:
            try:
                row = record_of(run_dir)
            except InputError:
                self.skipped.append(f"{name}: run.json is not a readable JSON object")
                return None
            source = "run.json"
        return {
            **{k: row.get(k) for k in RECORD_KEYS},
            "dir": name,
            "source": source,
            "fingerprint": fingerprint,
        }

    def _cached(self, con: duckdb.DuckDBPyConnection) -> dict[str, str]:
        """The cache's rows as dir -> fingerprint; empty where there is none or it is unusable (rebuilt)."""
        if not self.cache_path.is_file():
            return {}
        duckdb = _duckdb()
        try:
            rows = con.execute(
                "SELECT dir, fingerprint, catalog_version FROM read_parquet(?)", [str(self.cache_path)]
            ).fetchall()
        except duckdb.Error:
            return {}
        if any(version != CATALOG_VERSION for _, _, version in rows):
            return {}
        return {d: fp for d, fp, _ in rows}

    def _write_cache(self, con: duckdb.DuckDBPyConnection) -> None:
        """The table `runs` as the cache: written beside it under a name of its own, then renamed over it.
        A runs directory this user cannot write is read on every call instead (the cache only saves time)."""
        tmp = self.runs_dir / f"{CACHE}.{os.getpid()}.{secrets.token_hex(3)}.tmp"
        try:
            con.execute(f"COPY runs TO '{_quote(tmp)}' (FORMAT parquet)")
            os.replace(tmp, self.cache_path)
        except (OSError, _duckdb().Error):
            with contextlib.suppress(OSError):
                tmp.unlink()

    def _table(self, con: duckdb.DuckDBPyConnection, rebuild: bool) -> None:
        """Make the table `runs` in `con`: the cache where it is current, refreshed where not."""
        scanned = self._scan()
        cached = {} if rebuild else self._cached(con)
        fresh = [(name, source, fp) for name, (source, fp) in scanned.items() if cached.get(name) != fp]
        gone = [name for name in cached if name not in scanned]
        if cached and not fresh and not gone:
            con.execute(f"CREATE TEMP VIEW runs AS SELECT * FROM read_parquet('{_quote(self.cache_path)}')")
            return
        rows = [row for name, source, fp in fresh if (row := self._read(name, source, fp)) is not None]
        columns = ", ".join(
            f"CAST(unnest(${i}) AS {kind}) AS {name}" for i, (name, kind) in enumerate(COLUMNS.items(), 1)
        )
        params = [[row[name] for row in rows] for name in COLUMNS]
        con.execute(f"CREATE TEMP TABLE fresh AS SELECT {columns}", params)
        timestamps = (
            "CASE WHEN started_ns IS NULL THEN NULL ELSE make_timestamp(started_ns // 1000) END AS started, "
            "CASE WHEN finished_ns IS NULL THEN NULL ELSE make_timestamp(finished_ns // 1000) END AS finished"
        )
        kept = [name for name in cached if name in scanned and cached[name] == scanned[name][1]]
        if kept:
            con.execute(
                f"CREATE TEMP TABLE runs AS SELECT * FROM read_parquet(?) WHERE dir IN (SELECT unnest(?)) "
                f"UNION ALL BY NAME SELECT *, {timestamps} FROM fresh",
                [str(self.cache_path), kept],
            )
        else:
            con.execute(f"CREATE TEMP TABLE runs AS SELECT *, {timestamps} FROM fresh")
        self._write_cache(con)

    def rows(self, filters: Filters = EVERY_RUN, *, rebuild: bool = False) -> list[dict[str, Any]]:
        """The runs that pass `filters`, oldest first, each a dict of COLUMNS plus `path` and its
        effective `status` (see effective_status)."""
        duckdb = _duckdb()
        con = duckdb.connect()
        try:
            self._table(con, rebuild)
            where, params = filters.where()
            names = list(COLUMNS)
            found = con.execute(
                f"SELECT {', '.join(names)} FROM runs WHERE {where} ORDER BY started_ns NULLS FIRST, run_id",
                params,
            ).fetchall()
        finally:
            con.close()
        out = []
        for values in found:
            row = dict(zip(names, values, strict=True))
            row["path"] = str(self.runs_dir / row["dir"])
            row["status"] = effective_status(row)
            if not filters.statuses or row["status"] in filters.statuses:
                out.append(row)
        return out


def _quote(path: Path) -> str:
    return str(path).replace("'", "''")


def row_of_run(run_dir: Path) -> dict[str, Any]:
    """One run directory's catalogue row (as Catalog.rows gives it), read directly: a run named on the
    command line. InputError where it is not a run directory."""
    from labctl.analysis.store import read_run_json

    meta = read_run_json(run_dir)  # its own InputError for a damaged one, naming what is wrong
    record = read_json_object(run_dir / RECORD)
    run_json, record_stat = _stat(str(run_dir / "run.json")), _stat(str(run_dir / RECORD))
    fresh = (
        record is not None
        and record.get("catalog_version") == CATALOG_VERSION
        and record_stat is not None
        and run_json is not None
        and record_stat.st_mtime_ns >= run_json.st_mtime_ns
    )
    row = record if fresh and record is not None else record_of(run_dir, meta)
    out = {**{k: row.get(k) for k in RECORD_KEYS}, "dir": run_dir.name, "path": str(run_dir)}
    out["source"] = "record" if fresh else "run.json"
    out["status"] = effective_status(out)
    return out


def select_runs(
    targets: Sequence[Path | str], filters: Filters, *, default: Path = Path("runs")
) -> list[dict[str, Any]]:
    """The runs a report or a compare side means: each target a run directory (kept if it passes the
    filters) or a runs directory (every run in it that passes them); no target: `default`'s runs. Given
    without filters, a runs directory means its newest run (as `labctl report runs/` always has)."""
    out: list[dict[str, Any]] = []
    for target in targets or [default]:
        path = Path(target)
        if (path / "run.json").is_file():
            row = row_of_run(path)
            if filters.keeps(row):
                out.append(row)
        elif path.is_dir():
            rows = Catalog(path).rows(filters)
            out += rows if filters or not targets else rows[-1:]
            if not filters and not rows:
                raise InputError(f"{path}: no run directory in it (no run.json here or one level down)")
        else:
            raise InputError(f"{path}: no such run or runs directory")
    seen: set[str] = set()
    for row in out:
        where = os.path.realpath(row["path"])
        if where in seen:
            raise InputError(f"{row['path']}: the run {row['dir']} is given twice")
        seen.add(where)
    return out


def phase_summaries(row: dict[str, Any]) -> dict[str, dict[str, int | None]]:
    """A row's per-phase summary as {phase: {n, min_ns, median_ns, p95_ns, max_ns}}."""
    return {
        phase: {
            (stat if stat == "n" else f"{stat}_ns"): row.get(
                f"{phase}_{stat}" + ("" if stat == "n" else "_ns")
            )
            for stat in PHASE_STATS
        }
        for phase in PHASES
    }


def iso(ns: int | None) -> str | None:
    """Wall-clock ns as ISO 8601 in UTC (seconds)."""
    if ns is None:
        return None
    return dt.datetime.fromtimestamp(ns / 1e9, dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def public(row: dict[str, Any]) -> dict[str, Any]:
    """A row as `labctl runs --json` prints it: identity, times in ISO 8601 (and ns), status (the effective
    one, and the recorded one where they differ), counts and the per-phase summary."""
    started, finished = row.get("started_ns"), row.get("finished_ns")
    return {
        "run_id": row["run_id"],
        "path": row["path"],
        "experiment": row["experiment"],
        "experiment_hash": row["experiment_hash"],
        "lab": row["lab"],
        "inventory_hash": row["inventory_hash"],
        "profile": row["profile"],
        "profile_hash": row["profile_hash"],
        "seed": row["seed"],
        "labctl_version": row["labctl_version"],
        "git": row["git"],
        "status": row["status"],
        "recorded_status": row["recorded_status"],
        "error": row["error"],
        "started": iso(started),
        "finished": iso(finished),
        "started_ns": started,
        "finished_ns": finished,
        "duration_s": round((finished - started) / 1e9, 3) if started and finished else None,
        "events": row["events"],
        "reconfigurations": row["reconfigurations"],
        "port_rows": row["port_rows"],
        "timed_out": row["timed_out"],
        "flagged_rows": row["flagged_rows"],
        "has_breakdown": row["has_breakdown"],
        "phases": phase_summaries(row),
    }
