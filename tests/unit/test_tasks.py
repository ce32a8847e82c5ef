"""labctl.core.tasks.concurrently: gather's results and errors, in order, with fewer loop turns."""

from __future__ import annotations

import asyncio

import pytest

from labctl.core.tasks import concurrently


async def test_results_and_errors_in_order() -> None:
    async def value(x: int) -> int:
        return x

    async def fail() -> int:
        raise ValueError("rail 1")

    results = await concurrently([value(0), fail(), value(2)])
    assert results[0] == 0 and isinstance(results[1], ValueError) and results[2] == 2
    assert await concurrently([]) == []


async def test_the_first_runs_inline_and_the_others_at_once() -> None:
    order: list[str] = []
    release = asyncio.Event()

    async def step(name: str) -> str:
        order.append(f"{name} starts")
        await release.wait()
        order.append(f"{name} ends")
        return name

    async def releaser() -> str:
        order.append("releaser starts")
        release.set()
        return "released"

    assert await concurrently([step("a"), step("b"), releaser()]) == ["a", "b", "released"]
    assert order[:3] == ["a starts", "b starts", "releaser starts"]  # b did not wait for a to end


async def test_cancellation_cancels_the_others_and_propagates() -> None:
    started = asyncio.Event()
    cancelled: list[str] = []

    async def forever(name: str) -> None:
        try:
            started.set()
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(name)
            raise

    outer = asyncio.ensure_future(concurrently([forever("a"), forever("b")]))
    await started.wait()
    await asyncio.sleep(0)
    outer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await outer
    assert sorted(cancelled) == ["a", "b"]
