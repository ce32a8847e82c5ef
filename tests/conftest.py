"""Test hygiene shared by every test: no asyncio task may outlive its test."""

from __future__ import annotations

import asyncio
import inspect
import os
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.mosquitto import Mosquitto

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
async def _task_guard() -> AsyncIterator[None]:
    before = set(asyncio.all_tasks())
    yield
    await asyncio.sleep(0)  # let tasks that were just cancelled finish
    current = asyncio.current_task()
    leaked = [t for t in asyncio.all_tasks() if t is not current and t not in before and not t.done()]
    if leaked:
        names = ", ".join(sorted(t.get_name() for t in leaked))
        for t in leaked:
            t.cancel()
        await asyncio.gather(*leaked, return_exceptions=True)
        pytest.fail(f"test leaked {len(leaked)} asyncio task(s): {names}")


@pytest.fixture(autouse=True)
def _no_leaked_tasks(request: pytest.FixtureRequest) -> None:
    """Fail any async test that leaves an asyncio task running (ophyd-async does the same)."""
    if inspect.iscoroutinefunction(request.function):
        request.getfixturevalue("_task_guard")


IN_CI = os.environ.get("LABCTL_CI") == "1"


def require(condition: bool, reason: str) -> None:
    """Skip a test whose prerequisite is missing on a developer machine; in CI (LABCTL_CI=1) fail instead,
    so that nothing is skipped silently there."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"CI must run this test but: {reason}")
    pytest.skip(reason)


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture
def inventory_path() -> Path:
    return REPO / "inventory.yaml"


@pytest.fixture
def experiment_path() -> Path:
    return REPO / "experiments" / "reconfig-timeline.yaml"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--lab",
        metavar="INVENTORY",
        default=None,
        help="run tests/hardware against this lab (an inventory of real switches and hosts with agents); "
        "without it those tests are skipped",
    )


@pytest.fixture(scope="session")
def mosquitto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mosquitto]:
    """One broker for the whole session; tests keep apart by lab name (their topics)."""
    require(shutil.which("mosquitto") is not None, "mosquitto is not installed (apt-get install mosquitto)")
    broker = Mosquitto(tmp_path_factory.mktemp("mosquitto"))
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()
