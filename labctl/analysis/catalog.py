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
import hashlib
import json
import os
import re
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from labctl.core.errors import InputError
from labctl.core.fileio import write_json_atomic

if TYPE_CHECKING:
    import duckdb

RECORD = "catalog.json"
"""A finished run's row of the catalogue, in its own directory."""
CACHE = ".catalog.parquet"
"""Every run's row, in the runs directory (hidden: never taken for a run)."""
CATALOG_VERSION = 1
"""Bumped when a row's columns change: a cache or record of another version is re-derived."""

RECORDED_STATUSES = ("running", "completed", "failed", "aborted")
STATUSES = (*RECORDED_STATUSES, "crashed")
"""What `--status` takes: the statuses run.json records, and `crashed` (recorded running, process gone)."""

PHASES = ("switch", "optical", "firmware", "carrier", "transport", "total", "carrier_down", "traffic_lost")
"""The breakdown's phases (labctl.analysis.breakdown.DURATIONS without `_ns`; a test holds them equal)."""
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


def _json_object(path: Path) -> dict[str, Any] | None:
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
        meta = _json_object(run_dir / "run.json")
        if meta is None:
            raise InputError(f"{run_dir}: run.json is missing or not a readable JSON object")
    experiment, inventory = _section(meta, "experiment"), _section(meta, "inventory")
    profile, versions = _section(meta, "profile"), _section(meta, "versions")
    controller = _section(_section(meta, "time_sync"), "controller")
    summary = _json_object(run_dir / "summary.json") or {}
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


# --- filters ---------------------------------------------------------------------------------------------

_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)\s*(m|min|h|d|w)$")
_SECONDS = {"m": 60, "min": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")


def parse_since(text: str, now: dt.datetime | None = None) -> int:
    """`--since` as wall-clock ns: an ISO 8601 date or date-time (local time unless it names its offset
    or Z), `today`, `yesterday`, a weekday (`monday`: the latest Monday at 00:00, today if it is one), or
    an age (`90m`, `36h`, `7d`, `2w`). Anything else is an InputError."""
    now = now or dt.datetime.now().astimezone()
    word = text.strip().lower()
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    when: dt.datetime | None = None
    if word == "today":
        when = midnight
    elif word == "yesterday":
        when = midnight - dt.timedelta(days=1)
    elif word in _WEEKDAYS or (len(word) == 3 and word in [d[:3] for d in _WEEKDAYS]):
        back = (now.weekday() - [d[:3] for d in _WEEKDAYS].index(word[:3])) % 7
        when = midnight - dt.timedelta(days=back)
    elif m := _RELATIVE.match(word):
        when = now - dt.timedelta(seconds=float(m[1]) * _SECONDS[m[2]])
    else:
        try:
            when = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
        except ValueError:
            raise InputError(
                f"--since {text!r}: not a date; use an ISO date or time (2026-12-01, 2026-12-01T14:00), "
                "today, yesterday, a weekday (monday), or an age (36h, 7d)"
            ) from None
        if when.tzinfo is None:
            when = when.astimezone()  # a person's date: this machine's local time
    return int(when.timestamp()) * 1_000_000_000 + when.microsecond * 1000


def parse_statuses(text: str | None) -> frozenset[str]:
    """`--status completed,aborted` as a set; an unknown status is an InputError naming the known ones."""
    if not text:
        return frozenset()
    names = {n.strip().lower() for n in text.split(",") if n.strip()}
    unknown = sorted(names - set(STATUSES))
    if unknown or not names:
        raise InputError(f"--status {text!r}: use one or more of {', '.join(STATUSES)} (comma-separated)")
    return frozenset(names)


@dataclass(frozen=True)
class Filters:
    """Which runs: each given field must match (experiment, lab and profile as names or shell globs)."""

    experiment: str | None = None
    lab: str | None = None
    profile: str | None = None
    since_ns: int | None = None
    statuses: frozenset[str] = frozenset()

    def __bool__(self) -> bool:
        return any((self.experiment, self.lab, self.profile, self.since_ns is not None, bool(self.statuses)))

    def narrowed(self, other: Filters) -> Filters:
        """These filters with `other`'s fields where it sets them (a compare side's own, over the shared)."""
        return replace(
            self,
            **{
                name: value
                for name in ("experiment", "lab", "profile", "since_ns")
                if (value := getattr(other, name)) is not None
            },
            statuses=other.statuses or self.statuses,
        )

    def where(self) -> tuple[str, list[Any]]:
        """The SQL condition of every field but the status (worked out after reading: `crashed`)."""
        terms, params = ["TRUE"], []
        for column in ("experiment", "lab", "profile"):
            value = getattr(self, column)
            if value is not None:
                terms.append(f"{column} GLOB ?")
                params.append(value)
        if self.since_ns is not None:
            terms.append("started_ns >= ?")
            params.append(self.since_ns)
        return " AND ".join(terms), params

    def keeps(self, row: dict[str, Any]) -> bool:
        """Whether one row (with its effective `status`) passes every filter (explicitly named runs)."""
        from fnmatch import fnmatchcase

        for column in ("experiment", "lab", "profile"):
            pattern = getattr(self, column)
            if pattern is not None and not fnmatchcase(str(row.get(column) or ""), pattern):
                return False
        if self.since_ns is not None and (row.get("started_ns") or 0) < self.since_ns:
            return False
        return not self.statuses or row["status"] in self.statuses


FILTER_KEYS = ("experiment", "lab", "profile", "since", "status")
"""The `key=value` filters a compare side takes (the same as the --options)."""


def filters_from(
    experiment: str | None = None,
    lab: str | None = None,
    profile: str | None = None,
    since: str | None = None,
    status: str | None = None,
) -> Filters:
    """Filters from the command line's text (InputError for a bad date or status)."""
    return Filters(
        experiment=experiment,
        lab=lab,
        profile=profile,
        since_ns=parse_since(since) if since is not None else None,
        statuses=parse_statuses(status),
    )


# --- run liveness ----------------------------------------------------------------------------------------


def _boot_time_s() -> float | None:
    try:
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except OSError:
        pass
    return None


def process_alive(pid: int | None, started_ns: int | None) -> bool:
    """Whether the process `pid` still runs and is the one that started a run at `started_ns`: a pid
    since reused by a process started after the run counts as gone (Linux: /proc/<pid>/stat)."""
    if pid is None or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process: it exists
    except OSError:
        return False
    boot = _boot_time_s()
    if boot is None or started_ns is None:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, starttime (after comm's parenthesis)
    except (OSError, ValueError, IndexError):
        return True
    process_started_s = boot + ticks / os.sysconf("SC_CLK_TCK")
    return process_started_s <= started_ns / 1e9 + 2.0  # btime is whole seconds: a little slack


_HOST: str | None = None


def effective_status(row: dict[str, Any]) -> str:
    """The row's status as of now: `crashed` for a run recorded running whose process (on this host) is
    gone; a run recorded running on another host stays `running` (its process cannot be seen from here)."""
    global _HOST
    status = str(row.get("recorded_status") or "unknown")
    if status != "running":
        return status
    if _HOST is None:
        _HOST = os.uname().nodename
    if row.get("host") not in (None, _HOST):
        return status
    return "running" if process_alive(row.get("pid"), row.get("started_ns")) else "crashed"


# --- the catalogue ---------------------------------------------------------------------------------------


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
            row = _json_object(run_dir / RECORD)
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

    def rows(self, filters: Filters = Filters(), *, rebuild: bool = False) -> list[dict[str, Any]]:
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
    record = _json_object(run_dir / RECORD)
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


# --- breakdowns from Parquet -----------------------------------------------------------------------------

BREAKDOWN = "breakdown.parquet"
NEEDED = {
    "reconfig": _INT,
    "rail": _INT,
    "t0_command_ns": _INT,
    "t1_switch_done_ns": _INT,
    "t5_traffic_ns": _INT,
    "peer": _TEXT,
    "impossible": _TEXT,
    "unresolved": _TEXT,
    "timed_out": _BOOL,
    "t2_resolution_ns": _INT,
    "t3_resolution_ns": _INT,
    "t4_resolution_ns": _INT,
    "t5_resolution_ns": _INT,
    "t2_source": _TEXT,
    "link_setting": _TEXT,
    **{f"{phase}_ns": _INT for phase in PHASES},
}
"""The breakdown columns the pooled statistics read (a file without one reads it as empty)."""


def load_breakdowns(con: duckdb.DuckDBPyConnection, table: str, runs: Iterable[dict[str, Any]]) -> list[str]:
    """Make `table` in `con`: the measured rows (reconfig > 0) of every run's breakdown.parquet, with
    `run_id` and `row_number` (the row's place in its file) added; one DuckDB scan of all the files.
    A run without a usable file (it crashed before its analysis, the file is damaged or older than the
    flag columns) has its breakdown computed from its events.jsonl, and is named in the notes returned;
    one without events either is left out, named too."""
    duckdb = _duckdb()
    runs = list(runs)
    good = [r for r in runs if Path(r["path"], BREAKDOWN).is_file()]
    notes: list[str] = []
    recompute: list[tuple[dict[str, Any], str]] = [
        (r, f"no {BREAKDOWN} (the run ended before its analysis)") for r in runs if r not in good
    ]
    schema = ", ".join(f"{name} {kind}" for name, kind in NEEDED.items())
    con.execute(f"CREATE TEMP TABLE {table} (run_id VARCHAR, row_number BIGINT, {schema})")
    while good:
        try:
            _insert_parquet(con, table, good)
            break
        except duckdb.Error:  # find the damaged file(s); read the others in one scan again
            bad = [r for r in good if not _readable(con, Path(r["path"], BREAKDOWN))]
            if not bad:
                raise
            recompute += [(r, f"{BREAKDOWN} is damaged") for r in bad]
            good = [r for r in good if r not in bad]
    if good:
        old = {
            run_id
            for (run_id,) in con.execute(
                f"SELECT DISTINCT run_id FROM {table} WHERE impossible IS NULL"
            ).fetchall()
        }
        if old:
            con.execute(f"DELETE FROM {table} WHERE run_id IN (SELECT unnest(?))", [sorted(old)])
            recompute += [
                (r, f"{BREAKDOWN} predates the impossible/unresolved flags")
                for r in good
                if r["run_id"] in old
            ]
    for run, why in recompute:
        notes.append(_from_events(con, table, run, why))
    return notes


def _insert_parquet(con: duckdb.DuckDBPyConnection, table: str, runs: list[dict[str, Any]]) -> None:
    """The files' rows into `table`, in one scan. Files of one labctl have one schema: the scan binds the
    columns by name from the first file, and reads no other footer before it reads the rows. Where the
    first lacks a column, or another file has another schema (a run of an older labctl), every footer is
    read and the columns a file lacks are empty (DuckDB's union_by_name, ~3x slower)."""
    duckdb = _duckdb()
    files = [str(Path(r["path"], BREAKDOWN)) for r in runs]
    first = {name for (name,) in con.execute("SELECT name FROM parquet_schema(?)", [files[0]]).fetchall()}
    if set(NEEDED) <= first:
        try:
            _scan(con, table, runs, files, set(NEEDED), union=False)
            return
        except duckdb.Error:
            pass  # another schema somewhere: read by the union of them all
    present = {
        name for (name,) in con.execute("SELECT DISTINCT name FROM parquet_schema(?)", [files]).fetchall()
    }
    _scan(con, table, runs, files, present, union=True)


def _scan(
    con: duckdb.DuckDBPyConnection,
    table: str,
    runs: list[dict[str, Any]],
    files: list[str],
    present: set[str],
    *,
    union: bool,
) -> None:
    picked = ", ".join(
        f"CAST(b.{name} AS {kind}) AS {name}" if name in present else f"CAST(NULL AS {kind}) AS {name}"
        for name, kind in NEEDED.items()
    )
    options = f"filename = true, union_by_name = {str(union).lower()}, file_row_number = true"
    con.execute(
        f"INSERT INTO {table} SELECT r.run_id, b.file_row_number AS row_number, {picked} "
        f"FROM read_parquet(?, {options}) AS b "
        "JOIN (SELECT unnest(?) AS filename, unnest(?) AS run_id) AS r USING (filename) WHERE b.reconfig > 0",
        [files, files, [r["run_id"] for r in runs]],
    )


def _readable(con: duckdb.DuckDBPyConnection, path: Path) -> bool:
    try:
        con.execute("SELECT count(*) FROM read_parquet(?)", [str(path)]).fetchall()
    except _duckdb().Error:
        return False
    return True


def _from_events(con: duckdb.DuckDBPyConnection, table: str, run: dict[str, Any], why: str) -> str:
    """A run's breakdown computed from its events.jsonl into `table`, as its analysis would have (pandas:
    only on this path)."""
    from labctl.analysis.breakdown import EventIndex, clock_uncertainties, compute_breakdown
    from labctl.analysis.store import EVENTS, events_file, read_run_json
    from labctl.core.events import torn_tail

    try:
        events = events_file(Path(run["path"]))
        offsets = read_run_json(Path(run["path"])).get("clock_offsets") or {}
        frame = compute_breakdown(EventIndex.from_file(events), None, clock_uncertainties(offsets))
        torn = torn_tail(events)
    except (InputError, OSError) as e:
        reason = e if isinstance(e, InputError) else f"{run['path']}/{EVENTS}: {e.strerror}"
        return f"run {run['run_id']}: {why}, and its events cannot be read ({reason}): left out"
    frame = frame[frame["reconfig"] > 0].reset_index(drop=True)
    frame = frame.assign(run_id=run["run_id"], row_number=range(len(frame)))
    frame = frame[["run_id", "row_number", *NEEDED]]
    for name in NEEDED:  # pandas' nullable dtypes as plain objects: DuckDB casts them
        frame[name] = frame[name].astype(object).where(frame[name].notna(), None)
    con.register("recomputed", frame)
    try:
        con.execute(f"INSERT INTO {table} SELECT * FROM recomputed")
    finally:
        con.unregister("recomputed")
    tail = f" (its last line is torn, {torn} bytes: every complete line used)" if torn else ""
    return f"run {run['run_id']}: {why}: its breakdown was computed from its {EVENTS}{tail}"
