"""The run engine's pump: a probe's events recorded in order, a burst a time slice per loop turn, a few
events taken from the queue at a time; the events a probe puts while stopping are still recorded."""

from __future__ import annotations

import asyncio
from typing import Any

from labctl.core.clock import Timebase
from labctl.core.events import Event, EventLog
from labctl.probes import sampling
from labctl.run.engine import RunEngine


class _Burst(sampling.QueueProbe):
    name = "burst"

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    async def _run(self) -> None:
        for i in range(self.n):
            self.queue.put(Event(t_ns=i, kind="x", source=f"p{i % 7}"))
        await asyncio.Event().wait()


class _Engine:
    """What `RunEngine._pump` uses of its engine: the event log."""

    def __init__(self) -> None:
        self.events = EventLog(None, Timebase(mono0_ns=0, wall0_ns=0))


async def test_a_burst_is_recorded_in_order_over_several_loop_turns() -> None:
    engine: Any = _Engine()
    seen: list[int] = []
    engine.events.subscribe(lambda e: seen.append(e.t_ns))
    probe = _Burst(20_000)
    turns = 0
    async with probe:
        pump = asyncio.create_task(RunEngine._pump(engine, probe))
        while engine.events.count < 20_000:
            await asyncio.sleep(0)
            turns += 1
            assert turns < 100_000
        probe.queue.put(Event(t_ns=20_000, kind="x", source="late"))  # said while stopping
    await pump  # the stream ended: the pump returns once it has recorded everything
    assert engine.events.count == 20_001
    assert seen == list(range(20_001))
    assert turns > 1  # 20,000 events are not recorded in one loop turn
