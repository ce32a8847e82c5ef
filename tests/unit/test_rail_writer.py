"""labctl.run.rails.RailWriter: the rails of one switch go as one command, each rail's holding is
remembered after the acknowledgement, and a write cut short leaves the writer unsure (so the baseline
restore is never skipped as "nothing moved"). A recording switch stands in for a driver."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import pytest

from labctl.ocs.protocol import ApplyResult, Timed
from labctl.run.rails import RailWrite, RailWriter


class Recorder:
    """Enough of an OpticalSwitch for the writer: records each apply; `hold` keeps one from finishing."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.applies: list[tuple[frozenset[tuple[int, int]], frozenset[int], dict[str, Any]]] = []
        self.hold: asyncio.Event | None = None
        self.started = asyncio.Event()

    async def apply(
        self,
        mapping: Iterable[tuple[int, int]],
        *,
        scope: Iterable[int] | None = None,
        context: dict[str, Any] | None = None,
    ) -> Timed[ApplyResult]:
        self.applies.append((frozenset(mapping), frozenset(scope or ()), dict(context or {})))
        self.started.set()
        if self.hold is not None:
            await self.hold.wait()
        result = ApplyResult(self.name, frozenset(), frozenset(), frozenset(mapping), 1, 1, 2)
        return Timed(result, 0, 3)


async def test_rails_of_one_switch_are_one_command_and_remembered() -> None:
    shared, other = Recorder("ocs1"), Recorder("ocs2")
    told: list[tuple[int, Any, Any]] = []

    async def on_change(rail: int, before: Any, after: Any) -> None:
        told.append((rail, before, after))

    writer = RailWriter({0: shared, 1: shared, 2: other}, on_change=on_change)  # type: ignore[dict-item]
    outcomes = await writer.write_rails(
        [RailWrite(0, {(1, 9)}, {1, 9}), RailWrite(1, {(2, 10)}, {2, 10}), RailWrite(2, {(1, 5)}, {1, 5})],
        context={"step": 3},
    )
    assert [o.value.switch for o in outcomes if not isinstance(o, BaseException)] == ["ocs1", "ocs1", "ocs2"]
    ((patches, scope, context),) = shared.applies
    assert patches == {(1, 9), (2, 10)} and scope == {1, 2, 9, 10}
    assert context == {"step": 3, "rails": [0, 1]}
    assert other.applies[0][2] == {"step": 3, "rail": 2}
    assert writer.current == {0: {(1, 9)}, 1: {(2, 10)}, 2: {(1, 5)}}
    assert sorted(t[0] for t in told) == [0, 1, 2]  # each rail's change told once, after its acknowledgement
    assert writer.touched and not writer.unsure


async def test_a_write_cut_short_leaves_the_writer_unsure() -> None:
    switch = Recorder("ocs1")
    switch.hold = asyncio.Event()
    writer = RailWriter({0: switch})  # type: ignore[dict-item]
    task = asyncio.create_task(writer.write(0, {(1, 9)}, scope={1, 9}))
    await switch.started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert writer.unsure and writer.current == {0: frozenset()}  # not what it held, and it says so
