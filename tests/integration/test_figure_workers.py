"""A run's figures drawn by the two workers it started while it ran (labctl.analysis.pool): the same files
as drawing them in the run's own process, also when drawn ahead while the run went on (kept, or drawn again
when the whole run shows something else), a worker that fails is not trusted (the run draws them itself),
and no worker outlives the run, drawn or aborted."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from pathlib import Path

import pandas as pd
import pytest

from labctl.analysis.pool import AHEAD, FigureWorkers
from labctl.analysis.summary import analyse
from labctl.core.events import Kind, read_events
from labctl.run.engine import NullProgress
from labctl.run.lifecycle import RunOutcome, run_experiment
from labctl.run.steps import Stage
from tests.integration.test_run_records import SHORT

FIGURE_FILES = ("headline.png", "timeline.png", "distributions.png")
FILES = ("summary.json", "breakdown.csv", "breakdown.parquet", *FIGURE_FILES)


# The module's tests share one run and one in-process drawing of it (module fixtures): on one xdist worker,
# so that they are made once, not once per worker the tests are spread over.
pytestmark = pytest.mark.xdist_group("figure_workers")


@pytest.fixture(scope="module")
def drawn_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[RunOutcome, list[int]]:
    """A run as `labctl run` makes it: its figure workers draw ahead while it goes on and write its results
    at its end; and the figure workers still alive right after it returned. One run serves both
    test_a_run_drawn_ahead_writes_its_figures_and_an_aborted_one_none (what the workers wrote) and, as
    finished_run, every test that only needs a finished run's events."""
    root = tmp_path_factory.mktemp("figure-workers")
    (root / "e.yaml").write_text(SHORT)
    inventory = Path(__file__).parents[2] / "inventory.yaml"
    outcome = asyncio.run(
        run_experiment(root / "e.yaml", inventory, profile="fast", out_dir=root / "runs", seed=3)
    )
    return outcome, _workers_alive()


@pytest.fixture(scope="module")
def finished_run(drawn_run: tuple[RunOutcome, list[int]]) -> Path:
    """drawn_run's directory; the tests copy it without its results (_fresh) and never change it."""
    outcome, _ = drawn_run
    assert outcome.status == "completed"
    return outcome.run_dir


@pytest.fixture(scope="module")
def in_process(finished_run: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """finished_run analysed in this process, as a run without workers does: the directory and its summary
    (_as_json). Every test that compares workers' files with the run's own drawing compares with these:
    the same events, threshold and format give the same files, so drawing them once serves all (tests
    only read them)."""
    run = _fresh(finished_run, tmp_path_factory.mktemp("in-process") / "p")
    return run, _as_json(analyse(run, -10.0, plot_formats=("png",)))


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
    for name in FIGURE_FILES:  # drawn the same, byte for byte
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert json.loads((a / "summary.json").read_text()) == json.loads((b / "summary.json").read_text())
    pd.testing.assert_frame_equal(pd.read_csv(a / "breakdown.csv"), pd.read_csv(b / "breakdown.csv"))


async def test_the_workers_write_what_the_run_would_draw_itself(
    finished_run: Path, in_process: tuple[Path, str], tmp_path: Path
) -> None:
    by_workers = _fresh(finished_run, tmp_path / "w")
    workers = FigureWorkers()
    await workers.start()
    try:
        summary = await workers.analyse(by_workers, -10.0, ("png",))
    finally:
        await workers.close()
    assert _as_json(summary) == in_process[1]
    _same_results(by_workers, in_process[0])


async def test_a_worker_that_fails_is_not_trusted(
    finished_run: Path, in_process: tuple[Path, str], tmp_path: Path
) -> None:
    """Workers that exit at once (as one that cannot import would): the run draws everything itself."""
    run = _fresh(finished_run, tmp_path / "w")
    workers = FigureWorkers((sys.executable, "-c", "import sys; sys.exit(3)"))
    await workers.start()
    try:
        summary = await workers.analyse(run, -10.0, ("png",))
    finally:
        await workers.close()
    assert _as_json(summary) == in_process[1]
    _same_results(run, in_process[0])


async def test_workers_of_a_run_that_draws_nothing_are_gone_at_once() -> None:
    workers = FigureWorkers()
    await workers.start()
    procs = list(workers._procs)
    assert len(procs) == 2
    await workers.close()  # while they are still importing: killed, and waited for
    assert all(p.returncode is not None for p in procs) and workers._procs == []


async def _analysed(workers: FigureWorkers, run: Path) -> dict[str, object]:
    try:
        return await workers.analyse(run, -10.0, ("png",))
    finally:
        await workers.close()


async def test_what_is_worked_out_ahead_is_kept_when_the_run_shows_the_same(
    finished_run: Path, in_process: tuple[Path, str], tmp_path: Path
) -> None:
    by_workers = _fresh(finished_run, tmp_path / "w")
    workers = FigureWorkers()
    await workers.start()
    for what in AHEAD:
        workers.ahead(what, by_workers, -10.0, ("png",))
    summary = await _analysed(workers, by_workers)
    assert [r["ahead"] for r in workers.replies] == [
        {"headline": "kept", "timeline": "kept", "summary": "kept"},
        {"distributions": "kept"},
    ]
    assert _as_json(summary) == in_process[1]
    _same_results(by_workers, in_process[0])


async def test_the_headline_is_drawn_ahead_with_the_timeline(finished_run: Path, tmp_path: Path) -> None:
    """The run asks for the timeline only (labctl.run.lifecycle): the headline shows the same
    reconfiguration, so the worker drawing both works it out too."""
    run = _fresh(finished_run, tmp_path / "w")
    workers = FigureWorkers()
    await workers.start()
    workers.ahead("timeline", run, -10.0, ("png",))
    await _analysed(workers, run)
    assert [r["ahead"] for r in workers.replies] == [{"headline": "kept", "timeline": "kept"}, {}]
    for name in FIGURE_FILES:
        assert (run / name).stat().st_size > 0, name


async def test_figures_drawn_ahead_of_events_that_came_late_are_drawn_again(
    finished_run: Path, in_process: tuple[Path, str], tmp_path: Path
) -> None:
    """Drawn from a file that still lacked one of the timeline's events and the last reconfiguration (as
    if they had reached it late): at the end both figures are drawn again and the summary worked out again,
    as the run's own process would."""
    by_workers = _fresh(finished_run, tmp_path / "w")
    early = _fresh(finished_run, tmp_path / "early")
    lines = (early / "events.jsonl").read_bytes().splitlines(keepends=True)
    events = list(read_events(early / "events.jsonl"))
    command2 = next(i for i, e in enumerate(events) if e.kind == Kind.OCS_COMMAND and e.reconfig == 2)
    late = next(i for i, e in enumerate(events) if e.kind == Kind.TRAFFIC_OK and e.reconfig == 1)
    (early / "events.jsonl").write_bytes(b"".join(lines[:late] + lines[late + 1 : command2 + 1]))
    workers = FigureWorkers()
    await workers.start()
    for what in AHEAD:
        workers.ahead(what, early, -10.0, ("png",))
    summary = await _analysed(workers, by_workers)
    assert [r["ahead"] for r in workers.replies] == [
        {"headline": "drawn again", "timeline": "drawn again", "summary": "worked out again"},
        {"distributions": "drawn again"},
    ]
    assert _as_json(summary) == in_process[1]
    _same_results(by_workers, in_process[0])


def _workers_alive() -> list[int]:
    """This process's children that are figure workers."""
    alive = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == os.getpid() and b"labctl.analysis.pool" in cmdline:
            alive.append(int(entry.name))
    return alive


class _StopAfter(NullProgress):
    """Cancels the run once its step `index` is done (the figure workers were asked for the timeline)."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.task: asyncio.Task[object] | None = None

    def reconfig_done(self, stage: Stage, timed_out: list[str]) -> None:
        if stage.kind == "step" and stage.index == self.index and self.task is not None:
            self.task.cancel()


async def test_a_run_drawn_ahead_writes_its_figures_and_an_aborted_one_none(
    drawn_run: tuple[RunOutcome, list[int]], in_process: tuple[Path, str], tmp_path: Path
) -> None:
    inventory = Path(__file__).parents[2] / "inventory.yaml"
    done, alive = drawn_run  # a completed run with figures: the module's own, whose copy in_process drew
    assert done.status == "completed" and not alive
    for name in FILES:
        assert (done.run_dir / name).stat().st_size > 0, name
    _same_results(done.run_dir, in_process[0])

    (tmp_path / "long.yaml").write_text(SHORT.replace("cycle: [pp, dp]", "cycle: [pp, dp, pp, dp]"))
    stop = _StopAfter(2)  # after the timeline was asked for
    stop.task = asyncio.create_task(
        run_experiment(
            tmp_path / "long.yaml", inventory, profile="fast", out_dir=tmp_path / "b", seed=4, progress=stop
        )
    )
    aborted = await stop.task
    assert aborted.status == "aborted" and not _workers_alive()
    assert not list(aborted.run_dir.glob("*.png")), "an aborted run draws no figure"
    assert (aborted.run_dir / "summary.json").exists()
