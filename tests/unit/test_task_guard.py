"""The leaked-task guard itself must be able to fail."""

from __future__ import annotations

import asyncio

import pytest

pytest_plugins = ["pytester"]


def test_guard_fails_a_test_that_leaks_a_task(pytester: pytest.Pytester, repo) -> None:
    pytester.makeconftest((repo / "tests" / "conftest.py").read_text())
    pytester.makepyfile(
        """
        import asyncio

        async def test_leaks():
            asyncio.create_task(asyncio.sleep(10), name="leaky-sleeper")

        async def test_clean():
            await asyncio.sleep(0)
        """
    )
    result = pytester.runpytest(
        "-o",
        "asyncio_mode=auto",
        "-o",
        "asyncio_default_fixture_loop_scope=function",
        "-p",
        "no:benchmark",  # where pytest-benchmark is installed, it refuses to run inside an xdist worker
    )
    result.assert_outcomes(passed=2, errors=1)  # test_leaks passes, then errors at teardown
    result.stdout.fnmatch_lines(["*leaked 1 asyncio task(s): leaky-sleeper*"])


async def test_guard_allows_finished_tasks() -> None:
    await asyncio.create_task(asyncio.sleep(0))
