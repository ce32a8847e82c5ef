"""Parallelism → circuits and the orchestrator: minimal per-stage diffs, G1/G2 locks (each shown to be
needed: without it the audit finds the overlap), retries and the giant-ring fallback."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from labctl.drivers.sim.switch import SimSwitch
from labctl.events import Event, Kind
from labctl.inventory import load_inventory
from labctl.mapping import diff_mapping, validate_mapping
from labctl.models.switch import SwitchModel
from labctl.profiles import resolve_profile
from labctl.workload.circuits import JobCircuits, StageOwner, after_op, initial_state, topo_id
from labctl.workload.orchestrator import JobOrchestrator, violations
from labctl.workload.stall import switch_points
from labctl.workload.trace import get_trace

REPO = Path(__file__).resolve().parents[2]


def _lab(switching_ms: float = 20.0) -> tuple[JobCircuits, dict[str, SimSwitch], SwitchModel, list[Event]]:
    inventory = load_inventory(REPO / "inventory.yaml")
    profile = resolve_profile("fast").model_copy(update={"switching_ms": (switching_ms, switching_ms)})
    model = SwitchModel("ocs1", inventory.switches["ocs1"].space, profile, random.Random(1))
    events: list[Event] = []
    switch = SimSwitch(model, events.append)
    circuits = JobCircuits(get_trace("opus-testbed").job, inventory)
    return circuits, {"ocs1": switch}, model, events


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


async def test_only_changed_stages_are_reprogrammed() -> None:
    circuits, switches, model, events = _lab()
    trace = get_trace("opus-testbed")
    dp = initial_state(trace.job, (op for _, op in trace.rail_ops()))
    await switches["ocs1"].connect()
    orch = JobOrchestrator(circuits, switches, dp, events.append)
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
    orch = JobOrchestrator(circuits, switches, dp, events.append, locking=locking)
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
    orch = JobOrchestrator(circuits, switches, dp, events.append, locking=locking)
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
    orch = JobOrchestrator(circuits, switches, dp, events.append, retries=1)
    # Each apply's convergence tries 3 times; 2 rails x 2 tries x 3 = 12 refusals exhaust every try.
    model.refusals = 12
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
