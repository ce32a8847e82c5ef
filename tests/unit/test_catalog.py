"""The run catalogue on constructed run directories: rows from records and from run.json, a crashed run,
filters, the cache refreshed incrementally equal to a rebuild; the pooled statistics read from Parquet
equal to the pandas path's; one unit per table column. Real runs through the CLI:
tests/integration/test_catalog.py."""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from rich.console import Console

from labctl.analysis.breakdown_table import COLUMNS, DURATIONS, INT_COLUMNS, write_breakdown
from labctl.analysis.catalog import CACHE, Catalog, public, select_runs
from labctl.analysis.catalog_filters import Filters, filters_from, parse_since, parse_statuses
from labctl.analysis.catalog_record import PHASES, RECORD, record_of, write_record
from labctl.analysis.compare import aggregate, cluster_bootstrap_medians, compare, set_differences
from labctl.analysis.phase_stats import bootstrap_medians, phase_values, summarize
from labctl.cli.tables import quality_lines, summary_table
from labctl.core.errors import InputError
from labctl.core.units import UnitColumn, fmt_ns, fmt_pair, pick_unit

MS = 1_000_000
DAY_NS = 86_400 * 10**9
T0_NS = 1_796_000_000 * 10**9  # 2026-11-30 00:53:20 UTC


def breakdown_frame(seed: int, reconfigs: int = 4, ports: int = 4) -> pd.DataFrame:
    """A breakdown as a run writes it: reconfiguration 0 (setup) and 1..reconfigs, two rails of ports,
    one command carrying both rails in even reconfigurations and one per rail in odd ones; a dark port per
    rail (no peer), a missing optical mark, and flagged phases here and there."""
    rng = np.random.default_rng(seed)
    rows: list[dict[str, Any]] = []
    for n in range(reconfigs + 1):
        shared_t0, shared_took = int(rng.integers(10**9, 2 * 10**9)), int(rng.integers(20 * MS, 30 * MS))
        for rail in (0, 1):
            t0 = shared_t0 if n % 2 == 0 else shared_t0 + rail * 7 * MS
            t1 = t0 + (shared_took if n % 2 == 0 else int(rng.integers(20 * MS, 30 * MS)))
            for p in range(ports):
                row: dict[str, Any] = dict.fromkeys(COLUMNS)
                row |= {"reconfig": n, "phase": "pp", "rail": rail, "host": f"h{p}", "port": f"eth{rail}"}
                row |= {"source": f"nic:h{p}/eth{rail}", "peer": "" if p == 0 else f"h{p + 1}/eth{rail}"}
                row |= {"t0_command_ns": t0, "t1_switch_done_ns": t1, "timed_out": p == 1 and n == 2}
                row |= {"impossible": "", "unresolved": "", "transport": "udp", "t2_source": "dom"}
                row["switch_ns"] = t1 - t0
                for col in DURATIONS[1:]:
                    row[col] = int(rng.integers(1, 200)) * int(rng.choice([1_000, MS, 10 * MS]))
                row["t5_traffic_ns"] = None if p == 0 else t0 + row["total_ns"]
                row["t2_resolution_ns"] = int(rng.integers(900_000, 1_100_000))
                row["t5_resolution_ns"] = int(rng.integers(1_000, 2 * MS))
                if p == 2 and n == 1:
                    row["optical_ns"] = None
                if p == 3 and n == 3:
                    row["impossible"] = "firmware"
                if p == 1 and n == 4:
                    row["unresolved"] = "optical,total"
                rows.append(row)
    frame = pd.DataFrame(rows, columns=COLUMNS)
    for col in INT_COLUMNS:
        frame[col] = frame[col].astype("Int64")
    for col in (
        "phase",
        "host",
        "port",
        "source",
        "peer",
        "transport",
        "t2_source",
        "impossible",
        "unresolved",
    ):
        frame[col] = frame[col].astype("string")
    frame["timed_out"] = frame["timed_out"].astype(bool)
    return frame


def make_run(
    runs: Path,
    name: str,
    *,
    seed: int = 0,
    experiment: str = "exp-a",
    lab: str = "lab-1",
    profile: str = "fast",
    status: str = "completed",
    day: int = 0,
    pid: int | None = None,
    record: bool = True,
    analysed: bool = True,
    started_ns: int | None = None,
) -> Path:
    """A run directory as lifecycle leaves it: run.json, breakdown.parquet/.csv, summary.json, catalog.json
    (`analysed=False`: killed before its analysis; `record=False`: no catalog.json)."""
    run = runs / name
    run.mkdir(parents=True)
    started = started_ns if started_ns is not None else T0_NS + day * DAY_NS
    meta = {
        "run_id": name,
        "status": status,
        "pid": pid if pid is not None else 1,
        "experiment": {"name": experiment, "cycle": ["pp", "dp"]},
        "inventory": {"lab": lab, "hosts": {}},
        "profile": {"name": profile, "switching_ms": [2.0, 3.0]},
        "seed": seed,
        "versions": {"labctl": "0.1.0", "git": "abc"},
        "time_sync": {"controller": {"host": os.uname().nodename}},
        "started_wall_ns": started,
        **({} if status == "running" else {"finished_wall_ns": started + 5 * 10**9, "events": 100}),
    }
    (run / "run.json").write_text(json.dumps(meta))
    if analysed:
        frame = breakdown_frame(seed)
        write_breakdown(frame, run)
        (run / "summary.json").write_text(json.dumps(summarize(frame)))
    if record:
        write_record(run)
    return run


def dead_pid() -> int:
    """A pid no process has: above the kernel's largest."""
    return int(Path("/proc/sys/kernel/pid_max").read_text()) + 1


@pytest.fixture(scope="module")
def runs_made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The five runs, made once per module (each breakdown written as Parquet and CSV, summarized and
    recorded: ~0.2 s); `runs` gives each test a copy of its own, which tests change freely."""
    root = tmp_path_factory.mktemp("catalog") / "runs"
    make_run(root, "r1", seed=1, day=0)
    make_run(root, "r2", seed=2, day=2, profile="slow")
    make_run(root, "r3", seed=3, day=4, lab="lab-2", experiment="exp-b")
    make_run(root, "r4", seed=4, day=5, status="aborted")
    # killed: run.json still says running, its pid is gone, no analysis, no record
    make_run(root, "r5", seed=5, day=6, status="running", pid=dead_pid(), record=False, analysed=False)
    return root


@pytest.fixture
def runs(runs_made: Path, tmp_path: Path) -> Path:
    # copytree copies each file's mtime (ns) too: the catalog's fingerprints compare mtimes and sizes, and
    # a record is as new as its run.json here as where it was made
    return Path(shutil.copytree(runs_made, tmp_path / "runs"))


def _without_read(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k not in ("fingerprint",)} for r in rows]


def test_the_phases_are_the_breakdowns() -> None:
    assert [c.removesuffix("_ns") for c in DURATIONS] == list(PHASES)


def test_every_run_is_a_row_and_a_killed_one_reads_crashed(runs: Path) -> None:
    rows = Catalog(runs).rows()
    assert [r["run_id"] for r in rows] == ["r1", "r2", "r3", "r4", "r5"]  # oldest first
    by_id = {r["run_id"]: r for r in rows}
    assert by_id["r5"]["status"] == "crashed" and by_id["r5"]["recorded_status"] == "running"
    assert by_id["r5"]["source"] == "run.json" and not by_id["r5"]["has_breakdown"]
    assert by_id["r4"]["status"] == "aborted" and by_id["r1"]["source"] == "record"
    assert by_id["r1"]["experiment_hash"] == by_id["r2"]["experiment_hash"]
    assert by_id["r1"]["profile_hash"] == by_id["r2"]["profile_hash"]  # same parameters, other name
    summary = json.loads((runs / "r1" / "summary.json").read_text())
    assert by_id["r1"]["total_median_ns"] == summary["phases"]["total"]["median"]
    assert by_id["r1"]["switch_n"] == summary["phases"]["switch"]["n"]
    shown = public(by_id["r1"])
    assert shown["started"] == "2026-11-30T00:53:20Z" and shown["duration_s"] == 5.0
    assert shown["phases"]["total"]["median_ns"] == summary["phases"]["total"]["median"]
    assert (runs / CACHE).is_file()


def test_the_record_is_what_run_json_and_summary_give(runs: Path) -> None:
    assert json.loads((runs / "r1" / RECORD).read_text()) == record_of(runs / "r1")


def test_a_running_run_whose_pid_is_alive_is_running_and_a_reused_pid_is_not(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    now = time.time_ns()  # this process started before: it is the run's
    make_run(root, "live", status="running", pid=os.getpid(), record=False, analysed=False, started_ns=now)
    assert Catalog(root).rows()[0]["status"] == "running"
    meta = json.loads((root / "live" / "run.json").read_text())
    meta["started_wall_ns"] = 946_684_800 * 10**9  # 2000-01-01: this process started long after
    (root / "live" / "run.json").write_text(json.dumps(meta))
    assert Catalog(root).rows()[0]["status"] == "crashed"


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        (Filters(experiment="exp-a"), ["r1", "r2", "r4", "r5"]),
        (Filters(experiment="exp-*", lab="lab-2"), ["r3"]),
        (Filters(profile="slow"), ["r2"]),
        (Filters(since_ns=T0_NS + 4 * DAY_NS), ["r3", "r4", "r5"]),
        (Filters(statuses=frozenset({"crashed", "aborted"})), ["r4", "r5"]),
        (Filters(statuses=frozenset({"running"})), []),
        (Filters(experiment="exp-a", since_ns=T0_NS + DAY_NS, statuses=frozenset({"completed"})), ["r2"]),
    ],
)
def test_filters(runs: Path, filters: Filters, expected: list[str]) -> None:
    assert [r["run_id"] for r in Catalog(runs).rows(filters)] == expected


def test_the_cache_refreshed_equals_a_rebuild(runs: Path) -> None:
    catalog = Catalog(runs)
    first = catalog.rows()
    assert _without_read(catalog.rows()) == _without_read(first)  # from the cache, unchanged
    make_run(runs, "r6", seed=6, day=7)  # a run finished since
    shutil.rmtree(runs / "r2")  # a run deleted
    meta = json.loads((runs / "r4" / "run.json").read_text())  # a run.json edited after its record
    meta["error"] = "restored by hand"
    (runs / "r4" / "run.json").write_text(json.dumps(meta))
    later = os.stat(runs / "r4" / RECORD).st_mtime_ns + 10**9
    os.utime(runs / "r4" / "run.json", ns=(later, later))
    refreshed = catalog.rows()
    assert [r["run_id"] for r in refreshed] == ["r1", "r3", "r4", "r5", "r6"]
    assert {r["run_id"]: r for r in refreshed}["r4"]["error"] == "restored by hand"
    (runs / CACHE).unlink()
    rebuilt = Catalog(runs).rows(rebuild=True)
    assert _without_read(rebuilt) == _without_read(refreshed)
    assert Catalog(runs).rows() == rebuilt  # and the rebuilt cache reads back the same


def test_a_damaged_cache_is_rebuilt_and_a_damaged_run_is_named(runs: Path) -> None:
    expected = Catalog(runs).rows()
    (runs / CACHE).write_bytes(b"not parquet")
    (runs / "junk").mkdir()
    (runs / "junk" / "run.json").write_text("{")
    catalog = Catalog(runs)
    assert _without_read(catalog.rows()) == _without_read(expected)
    assert catalog.skipped == ["junk: run.json is not a readable JSON object"]


def test_a_missing_runs_directory_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such runs directory"):
        Catalog(tmp_path / "nope")


def test_select_runs_takes_run_and_runs_directories(runs: Path) -> None:
    assert [r["run_id"] for r in select_runs([runs], Filters())] == ["r5"]  # no filters: the newest
    assert [r["run_id"] for r in select_runs([runs / "r1", runs / "r3"], Filters(lab="lab-1"))] == ["r1"]
    assert len(select_runs([], Filters(experiment="exp-a"), default=runs)) == 4
    with pytest.raises(InputError, match="given twice"):
        select_runs([runs / "r1", runs / "r1"], Filters())


NOW = dt.datetime(2026, 12, 2, 15, 30, tzinfo=dt.timezone(dt.timedelta(hours=1)))  # a Wednesday


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-12-01T00:00:00+00:00", dt.datetime(2026, 12, 1, tzinfo=dt.UTC)),
        ("2026-12-01T10:00Z", dt.datetime(2026, 12, 1, 10, tzinfo=dt.UTC)),
        ("today", NOW.replace(hour=0, minute=0)),
        ("yesterday", NOW.replace(day=1, hour=0, minute=0)),
        ("monday", NOW.replace(day=1, hour=0, minute=0) - dt.timedelta(days=1)),
        ("wed", NOW.replace(hour=0, minute=0)),
        ("36h", NOW - dt.timedelta(hours=36)),
        ("2w", NOW - dt.timedelta(days=14)),
    ],
)
def test_since(text: str, expected: dt.datetime) -> None:
    assert parse_since(text, NOW) == int(expected.timestamp()) * 10**9


def test_a_local_date_is_local_midnight() -> None:
    assert parse_since("2026-12-01") == int(dt.datetime(2026, 12, 1).astimezone().timestamp()) * 10**9


@pytest.mark.parametrize("text", ["last week", "2026-13-01", "5 parsecs", ""])
def test_a_bad_since_is_one_input_error(text: str) -> None:
    with pytest.raises(InputError, match="--since"):
        parse_since(text, NOW)


def test_statuses() -> None:
    assert parse_statuses("completed, crashed") == {"completed", "crashed"}
    with pytest.raises(InputError, match="--status 'done'"):
        parse_statuses("done")
    assert not filters_from() and filters_from(status="aborted")


# --- the pooled statistics from Parquet equal the pandas path's --------------------------------------------


def _pandas_pooled(run_dirs: list[Path]) -> dict[str, Any]:
    """What `labctl report RUN...` computed before the catalogue: the frames pooled in pandas."""
    frames = []
    for run in run_dirs:
        frame = pd.read_parquet(run / "breakdown.parquet")
        frame.insert(0, "run_id", run.name)
        frames.append(frame[frame["reconfig"] > 0])
    rows = pd.concat(frames, ignore_index=True)
    summary = summarize(rows, exclude_setup=False)
    for col in DURATIONS:
        medians = []
        for run in run_dirs:
            values = phase_values(rows[rows["run_id"] == run.name], col)
            medians.append(int(np.median(values)) if values.size else None)
        summary["phases"][col.removesuffix("_ns")]["run_medians"] = medians
    return summary


def test_pooled_from_parquet_equals_pooled_in_pandas(runs: Path) -> None:
    run_dirs = [runs / name for name in ("r1", "r2", "r3", "r4")]
    ours, theirs = aggregate(run_dirs), _pandas_pooled(run_dirs)
    for key in ("ci", "reconfigurations", "rows", "timed_out", "incomplete", "flagged_rows", "resolution"):
        assert ours[key] == theirs[key], key
    assert ours["t2_source"] == theirs["t2_source"]
    for name, stats in theirs["phases"].items():
        mine = {k: v for k, v in ours["phases"][name].items() if k != "runs_with_values"}
        assert mine == stats, name
    assert ours["phases"]["firmware"]["impossible"] == 8 and ours["phases"]["switch"]["n"] == 4 * 6
    assert ours["run_reconfigurations"] == 16 and ours["notes"] == []


def test_a_run_without_usable_parquet_is_named_never_silently_dropped(runs: Path) -> None:
    (runs / "r2" / "breakdown.parquet").write_bytes(b"PAR1 damaged")
    summary = aggregate([runs / "r1", runs / "r2"])
    assert summary["notes"] == [
        "run r2: breakdown.parquet is damaged, and its events cannot be read "
        f"({runs / 'r2'}: no events.jsonl (not a labctl run directory, or a damaged one)): left out"
    ]
    assert summary["phases"]["total"]["run_medians"][1] is None


@pytest.mark.parametrize(
    ("clusters", "size", "shift"), [(400, 20, 5.0), (50, 8, 0.0), (3, 4, 1.0), (200, 1, 0.0)]
)
def test_the_banded_cluster_bootstrap_is_the_full_one(clusters: int, size: int, shift: float) -> None:
    rng = np.random.default_rng(clusters)
    labels = np.repeat(np.arange(clusters) * 7 + 3, size)  # labels need not be 0..k-1
    values = rng.integers(0, 1000, labels.size) + np.repeat(rng.normal(0, 300 * shift + 1, clusters), size)
    values = values.astype(np.int64)
    for seed in (0, 1):
        assert np.array_equal(
            cluster_bootstrap_medians(values, labels, seed=seed),
            bootstrap_medians(values, seed=seed, clusters=labels),
        )


def test_compare_says_where_the_sets_differ(runs: Path) -> None:
    result = compare([runs / "r1"], [runs / "r2", runs / "r3"])
    assert result["warnings"] == [
        "the sets ran different profiles: A fast; B fast (1), slow (1)",
        "the sets ran different labs: A lab-1; B lab-1 (1), lab-2 (1)",
    ]
    same = compare([runs / "r1"], [runs / "r4"])
    assert same["warnings"] == [] and same["phases"]["total"]["difference_ci"] is not None
    a, b = [{"profile": "fast", "profile_hash": "x"}], [{"profile": "fast", "profile_hash": "y"}]
    assert "with different parameters" in set_differences(a, b)[0]


# --- units: one per column ----------------------------------------------------------------------------------


def test_a_value_rounding_up_is_said_in_the_next_unit() -> None:
    assert fmt_ns(999_960) == "1.0 ms" and fmt_ns(999_999_999) == "1.000 s" and fmt_ns(74_200) == "74 µs"
    assert fmt_pair(963_000, 1_600_000) == ("0.963", "1.60", "ms")


def test_a_column_picks_its_unit_from_its_typical_value() -> None:
    assert pick_unit([75_000, 2_800_000, 47_000_000, None, 0]) == "ms"
    assert pick_unit([70_000, 80_000, 2_000_000]) == "µs"
    assert pick_unit([None]) == "ns"
    column = UnitColumn.of([75_000, 47_300_000, 6_021_300_000])
    assert [column.cell(v) for v in (75_000, 47_300_000, 6_021_300_000)] == ["0.0750", "47.3", "6021"]
    assert UnitColumn("µs").with_interval(3_950, [-2_080_160, 1_718_860]) == "4 [-2080, 1719]"
    assert UnitColumn("ms").interval([44_800_000, 48_900_000], 47_200_000) == "[44.8, 48.9]"


def _rendered(renderable: Any) -> list[list[str]]:
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(renderable)
    text = console.export_text()
    return [
        [c.strip() for c in line.strip("│┃").split("│" if "│" in line else "┃")]
        for line in text.splitlines()
        if line[:1] in "│┃"
    ]


def test_a_summary_table_holds_one_unit_per_column(runs: Path) -> None:
    summary = json.loads((runs / "r1" / "summary.json").read_text())
    header, *rows = _rendered(summary_table(summary, "t"))
    units = {name.rsplit(" (", 1)[0]: name.rsplit("(", 1)[1].rstrip(")") for name in header if "(" in name}
    assert set(units) == {"min", "median", "95% CI", "p95", "max"} and units["95% CI"] == units["median"]
    for row in rows:
        for cell in row[3:8]:
            assert not any(u in cell for u in ("ns", "µs", "ms", " s")), (
                cell
            )  # bare numbers: the header's unit
    lines = quality_lines(summary)
    assert any(line.startswith("mark resolution") and "over 32 port rows" in line for line in lines)


def test_report_and_compare_take_the_filters_runs_takes() -> None:
    """One definition of the filter options (labctl/cli/common.py), taken by all three commands."""
    import inspect

    from labctl.cli import compare as compare_cli
    from labctl.cli import report as report_cli
    from labctl.cli import runs as runs_cli

    wanted = {"experiment": "ExperimentFilter", "lab": "LabFilter", "profile": "ProfileFilter",
              "since": "SinceFilter", "status": "StatusFilter"}  # fmt: skip
    for command in (report_cli.report, compare_cli.compare, runs_cli.runs):
        params = inspect.signature(command).parameters
        assert {name: str(params[name].annotation) for name in wanted} == wanted, command.__name__


@pytest.mark.parametrize("older", ["r1", "r2"], ids=["first-file", "a-later-file"])
def test_a_breakdown_of_an_older_schema_reads_by_the_union(runs: Path, older: str) -> None:
    run_dirs = [runs / name for name in ("r1", "r2", "r3")]
    expected = aggregate(run_dirs)
    parquet = runs / older / "breakdown.parquet"
    pd.read_parquet(parquet).drop(columns=["t2_source", "transport"]).to_parquet(parquet, index=False)
    summary = aggregate(run_dirs)
    assert summary["notes"] == [] and summary["phases"] == expected["phases"]
    assert sum(summary["t2_source"].values()) == sum(expected["t2_source"].values()) - 32  # its 32 rows
    frame = pd.read_parquet(parquet).drop(columns=["impossible", "unresolved"])
    frame.to_parquet(parquet, index=False)  # older still: before the flags, so recomputed from the events
    assert "predates the impossible/unresolved flags" in aggregate(run_dirs)["notes"][0]
