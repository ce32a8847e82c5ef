"""A run's figures drawn by the two workers it started while it ran (labctl.analysis.pool): the same files
as drawing them in the run's own process, a worker that fails is not trusted (the run draws them itself),
and no worker outlives the run, drawn or aborted."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from pathlib import Path

import pandas as pd
import pytest

from labctl.analysis.pool import FigureWorkers
from labctl.analysis.summary import analyse
from labctl.run.lifecycle import run_experiment
from tests.integration.test_run_records import SHORT

FILES = ("summary.json", "breakdown.csv", "breakdown.parquet", "timeline.png", "distributions.png")


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("figure-workers")
    (root / "e.yaml").write_text(SHORT)
    inventory = Path(__file__).parents[2] / "inventory.yaml"
    outcome = asyncio.run(
        run_experiment(root / "e.yaml", inventory, profile="fast", out_dir=root / "runs", seed=3, plots=False)
    )
    assert outcome.status == "completed"
    return outcome.run_dir


def _fresh(run: Path, where: Path) -> Path:
    copy = Path(shutil.copytree(run, where))
    for name in FILES:
        (copy / name).unlink(missing_ok=True)
    return copy


def _as_json(summary: dict[str, object]) -> str:
    """What summary.json holds (NaN is not equal to itself in a dict; tuples become lists)."""
    return json.dumps(summary, default=str, sort_keys=True)


def _same_results(a: Path, b: Path) -> None:
    for name in FILES:
        assert (a / name).stat().st_size > 0 and (b / name).stat().st_size > 0, name
    assert json.loads((a / "summary.json").read_text()) == json.loads((b / "summary.json").read_text())
    pd.testing.assert_frame_equal(pd.read_csv(a / "breakdown.csv"), pd.read_csv(b / "breakdown.csv"))


async def test_the_workers_write_what_the_run_would_draw_itself(finished_run: Path, tmp_path: Path) -> None:
    by_workers, in_process = _fresh(finished_run, tmp_path / "w"), _fresh(finished_run, tmp_path / "p")
    workers = FigureWorkers()
    await workers.start()
    try:
        summary = await workers.analyse(by_workers, -10.0, ("png",))
    finally:
        await workers.close()
    assert _as_json(summary) == _as_json(analyse(in_process, -10.0, plot_formats=("png",)))
    _same_results(by_workers, in_process)


async def test_a_worker_that_fails_is_not_trusted(finished_run: Path, tmp_path: Path) -> None:
    """Workers that exit at once (as one that cannot import would): the run draws everything itself."""
    run, reference = _fresh(finished_run, tmp_path / "w"), _fresh(finished_run, tmp_path / "p")
    workers = FigureWorkers((sys.executable, "-c", "import sys; sys.exit(3)"))
    await workers.start()
    try:
        summary = await workers.analyse(run, -10.0, ("png",))
    finally:
        await workers.close()
    assert _as_json(summary) == _as_json(analyse(reference, -10.0, plot_formats=("png",)))
    _same_results(run, reference)


async def test_workers_of_a_run_that_draws_nothing_are_gone_at_once() -> None:
    workers = FigureWorkers()
    await workers.start()
    procs = list(workers._procs)
    assert len(procs) == 2
    await workers.close()  # while they are still importing: killed, and waited for
    assert all(p.returncode is not None for p in procs) and workers._procs == []
