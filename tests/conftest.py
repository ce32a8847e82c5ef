"""Test hygiene shared by every test: no asyncio task may outlive its test, and every run a test makes obeys
causality (labctl.analysis.invariants: no traffic on a port whose link is down)."""

from __future__ import annotations

import asyncio
import inspect
import os
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from labctl.analysis.invariants import check_file
from labctl.core.events import EventLog
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


_TO_CHECK: set[Path] = set()
"""Event logs opened or closed in this process since the last check (a run's events.jsonl, wherever its out
dir is: a test's tmp_path, a module-scoped fixture's directory)."""
_CHECKED: dict[Path, tuple[int, int]] = {}
"""Each event log checked, with the size and mtime it had then (one written since is checked again)."""
MAX_LINES = 20


@pytest.fixture(scope="session", autouse=True)
def _record_event_logs() -> Iterator[None]:
    """Note the path of every `EventLog` this process opens or closes, for `_runs_are_causal`."""
    original_init, original_close = EventLog.__init__, EventLog.close

    def init(self: EventLog, path: Path | None, *args: Any, **kwargs: Any) -> None:
        original_init(self, path, *args, **kwargs)
        if path is not None:
            _TO_CHECK.add(Path(path).resolve())

    def close(self: EventLog) -> None:
        original_close(self)
        if self.path is not None:
            _TO_CHECK.add(Path(self.path).resolve())

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(EventLog, "__init__", init)
        mp.setattr(EventLog, "close", close)
        yield


@pytest.fixture(autouse=True)
def _runs_are_causal(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test, the causality invariant (labctl.analysis.invariants) over every event log written since the
    last check: those this process opened or closed, and any events.jsonl under the test's tmp_path (a
    `labctl` subprocess may have written it). A test whose events break it on purpose says so:
    `@pytest.mark.acausal(why)`."""
    tmp = Path(request.getfixturevalue("tmp_path")) if "tmp_path" in request.fixturenames else None
    yield
    paths = set(_TO_CHECK)
    _TO_CHECK.clear()
    if tmp is not None and tmp.exists():
        paths.update(p.resolve() for p in tmp.rglob("events.jsonl"))
    exempt = request.node.get_closest_marker("acausal") is not None
    problems: list[str] = []
    for path in sorted(paths):
        try:
            st = path.stat()
        except FileNotFoundError:  # removed by its test, or never written: nothing to check
            continue
        stamp = (st.st_size, st.st_mtime_ns)
        if _CHECKED.get(path) == stamp:
            continue
        _CHECKED[path] = stamp
        violations = [] if exempt else check_file(path)
        if violations:
            problems.append(f"{path}: {len(violations)} causality violation(s):")
            problems += [f"  {v.line()}" for v in violations[:MAX_LINES]]
            if len(violations) > MAX_LINES:
                problems.append(f"  ... and {len(violations) - MAX_LINES} more")
    if problems:
        pytest.fail("traffic on a port whose link was down:\n" + "\n".join(problems), pytrace=False)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "acausal(why): the test's events break causality on purpose (not checked by the invariant)"
    )


TIERS = {
    "unit": "unit",
    "integration": "integration",
    "contract": "integration",
    "emulated": "emulated",
    "hardware": "hardware",
}
"""The marker each folder of tests/ gives its tests (pyproject.toml says what each tier holds), so that
`pytest -m "not integration"` and the like select tiers."""
ROOT_FIXTURES = frozenset({"netns", "fabric_prefix", "own_rehearsal_inventory", "chronyd_pair", "ptp4l_pair"})
"""Fixtures that need root (network namespaces, veth pairs, daemons run as root): their tests are `root`."""
TESTS = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)  # before xdist's, which reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test with its folder's tier, and `root` where it needs root: an `emulated` mark of its own
    (it runs in network namespaces) or a fixture of ROOT_FIXTURES."""
    for item in items:
        try:
            folder = Path(item.path).resolve().relative_to(TESTS).parts[0]
        except ValueError:  # a test outside tests/ (pytester's own)
            continue
        # before the tier's own marker: an `emulated` the test carries itself says it needs root
        needs_root = item.get_closest_marker("emulated") is not None or bool(
            ROOT_FIXTURES & set(getattr(item, "fixturenames", ()))
        )
        tier = TIERS.get(folder)
        if tier is not None:
            item.add_marker(tier)
        if needs_root:
            item.add_marker("root")
            # Under pytest-xdist the root tests run one after another on one worker: they build network
            # namespaces, veths in the root namespace and management subnets, which the fabric fixtures
            # check for leaks against the whole machine.
            item.add_marker(pytest.mark.xdist_group("root"))


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
