"""The breakdowns of a set of runs: the measured rows of every run's breakdown.parquet, read in one DuckDB
scan into a table (what `report` and `compare` pool; decision 0058); a run without a usable file has its
breakdown computed from its events.jsonl."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from labctl.analysis.catalog_record import PHASES
from labctl.core.errors import InputError

if TYPE_CHECKING:
    import duckdb

_TEXT, _INT, _BOOL = "VARCHAR", "BIGINT", "BOOLEAN"  # DuckDB's types
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
    import duckdb

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
    import duckdb

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
    import duckdb

    try:
        con.execute("SELECT count(*) FROM read_parquet(?)", [str(path)]).fetchall()
    except duckdb.Error:
        return False
    return True


def _from_events(con: duckdb.DuckDBPyConnection, table: str, run: dict[str, Any], why: str) -> str:
    """A run's breakdown computed from its events.jsonl into `table`, as its analysis would have (pandas:
    only on this path)."""
    from labctl.analysis.breakdown import compute_breakdown
    from labctl.analysis.clock_uncertainty import clock_uncertainties
    from labctl.analysis.event_index import EventIndex
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
