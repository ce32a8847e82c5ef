"""The run catalogue over real runs, through the CLI: a run writes its record at its end, `labctl runs`
lists and filters, `report` and `compare` read Parquet (events.jsonl deleted, they still answer), a crashed
run is named, and bad input is one line with exit code 2. The catalogue on constructed runs:
tests/unit/test_catalog.py."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from labctl.analysis.catalog_record import RECORD, record_of
from labctl.run.lifecycle import run_experiment
from tests.conftest import REPO
from tests.integration.test_run_records import SHORT as RECORDS_SHORT

LABCTL = [sys.executable, "-m", "labctl.cli"]

SHORT = RECORDS_SHORT.replace("name: records", "name: catalogued")  # one DP -> PP -> DP swap


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three real runs: two on the fast profile, one on `fast-b` (the same delays under another name)."""
    root = tmp_path_factory.mktemp("catalogued")
    (root / "e.yaml").write_text(SHORT)
    inventory = root / "inventory.yaml"
    inventory.write_text(
        (REPO / "inventory.yaml")
        .read_text()
        .replace("profile: opus-testbed", "profile: opus-testbed\nprofiles:\n  fast-b: {extends: fast}")
    )

    async def go() -> None:
        for seed, profile in ((1, "fast"), (2, "fast"), (3, "fast-b")):
            outcome = await run_experiment(
                root / "e.yaml", inventory, profile=profile, out_dir=root / "runs", seed=seed, plots=False
            )
            assert outcome.status == "completed", outcome.error

    asyncio.run(go())
    return root / "runs"


@pytest.fixture
def runs_copy(runs_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(runs_dir, tmp_path / "runs"))


def run_dirs(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.is_dir())


def labctl(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*LABCTL, *map(str, args)], capture_output=True, text=True, timeout=120, check=False
    )


def test_a_run_writes_its_record_last(runs_dir: Path) -> None:
    for run in run_dirs(runs_dir):
        record = json.loads((run / RECORD).read_text())
        assert record == record_of(run)
        assert record["recorded_status"] == "completed" and record["experiment"] == "catalogued"
        newest = max(p.stat().st_mtime_ns for p in run.iterdir() if p.name != RECORD)
        assert (run / RECORD).stat().st_mtime_ns >= newest


def test_runs_lists_and_filters(runs_dir: Path) -> None:
    listed = labctl("runs", runs_dir, "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [r["seed"] for r in rows] == [1, 2, 3]
    assert set(rows[0]) >= {
        "run_id", "path", "experiment", "experiment_hash", "lab", "inventory_hash", "profile", "seed",
        "labctl_version", "status", "started", "finished", "phases",
    }  # fmt: skip
    assert rows[0]["lab"] == "opus-testbed" and rows[0]["status"] == "completed"
    assert rows[0]["phases"]["total"]["n"] > 0 and rows[0]["phases"]["total"]["median_ns"] > 0
    assert len({r["experiment_hash"] for r in rows}) == 1 and len({r["inventory_hash"] for r in rows}) == 1
    picked = labctl(
        "runs", runs_dir, "--experiment", "catal*", "--since", "2000-01-01", "--profile", "fast-b"
    )
    assert (
        picked.returncode == 0
        and "profile fast-b" in picked.stdout
        and "1 runs: 1 completed" in picked.stdout
    )
    none = labctl("runs", runs_dir, "--since", "2999-01-01", "--json")
    assert none.returncode == 0 and json.loads(none.stdout) == []
    table = labctl("runs", runs_dir)
    assert (
        "all experiment catalogued, lab opus-testbed" in table.stdout
        and "3 runs: 3 completed" in table.stdout
    )


def test_report_and_compare_read_parquet_not_events(runs_copy: Path) -> None:
    assert labctl("runs", runs_copy).returncode == 0  # indexed
    for events in runs_copy.glob("*/events.jsonl"):
        events.unlink()
    pooled = labctl("report", runs_copy, "--experiment", "catalogued")
    assert pooled.returncode == 0, pooled.stderr
    assert pooled.stderr == ""  # nothing had to be worked around
    assert "pooled over 3 runs" in pooled.stdout and "median of each run (3 runs" in pooled.stdout
    one = labctl("report", run_dirs(runs_copy)[0])
    assert one.returncode == 0 and "link-up breakdown" in one.stdout, one.stderr
    compared = labctl("compare", runs_copy, "profile=fast", "vs", runs_copy, "profile=fast-b")
    assert compared.returncode == 0, compared.stderr
    assert "warning: the sets ran different profiles: A fast; B fast-b" in compared.stdout
    assert "A: 2 runs  vs  B: 1 runs" in compared.stdout
    same = labctl("compare", "--profile", "fast", runs_copy, "seed=1", "vs", *run_dirs(runs_copy)[1:2])
    assert same.returncode == 2 and "seed=1: not a run directory, nor a filter" in same.stderr


def test_a_crashed_run_is_listed_so_and_its_breakdown_computed_from_its_events(runs_copy: Path) -> None:
    crashed = run_dirs(runs_copy)[0]
    gone = subprocess.Popen(["true"])  # a pid that has exited (and been reaped)
    gone.wait()
    meta = json.loads((crashed / "run.json").read_text())
    meta |= {"status": "running", "pid": gone.pid}
    (crashed / "run.json").write_text(json.dumps(meta))
    for name in (RECORD, "summary.json", "breakdown.csv", "breakdown.parquet"):
        (crashed / name).unlink()
    listed = json.loads(labctl("runs", runs_copy, "--status", "crashed", "--json").stdout)
    assert [r["run_id"] for r in listed] == [crashed.name] and listed[0]["recorded_status"] == "running"
    pooled = labctl("report", runs_copy, "--status", "crashed,completed")
    assert pooled.returncode == 0, pooled.stderr
    assert (
        f"note: run {crashed.name}: no breakdown.parquet (the run ended before its analysis): its breakdown "
        "was computed from its events.jsonl" in pooled.stderr
    )
    single = labctl("report", crashed)
    assert "status: crashed" in single.stdout and "still says running" in single.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["runs", "{runs}", "--since", "last week"],
        ["runs", "{runs}", "--status", "done"],
        ["runs", "{runs}/nope"],
        ["report", "{runs}", "--since", "2026-13-01"],
        ["report", "{runs}", "--experiment", "no-such-experiment"],
        ["compare", "{runs}", "lab=x", "vs", "{runs}", "--status", "bogus"],
    ],
)
def test_bad_input_is_one_line_and_exit_2(runs_dir: Path, args: list[str]) -> None:
    proc = labctl(*(a.format(runs=runs_dir) for a in args))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
