"""Shared by tests/integration/test_scheduler.py, tests/integration/test_queue_shared.py and
tests/unit/test_scheduler.py (the helpers that wait on real processes: tests/helpers/serve_processes.py)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from labctl.scheduler.store import RunRow
from labctl.scheduler.store_sqlite import QueueStore
from labctl.scheduler.worker import WorkerResult

# Two rails on one switch, each on its own pair of hosts: rail 0 = h1,h2; rail 1 = h3,h4.
SPLIT_INVENTORY = """
lab: split-test
switches:
  ocs1: {driver: sim, size: 16x16}
profile: fast
hosts:
  h1: {nics: [{ifname: p0, rail: 0, switch: ocs1, tx: 1, rx: 17}, {ifname: p1, rail: 0, switch: ocs1, tx: 2, rx: 18}]}
  h2: {nics: [{ifname: p0, rail: 0, switch: ocs1, tx: 3, rx: 19}, {ifname: p1, rail: 0, switch: ocs1, tx: 4, rx: 20}]}
  h3: {nics: [{ifname: p0, rail: 1, switch: ocs1, tx: 5, rx: 21}, {ifname: p1, rail: 1, switch: ocs1, tx: 6, rx: 22}]}
  h4: {nics: [{ifname: p0, rail: 1, switch: ocs1, tx: 7, rx: 23}, {ifname: p1, rail: 1, switch: ocs1, tx: 8, rx: 24}]}
"""


def experiment(rail: int, hosts: tuple[str, str], *, name: str, repeat: int = 1, hold_s: float = 0.0) -> str:
    a, b = hosts
    return f"""
name: {name}
rails: [{rail}]
phases:
  up: {{pairs: [[{a}, {b}]]}}
  down: {{pairs: [[{b}, {a}]]}}
baseline: up
cycle: [down, up]
repeat: {repeat}
hold_s: {hold_s}
recovery_timeout_s: 10
"""


@pytest.fixture
def lab(tmp_path: Path) -> dict[str, Path]:
    inv = tmp_path / "inventory.yaml"
    inv.write_text(SPLIT_INVENTORY)
    files = {"inventory": inv}
    for key, rail, hosts, repeat, hold in (
        ("rail0", 0, ("h1", "h2"), 3, 0.4),
        ("rail1", 1, ("h3", "h4"), 3, 0.4),
        ("rail0b", 0, ("h1", "h2"), 1, 0.0),
        ("quick", 0, ("h1", "h2"), 1, 0.0),
        ("long", 0, ("h1", "h2"), 20, 0.3),
    ):
        p = tmp_path / f"{key}.yaml"
        p.write_text(experiment(rail, hosts, name=key, repeat=repeat, hold_s=hold))
        files[key] = p
    return files


@pytest.fixture
def store(tmp_path: Path) -> Iterator[QueueStore]:
    s = QueueStore(tmp_path / "q.sqlite")
    yield s
    s.close()


class FakeClock:
    def __init__(self, wall_ns: int) -> None:
        self.now = wall_ns

    def wall_ns(self) -> int:
        return self.now


class RecordingExecutor:
    """A behavioural model of the executor: a run starts when asked and ends when the test says so."""

    def __init__(self) -> None:
        self.started: list[int] = []
        self._done: dict[int, asyncio.Future[WorkerResult]] = {}

    async def start(self, row: RunRow, on_started: Callable[[int, str | None], Awaitable[None]]) -> None:
        self.started.append(row.id)
        self._done[row.id] = asyncio.get_running_loop().create_future()
        await on_started(os.getpid(), None)

    async def wait(self, run_id: int) -> WorkerResult:
        return await self._done[run_id]

    def stop(self, run_id: int) -> None:
        self.finish(run_id, "aborted")

    def kill(self, run_id: int) -> None:
        self.finish(run_id, "crashed")

    def finish(self, run_id: int, status: str = "completed") -> None:
        if not self._done[run_id].done():
            self._done[run_id].set_result(WorkerResult(status, None, None))


T0 = int(datetime(2026, 12, 1, 0, 0, 30, tzinfo=UTC).timestamp() * 1e9)

MIN = 60 * 10**9
