"""The tests of one group run on one pytest-xdist worker, one after another, under any pytest and xdist.

pytest-xdist's `--dist loadgroup` puts a test's group into its node id (`…::test@root`) by writing the
item's private `_nodeid`; pytest 9.2 keeps node ids elsewhere, so under pytest 9.2 with xdist 3.8 no test
had a group and the root tests ran on four workers at once (issue 45: links left in the root namespace,
"a rehearsal … is already up"). And 3.8 joins every group mark a test carries (`agents_root`), where 3.7
took the closest. So the suite schedules groups itself, through xdist's public scheduler hook:
- each test gets exactly one group mark (`assign_groups`: the root tier's, else the closest it had);
- each worker writes node id → group to a file named by the run's id (`write_groups`);
- the controller's `GroupScheduling` (xdist's load-scope scheduler) reads that file to tell each test's
  group, and sends a group to one worker as a unit.
A root test also holds a lock for its run (`alone_in_tier`) and fails at once if another worker holds it,
so a split tier shows as a failure, not as flaky network-namespace leaks.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

GROUP_MARK = "xdist_group"
ROOT_GROUP = "root"


def group_name(mark: pytest.Mark) -> str:
    """The group a mark names, as pytest-xdist reads it."""
    return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))


def assign_groups(items: Sequence[pytest.Item], forced: Callable[[pytest.Item], str | None]) -> None:
    """Give each item exactly one group mark: `forced(item)` where it names one (the root tier), else the
    closest group mark the item had (its own, its class's, its module's), else none. The group marks of the
    items' classes and modules move onto the items, so nothing above an item adds a second name."""
    chosen: dict[int, str | None] = {}
    for item in items:
        closest = item.get_closest_marker(GROUP_MARK)
        chosen[id(item)] = forced(item) or (group_name(closest) if closest is not None else None)
    for item in items:
        for node in item.listchain():
            node.own_markers[:] = [m for m in node.own_markers if m.name != GROUP_MARK]
            # a class's `pytestmark` is read again for each item of it: empty it too
            marks = getattr(getattr(node, "obj", None), "pytestmark", None)
            if isinstance(marks, list) and any(getattr(m, "name", None) == GROUP_MARK for m in marks):
                node.obj.pytestmark = [m for m in marks if getattr(m, "name", None) != GROUP_MARK]
    for item in items:
        group = chosen[id(item)]
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


def groups_of(item: pytest.Item) -> set[str]:
    """Every group name pytest-xdist would join for this item."""
    return {group_name(mark) for mark in item.iter_markers(GROUP_MARK)}


def run_id(config: pytest.Config | None = None) -> str:
    """The xdist run's id, the same on the controller and every worker; this process's pid without xdist."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        return str(workerinput["testrunuid"])
    if config is not None and getattr(config.option, "testrunuid", None):
        return str(config.option.testrunuid)
    return os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"pid{os.getpid()}"


def share_run_id(config: pytest.Config) -> None:
    """On the controller: fix the run's id before xdist starts its workers (they get it in workerinput), so
    the controller knows which groups file its workers write."""
    if not hasattr(config, "workerinput") and getattr(config.option, "testrunuid", "") is None:
        config.option.testrunuid = uuid.uuid4().hex


def groups_path(run: str) -> Path:
    return Path(tempfile.gettempdir()) / f"labctl-xdist-groups-{run}.json"


def lock_path(run: str | None = None) -> Path:
    """One lock file per pytest run, shared by its workers."""
    return Path(tempfile.gettempdir()) / f"labctl-root-tier-{run or run_id()}.lock"


def write_groups(config: pytest.Config, items: Sequence[pytest.Item]) -> None:
    """On a worker: node id → group for every grouped item (every worker collects the same items, so each
    writes the same file; written whole and renamed, so a reader never sees half of one)."""
    if not hasattr(config, "workerinput"):
        return
    groups = {item.nodeid: sorted(groups_of(item))[0] for item in items if groups_of(item)}
    path = groups_path(run_id(config))
    part = path.with_name(f"{path.name}.{os.getpid()}")
    part.write_text(json.dumps(groups))
    os.replace(part, path)


def remove_run_files(config: pytest.Config) -> None:
    """On the controller, at the end: the run's groups and lock files."""
    if hasattr(config, "workerinput"):
        return
    run = run_id(config)
    for path in (groups_path(run), lock_path(run)):
        path.unlink(missing_ok=True)


def make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's load-scope scheduler with each test's scope its group (from the workers' file), or the test
    itself where it has none: what `--dist loadgroup` means, whatever the node ids hold."""
    from xdist.scheduler import LoadScopeScheduling  # only where xdist runs the suite

    path = groups_path(run_id(config))

    class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:
                # read once the workers' collections are in (xdist asks for scopes only after that)
                self.groups = json.loads(path.read_text()) if path.exists() else {}
            group = self.groups.get(nodeid)
            return f"group:{group}" if group is not None else nodeid

    return GroupScheduling(config, log)


@contextmanager
def alone_in_tier(path: Path) -> Iterator[None]:
    """Hold the tier's lock for one test; fail at once if another worker holds it (the tier was split)."""
    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            worker = os.environ.get("PYTEST_XDIST_WORKER", "?")
            pytest.fail(
                f"a root test is running on another xdist worker while this one ({worker}) runs: the root "
                "tier must stay on one worker (tests/helpers/tiers.py)",
                pytrace=False,
            )
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
