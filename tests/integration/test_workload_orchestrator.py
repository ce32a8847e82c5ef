"""Parallelism → circuits and the orchestrator: minimal per-stage diffs, G1/G2 locks (each shown to be
needed: without it the audit finds the overlap), retries and the giant-ring fallback."""

from __future__ import annotations

import asyncio
import time

import pytest

from labctl.core.events import Kind
from labctl.inventory.mapping import diff_mapping, validate_mapping
from labctl.ocs.drivers.sim.switch import SimSwitch
from labctl.workload.circuits import JobCircuits, StageOwner, after_op, initial_state, topo_id
from labctl.workload.orchestrator import JobOrchestrator, violations
from labctl.workload.trace import get_trace
from tests.helpers.workload_orchestrator import _lab, writer


async def test_only_changed_stages_are_reprogrammed() -> None:
    circuits, switches, model, events = _lab()
    trace = get_trace("opus-testbed")
    dp = initial_state(trace.job, (op for _, op in trace.rail_ops()))
    await switches["ocs1"].connect()
    orch = JobOrchestrator(circuits, writer(circuits, switches, dp), dp, events.append)
    for rail in circuits.rails:  # the baseline, as the controller sets it
        await switches["ocs1"].apply(circuits.rail_mapping(rail, dp), scope=circuits.rail_scope(rail))
    # PP between the two stages: both digits change, so both sub-mappings are reprogrammed.
    pp_op = next(op for _, op in trace.rail_ops() if op.group == "pp")
    pp = after_op(dp, pp_op)
    events.clear()
    result = await orch.write(pp)
    assert result.stages == (0, 1) and result.topo_id == "00" and result.switch_done_ns is not None
    assert model.patches == validate_mapping(
        [*circuits.rail_mapping(0, pp), *circuits.rail_mapping(1, pp)], model.space
    )
    # DP on stage 1 only: stage 0 keeps digit 0 but its partner left PP (its ports go dark); stage 1's
    # DP ring is sent, nothing is added on stage 0's ports.
    from labctl.workload.trace import Op

    dp1 = Op(0, 0, "dp-stage-1", "dp", "allreduce", 1 << 24, 0, 1, (1,), True)
    target = after_op(pp, dp1)
    assert topo_id(target) == "01"
    events.clear()
    await orch.write(target)
    commands = [e for e in events if e.kind == Kind.OCS_COMMAND]
    stage1 = circuits.stage_ports(0, 1) | circuits.stage_ports(1, 1)
    stage0 = circuits.stage_ports(0, 0) | circuits.stage_ports(1, 0)
    sent = {p for e in commands for patch in e.meta["add"] for p in patch}
    assert sent and sent <= stage1 and not sent & stage0
    # A write to the same topo_id sends nothing (O1 at the orchestrator).
    events.clear()
    assert (await orch.write(target)).stages == ()
    assert not [e for e in events if e.kind == Kind.OCS_COMMAND]
    assert diff_mapping(model.patches, model.patches).empty
    await switches["ocs1"].close()
    model.cancel_pending()


@pytest.mark.parametrize("locking", [True, False])
async def test_g2_no_change_under_an_operation_in_flight(locking: bool) -> None:
    circuits, switches, model, events = _lab()
    trace = get_trace("opus-testbed")
    dp = initial_state(trace.job, (op for _, op in trace.rail_ops()))
    pp = after_op(dp, next(op for _, op in trace.rail_ops() if op.group == "pp"))
    await switches["ocs1"].connect()
    orch = JobOrchestrator(circuits, writer(circuits, switches, dp), dp, events.append, locking=locking)
    op_started = asyncio.Event()

    async def operation() -> None:
        async with orch.operation("ag", (0, 1)):
            op_started.set()
            await asyncio.sleep(0.1)

    op = asyncio.create_task(operation())
    await op_started.wait()
    result = await orch.write(pp)
    await op
    found = violations(orch.intervals)
    if locking:
        assert found == [] and result.g2_wait_ns > 0
    else:
        assert found, "without the lock the change ran under the operation: the audit must see it"
    await switches["ocs1"].close()
    model.cancel_pending()


@pytest.mark.parametrize("locking", [True, False])
async def test_g1_no_operation_on_a_topology_being_changed(locking: bool) -> None:
    circuits, switches, model, events = _lab(switching_ms=80.0)
    trace = get_trace("opus-testbed")
    dp = initial_state(trace.job, (op for _, op in trace.rail_ops()))
    pp = after_op(dp, next(op for _, op in trace.rail_ops() if op.group == "pp"))
    await switches["ocs1"].connect()
    orch = JobOrchestrator(circuits, writer(circuits, switches, dp), dp, events.append, locking=locking)
    sent = asyncio.Event()
    switches["ocs1"]._emit = lambda e: (events.append(e), sent.set() if e.kind == Kind.OCS_COMMAND else None)
    change = asyncio.create_task(orch.write(pp))
    await sent.wait()  # the switch is moving
    async with orch.operation("pp", (0, 1)) as waited:
        await asyncio.sleep(0.01)
    await change
    found = violations(orch.intervals)
    if locking:
        assert found == [] and waited > 0
    else:
        assert found and waited == 0
    await switches["ocs1"].close()
    model.cancel_pending()


async def test_retry_then_giant_ring_fallback() -> None:
    circuits, switches, model, events = _lab()
    trace = get_trace("opus-testbed")
    dp = initial_state(trace.job, (op for _, op in trace.rail_ops()))
    pp = after_op(dp, next(op for _, op in trace.rail_ops() if op.group == "pp"))
    await switches["ocs1"].connect()
    orch = JobOrchestrator(circuits, writer(circuits, switches, dp), dp, events.append, retries=1)
    # Both rails of ocs1 go as one command (decision 0054), and each apply's convergence tries 3 times:
    # 2 tries x 3 = 6 refusals exhaust every try.
    model.refusals = 6
    result = await orch.write(pp)
    assert result.fallback and orch.fallback is not None
    assert [e.value for e in events if e.kind == Kind.WORKLOAD_RETRY]
    done = [e for e in events if e.kind == Kind.WORKLOAD_FALLBACK and e.meta["phase"] == "done"]
    assert done and done[0].value == "giant ring up"
    ring = validate_mapping([*circuits.giant_ring(0), *circuits.giant_ring(1)], model.space)
    assert model.patches == ring
    # Later writes are no-ops: every operation runs on the giant ring.
    assert (await orch.write(dp)).fallback
    await switches["ocs1"].close()
    model.cancel_pending()


DP, DARK = StageOwner("dp"), StageOwner("pp", None)


async def _baseline(
    circuits: JobCircuits, switches: dict[str, SimSwitch], state: tuple[StageOwner, ...]
) -> None:
    await switches["ocs1"].connect()
    for rail in circuits.rails:
        await switches["ocs1"].apply(circuits.rail_mapping(rail, state), scope=circuits.rail_scope(rail))


async def test_the_giant_ring_waits_for_operations_on_stages_the_failed_write_did_not_lock() -> None:
    # pp = 2; an op runs on stage 0 while a write changes stage 1 only and fails on every try: the ring
    # rewires stage 0 too, so it must wait for that op (G2 over every stage) and its interval says so.
    circuits, switches, model, events = _lab()
    await _baseline(circuits, switches, (DP, DP))
    orch = JobOrchestrator(circuits, writer(circuits, switches, (DP, DP)), (DP, DP), events.append, retries=0)
    op_started, op_ended = asyncio.Event(), 0

    async def operation() -> None:
        nonlocal op_ended
        async with orch.operation("ag-stage-0", (0,)):
            op_started.set()
            await asyncio.sleep(0.2)
        op_ended = time.monotonic_ns()

    op = asyncio.create_task(operation())
    await op_started.wait()
    model.refusals = 3  # the 3 commands of one try (both rails of ocs1 in each)
    result = await orch.write((DP, DARK))
    await op
    assert result.stages == (1,) and result.fallback and orch.fallback is not None
    ring = [e for e in events if e.kind == Kind.OCS_COMMAND and e.meta.get("giant_ring")]
    assert ring and min(e.t_ns for e in ring) >= op_ended
    assert orch.fallback["status"] == "up" and orch.fallback["giant_ring_failed"] == []
    everything = frozenset((rail, s) for rail in circuits.rails for s in (0, 1))
    assert [i.cells for i in orch.intervals if i.label == "giant-ring"] == [everything]
    assert violations(orch.intervals) == []
    await switches["ocs1"].close()
    model.cancel_pending()


async def test_an_interrupted_fallback_is_recorded_as_interrupted() -> None:
    circuits, switches, model, events = _lab()
    await _baseline(circuits, switches, (DP, DP))
    orch = JobOrchestrator(circuits, writer(circuits, switches, (DP, DP)), (DP, DP), events.append, retries=0)
    release = asyncio.Event()
    op_started = asyncio.Event()

    async def operation() -> None:
        async with orch.operation("ag-stage-0", (0,)):
            op_started.set()
            await release.wait()

    op = asyncio.create_task(operation())
    await op_started.wait()
    model.refusals = 6
    started = asyncio.Event()
    orch.emit = lambda e: (events.append(e), started.set() if e.kind == Kind.WORKLOAD_FALLBACK else None)
    write = asyncio.create_task(orch.write((DP, DARK)))
    await started.wait()  # the change failed; the ring now waits for the op on stage 0
    await asyncio.sleep(0.02)
    write.cancel()
    await asyncio.gather(write, return_exceptions=True)
    release.set()
    await op
    assert orch.fallback["status"] == "interrupted" and orch.fallback["giant_ring_failed"]
    from labctl.workload.experiment import replay_lines

    (line,) = replay_lines({"replay": {**_SUMMARY, "fallback": orch.fallback}})[1:]
    assert "fallback interrupted" in line and "giant ring failed" not in line
    # Every lock was handed back: a later operation on every stage goes through at once.
    async with asyncio.timeout(5), orch.operation("after", (0, 1)) as waited:
        assert waited == 0
    await switches["ocs1"].close()
    model.cancel_pending()


_SUMMARY = {
    "mode": "provisioning",
    "steps": 1,
    "native_ns": 1,
    "step_ns": 1,
    "stall_ns": 0,
    "switches_per_step": 1,
    "model_stall_ns": 0,
    "g1_wait_ns": 0,
    "g2_wait_ns": 0,
}


async def test_concurrent_writes_diff_against_what_the_previous_one_left() -> None:
    # Both writes start from 11; the second must diff against the first's 00 (both stages), not 11
    # (stage 1 only), or stage 0 keeps the first write's PP pairs while the state says DP.
    circuits, switches, model, events = _lab()
    await _baseline(circuits, switches, (DP, DP))
    orch = JobOrchestrator(circuits, writer(circuits, switches, (DP, DP)), (DP, DP), events.append)
    pp = (StageOwner("pp", 1), StageOwner("pp", 0))
    first, second = await asyncio.gather(orch.write(pp), orch.write((DP, DARK)))
    assert first.stages == (0, 1) and second.stages == (0, 1)
    assert orch.state == (DP, DARK) and all(r.state == (DP, DARK) for r in orch.rails)
    held = validate_mapping(
        [p for rail in circuits.rails for p in circuits.rail_mapping(rail, orch.state)], model.space
    )
    assert model.patches == held
    assert violations(orch.intervals) == []
    await switches["ocs1"].close()
    model.cancel_pending()
