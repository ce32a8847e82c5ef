"""The root tier stays on one pytest-xdist worker under the installed pytest-xdist (issue 45: 3.8 joined a
module's `xdist_group` with the root group, and root tests ran on several workers at once)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.helpers.tiers import groups_of

pytestmark = pytest.mark.slow

CONFTEST = """
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, {repo!r})
from tests.helpers.tiers import (
    ROOT_GROUP, alone_in_tier, assign_groups, lock_path, make_scheduler, remove_run_files, run_id,
    share_run_id, write_groups,
)


def pytest_configure(config):
    share_run_id(config)
    config.addinivalue_line("markers", "root: needs root")


def pytest_unconfigure(config):
    remove_run_files(config)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    assign_groups(items, lambda item: ROOT_GROUP if item.get_closest_marker("root") else None)
    write_groups(config, items)


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    return make_scheduler(config, log) if config.getvalue("dist") == "loadgroup" else None


@pytest.fixture(autouse=True)
def _alone(request):
    if request.node.get_closest_marker("root") is None:
        yield
        return
    with alone_in_tier(lock_path(run_id(request.config))):
        yield
"""

MODULE = """
import os
import time
from pathlib import Path

import pytest

{pytestmark}


@pytest.mark.parametrize("case", range(4))
@pytest.mark.root
def test_root(case):
    time.sleep(0.05)  # long enough that a second worker running root tests would overlap this one
    with Path({out!r}).open("a") as f:
        f.write(f"{{os.environ['PYTEST_XDIST_WORKER']}} {{__name__}} {{case}}\\n")


@pytest.mark.parametrize("case", range(4))
def test_other(case):
    time.sleep(0.02)
"""


def test_root_tests_of_several_modules_run_on_one_worker(tmp_path: Path) -> None:
    suite, out = tmp_path / "suite", tmp_path / "workers.txt"
    suite.mkdir()
    (suite / "conftest.py").write_text(CONFTEST.format(repo=str(REPO)))
    (suite / "pytest.ini").write_text("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    for name, mark in [
        ("test_agents_like", 'pytestmark = pytest.mark.xdist_group("agents")'),
        ("test_plain", ""),
        ("test_class_marked", ""),
    ]:
        (suite / f"{name}.py").write_text(MODULE.format(pytestmark=mark, out=str(out)))
    (suite / "test_class_marked.py").write_text(
        textwrap.dedent(
            f"""
            import os
            from pathlib import Path

            import pytest


            @pytest.mark.xdist_group("gpu")
            class TestMarked:
                @pytest.mark.root
                def test_root(self):
                    with Path({str(out)!r}).open("a") as f:
                        f.write(f"{{os.environ['PYTEST_XDIST_WORKER']}} class 0\\n")
            """
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHONPATH"))}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "3", "--dist", "loadgroup", "-p", "no:cacheprovider", "-q"],
        cwd=suite,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = out.read_text().splitlines()
    assert len(lines) == 9, lines  # 4 + 4 root cases, and the class's one
    workers = {line.split()[0] for line in lines}
    assert len(workers) == 1, f"root tests ran on {sorted(workers)}: {lines}"


def test_every_test_here_has_one_group_and_root_tests_the_root_one(request: pytest.FixtureRequest) -> None:
    """Over this session's collected items: no test carries two group names (which xdist 3.8 would join)."""
    items = request.session.items
    assert items
    for item in items:
        groups = groups_of(item)
        assert len(groups) <= 1, f"{item.nodeid}: {sorted(groups)}"
        if item.get_closest_marker("root") is not None:
            assert groups == {"root"}, f"{item.nodeid}: {sorted(groups)}"
