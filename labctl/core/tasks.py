"""Running a few awaitables at once with the fewest loop turns."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import TypeVar

T = TypeVar("T")


async def concurrently(awaitables: Sequence[Awaitable[T]]) -> list[T | Exception]:
    """Each awaitable's result or the Exception it raised, in order, as `asyncio.gather(...,
    return_exceptions=True)` gives them, but with loop turns saved: the first runs inline in the caller's
    task (it starts now, not a turn later) and each other is a task awaited directly (woken one turn after
    it finishes, where gather takes two). Every turn costs whatever samplers are due, and a topology
    write pays them on its way to the switch and back (decision 0050). Cancellation (BaseException) is not
    captured: it cancels the tasks still running and propagates."""
    if not awaitables:
        return []
    tasks = [asyncio.ensure_future(a) for a in awaitables[1:]]
    results: list[T | Exception] = []
    try:
        try:
            results.append(await awaitables[0])
        except Exception as e:
            results.append(e)
        for task in tasks:
            try:
                results.append(await task)
            except Exception as e:
                results.append(e)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    return results
