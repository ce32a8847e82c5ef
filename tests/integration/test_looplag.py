"""The loop-lag monitor on a real loop: a callback that holds the loop is measured as lag where a task
woken by the timer would run, and the monitor stops cleanly (its timer closed, nothing left scheduled)."""

from __future__ import annotations

import asyncio
import time

from labctl.linux.looplag import LoopLagMonitor


async def test_a_held_loop_is_measured_and_the_monitor_stops_cleanly() -> None:
    async with LoopLagMonitor() as lag:
        await asyncio.sleep(0.02)
        asyncio.get_running_loop().call_soon(time.sleep, 0.008)  # holds the loop 8 ms
        await asyncio.sleep(0.02)
        lag.open_window()
        assert lag.window_max_ns == 0
        await asyncio.sleep(0.005)
    count = lag.count
    stats = lag.stats()
    assert stats["n"] == count >= 15  # ~1 kHz over ~45 ms (less on a busy machine)
    assert lag.max_ns >= 6_000_000  # the held loop, seen as at least most of its 8 ms
    assert stats["max"] == lag.max_ns and stats["median"] <= stats["p99"] <= stats["max"]
    assert lag._alarm is None and lag._handle is None
    await asyncio.sleep(0.005)
    assert lag.count == count  # stopped: no more wake-ups
