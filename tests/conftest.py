"""Test hygiene shared by every test: no asyncio task may outlive its test, and every run a test makes obeys
causality (labctl.analysis.invariants: no traffic on a port whose link is down).

The fixtures a lab's own tests get too (the task guard, a broker, a simulated lab, an emulator, a kernel
fabric) are labctl's pytest plugin, labctl.testing.plugin; `pytest_configure` below registers it unless the
installed `labctl` pytest11 entry point already has."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from labctl.analysis.invariants import check_file
from labctl.core.events import EventLog
from labctl.testing.mosquitto import Mosquitto
from labctl.testing.support import IN_CI, require
from tests.helpers.tiers import (
    ROOT_GROUP,
    alone_in_tier,
    assign_groups,
    lock_path,
    make_scheduler,
    remove_run_files,
    run_id,
    share_run_id,
    write_groups,
)

__all__ = ["IN_CI", "REPO", "require"]  # `from tests.conftest import require` still works

REPO = Path(__file__).resolve().parent.parent
PLUGIN = "labctl"
"""The name of labctl's pytest plugin: its pytest11 entry point's, and the one registered here without it."""


@pytest.fixture(autouse=True)
def _no_leaked_tasks(labctl_no_leaked_tasks: None) -> None:
    """Fail any async test that leaves an asyncio task running (the plugin's guard, on every test here)."""


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
    share_run_id(config)
    # labctl's plugin, once: through its entry point where the installed labctl has one, else from here
    # (registering it under the entry point's name, so that `-p no:labctl` still turns it off).
    plugin = importlib.import_module("labctl.testing.plugin")
    if not config.pluginmanager.is_registered(plugin) and not config.pluginmanager.is_blocked(PLUGIN):
        config.pluginmanager.register(plugin, PLUGIN)
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
ROOT_FIXTURES = frozenset(
    {
        "netns",
        "fabric_prefix",
        "own_rehearsal_inventory",
        "chronyd_pair",
        "ptp4l_pair",
        "labctl_kernel_fabric",
    }
)
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
    # Under pytest-xdist the root tests run one after another on one worker: they build network namespaces,
    # veths in the root namespace and management subnets, which the fabric fixtures check for leaks against
    # the whole machine. One group mark per test, whatever its module says (tests/helpers/tiers.py).
    assign_groups(items, lambda item: ROOT_GROUP if item.get_closest_marker("root") is not None else None)
    write_groups(config, items)


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadgroup` as tests/helpers/tiers.py schedules it (xdist's own needs private node ids)."""
    return make_scheduler(config, log) if config.getvalue("dist") == "loadgroup" else None


def pytest_unconfigure(config: pytest.Config) -> None:
    remove_run_files(config)


@pytest.fixture(autouse=True)
def _root_tier_alone(request: pytest.FixtureRequest) -> Iterator[None]:
    """A root test fails at once if another root test runs beside it on another worker."""
    if request.node.get_closest_marker("root") is None:
        yield
        return
    with alone_in_tier(lock_path(run_id(request.config))):
        yield


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--lab",
        metavar="INVENTORY",
        default=None,
        help="run tests/hardware against this lab (an inventory of real switches and hosts with agents); "
        "without it those tests are skipped",
    )


@pytest.fixture(scope="session")
def mosquitto(labctl_mosquitto: Mosquitto) -> Mosquitto:
    """One broker for the whole session (the plugin's); tests keep apart by lab name (their topics)."""
    return labctl_mosquitto
