"""Parallelism → circuits, and the orchestrator's stage lock. The orchestrator against switches that take
real time (diffs, G1/G2 locks, retries, the giant-ring fallback) is
tests/integration/test_workload_orchestrator.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

from labctl.inventory.schema import load_inventory
from labctl.workload.circuits import JobCircuits, StageOwner, initial_state, topo_id
from labctl.workload.orchestrator import StageLock
from labctl.workload.stall import switch_points
from labctl.workload.trace import get_trace
from tests.helpers.workload_orchestrator import _lab


def test_testbed_circuits_are_the_timeline_experiments() -> None:
    circuits, _, _, _ = _lab()
    dp = (StageOwner("dp"), StageOwner("dp"))
    pp = (StageOwner("pp", 1), StageOwner("pp", 0))
    assert topo_id(dp) == "11" and topo_id(pp) == "00"
    for rail in (0, 1):
        ring = circuits.rail_mapping(rail, dp)
        pairs = circuits.rail_mapping(rail, pp)
        assert len(ring) == len(pairs) == 8  # 4 hosts x 2 ports, one patch per transmit fiber
        # Stage 0's sub-mapping under PP is half the pairs: the patches leaving h1 and h2.
        assert len(circuits.sub_mapping(rail, 0, pp[0])) == 4
    # h1's port 0 on rail 0 (tx 1, rx 33) reaches h3's port 0 (tx 5, rx 37) under PP.
    assert (1, 37) in circuits.rail_mapping(0, pp) and (5, 33) in circuits.rail_mapping(0, pp)


def test_config_2_circuits_on_a_64_gpu_inventory(tmp_path: Path) -> None:
    trace = get_trace("config-2")
    lines = ["lab: c2", "switches:", "  ocs0: {driver: sim, size: 128x128}", "hosts:"]
    for n, host in enumerate(trace.job.hosts):
        lines += [f"  {host}:", "    nics:"]
        for gpu in range(4):
            for k in range(2):
                tx = 1 + gpu * 32 + n * 2 + k
                lines.append(
                    f"      - {{ifname: p{gpu}{k}, rail: {gpu}, gpu: {gpu}, switch: ocs0, tx: {tx}, "
                    f"rx: {tx + 128}}}"
                )
    path = tmp_path / "c2.yaml"
    path.write_text("\n".join(lines) + "\n")
    circuits = JobCircuits(trace.job, load_inventory(path))
    states = {p.after for p in switch_points(trace)} | {
        initial_state(trace.job, (op for _, op in trace.rail_ops()))
    }
    circuits.check_states(states)
    dp = circuits.rail_mapping(3, (StageOwner("dp"), StageOwner("dp")))
    assert len(dp) == 16 * 2  # two DP rings of 8 hosts, 2 ports each
    assert circuits.groups(0, "dp") == [trace.job.hosts[:8]]


async def test_stage_lock_release_is_synchronous_and_a_cancelled_grant_is_handed_on() -> None:
    lock = StageLock()
    assert await lock.acquire_exclusive() is False
    waiter = asyncio.create_task(lock.acquire_shared())
    await asyncio.sleep(0)  # queued behind the change
    lock.release_exclusive()  # hands the lock to the waiter: no await, nothing a cancellation can cut
    waiter.cancel()  # cancelled after it was granted, before it ran
    await asyncio.gather(waiter, return_exceptions=True)
    assert lock.readers == 0 and not lock.writing
    async with asyncio.timeout(5):
        assert await lock.acquire_exclusive() is False
    lock.release_exclusive()
    # A change queued behind an operation is not overtaken by an operation that arrives after it.
    await lock.acquire_shared()
    change = asyncio.create_task(lock.acquire_exclusive())
    await asyncio.sleep(0)
    late_op = asyncio.create_task(lock.acquire_shared())
    await asyncio.sleep(0)
    assert not change.done() and not late_op.done()
    lock.release_shared()
    await asyncio.sleep(0)
    assert change.done() and not late_op.done()
    lock.release_exclusive()
    assert await late_op is True
    lock.release_shared()
