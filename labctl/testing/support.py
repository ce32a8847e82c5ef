"""What every test helper of labctl.testing shares: a prerequisite that skips (or, in labctl's CI, fails), and
the check that no asyncio task outlived a test."""

from __future__ import annotations

import asyncio
import os

import pytest

IN_CI = os.environ.get("LABCTL_CI") == "1"
"""labctl's own CI sets LABCTL_CI=1: there a missing prerequisite fails the test instead of skipping it."""


def require(condition: bool, reason: str) -> None:
    """Skip a test whose prerequisite is missing on a developer machine; in CI (LABCTL_CI=1) fail instead,
    so that nothing is skipped silently there."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"CI must run this test but: {reason}")
    pytest.skip(reason)


def tasks_since(before: set[asyncio.Task[object]]) -> list[asyncio.Task[object]]:
    """The tasks of the running loop that were not in `before`, are not the current one and still run."""
    current = asyncio.current_task()
    return [t for t in asyncio.all_tasks() if t is not current and t not in before and not t.done()]


async def fail_on_leaked_tasks(before: set[asyncio.Task[object]]) -> None:
    """After a test: one loop turn (tasks just cancelled finish), then cancel and await whatever still runs
    that was not running before it, and fail the test naming those tasks."""
    await asyncio.sleep(0)
    leaked = tasks_since(before)
    if leaked:
        names = ", ".join(sorted(t.get_name() for t in leaked))
        for t in leaked:
            t.cancel()
        await asyncio.gather(*leaked, return_exceptions=True)
        pytest.fail(f"test leaked {len(leaked)} asyncio task(s): {names}")


def names_of(value: object) -> tuple[str, ...] | None:
    """A contract class's `driver` or `probe` as the subclass gives it: a name or names (None: a fixture of
    that name supplies it)."""
    if isinstance(value, str):
        return (value,)
    if isinstance(value, tuple | list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    return None
