"""The controller end to end on the simulated lab (fast profile), in-process."""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import labctl
import labctl.labs
from labctl.core.events import Event, read_events
from labctl.inventory.profiles import resolve_profile
from labctl.run.experiment import build_plan, load_experiment
from labctl.run.lifecycle import run_experiment

SHORT = """\
name: short
phases:
  dp: {pairs: [[h1, h2], [h3, h4]]}
  pp: {pairs: [[h1, h3], [h2, h4]]}
baseline: dp
cycle: [pp, dp]
repeat: 1
hold_s: 0.05
recovery_timeout_s: 5
"""


@pytest.fixture
def short_experiment(tmp_path: Path) -> Path:
    path = tmp_path / "short.yaml"
    path.write_text(SHORT)
    return path


async def test_run_writes_every_file_and_phases_match_the_profile(
    short_experiment: Path, inventory_path: Path, tmp_path: Path
) -> None:
    outcome = await run_experiment(
        short_experiment, inventory_path, profile="fast", out_dir=tmp_path / "runs", seed=7
    )
    assert outcome.status == "completed", outcome.error
    run_dir = outcome.run_dir
    for name in (
        "run.json",
        "events.jsonl",
        "breakdown.csv",
        "breakdown.parquet",
        "summary.json",
        "timeline.png",
        "distributions.png",
    ):
        assert (run_dir / name).stat().st_size > 0, name
    # Vector figures are drawn on request (analysis.plot_formats, --plot-format, labctl plot --format).
    assert not list(run_dir.glob("*.svg")) and not list(run_dir.glob("*.pdf"))
    run = labctl.load_run(run_dir)
    assert run.status == "completed"
    assert run.meta["seed"] == 7 and run.meta["profile"]["name"] == "fast"
    # Each sampler says what it achieved, so a rate it could not keep on a busy machine is on record.
    rx = run.meta["probes"]["rx-power"]
    assert rx["dropped"] == 0 and rx["running_s"] > 0
    assert 0 < rx["samples_per_s_per_port"] <= 1000 * 1.05  # configured 1 kHz; never above it
    assert run.meta["probes"]["model-traffic"]["pings"] > 0
    bd = run.breakdown
    assert sorted(bd["reconfig"].unique()) == [0, 1, 2]
    measured = bd[bd["reconfig"] > 0]
    assert len(measured) == 2 * 16  # every port of both rails moves in a DP<->PP swap
    assert not measured["timed_out"].any()
    marks = [
        "t0_command_ns",
        "t1_switch_done_ns",
        "t2_rx_power_ns",
        "t3_firmware_up_ns",
        "t4_carrier_up_ns",
        "t5_traffic_ns",
    ]
    assert measured[marks].notna().all().all()
    # Marks are ordered as the physics says. (t1 is when we *received* the acknowledgement, so light may
    # be sampled back before it: no order between t1 and t2.)
    for a, b in [
        ("t0_command_ns", "t1_switch_done_ns"),
        ("t0_command_ns", "t2_rx_power_ns"),
        *itertools.pairwise(marks[3:]),
    ]:
        assert (measured[b] >= measured[a]).all(), (a, b)
    # t2 is a sample: a stalled loop can observe the light late, even after the (model-stamped) link-up.
    assert (measured["t3_firmware_up_ns"] - measured["t2_rx_power_ns"]).median() > 0
    fast = resolve_profile("fast")
    ms = 1e6
    # Lower bounds hold row by row: an acknowledgement or a sample can only be observed late, never early.
    # Sampled marks (t1 ack, t2 Rx power, t5 traffic) also carry the event loop's lag, which on a loaded
    # 2-core machine can reach tens of ms, so they get no wall-clock upper bound (bench/ measures speed):
    # instead each belongs to its own reconfiguration, before the next command.
    assert measured["switch_ns"].min() >= fast.switching_ms[0] * ms
    assert measured["optical_ns"].min() >= fast.switching_ms[0] * ms  # light only once the mirrors moved
    assert measured["transport_ns"].min() >= fast.transport_after_carrier_ms[0] * ms
    commands = [
        *sorted(bd.groupby("reconfig")["t0_command_ns"].min().tolist()),
        int(run.events["t_ns"].max()),
    ]
    for k, group in measured.groupby("reconfig"):
        next_command = commands[commands.index(group["t0_command_ns"].min()) + 1]
        assert (group[marks[1:]] < next_command).all().all(), k
    # firmware = t3 (model time, exact) - t2 (a sample, maybe late): never above the model's longest delay.
    assert measured["firmware_ns"].max() <= fast.firmware_up_ms[1] * ms
    # Carrier follows firmware by 70-80 us: both are stamped with model time, so this holds exactly.
    assert measured["carrier_ns"].between(70_000, 80_000).all()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["reconfigurations"] == 2 and summary["phases"]["total"]["count"] == 32
    events = list(read_events(run_dir / "events.jsonl"))
    assert [e.seq for e in events] == list(range(len(events)))
    assert events[0].kind == "run.start" and events[-1].kind == "run.end"
    final = [e for e in events if e.kind == "ocs.read"]
    assert final, "the controller reads every switch's final state"
    assert isinstance(run.events, pd.DataFrame) and len(run.events) == len(events)


async def test_a_baseline_that_never_comes_up_fails_the_run(tmp_path: Path, inventory_path: Path) -> None:
    exp = tmp_path / "slow.yaml"
    exp.write_text(SHORT.replace("recovery_timeout_s: 5", "recovery_timeout_s: 0.02"))
    outcome = await run_experiment(
        exp, inventory_path, profile="fast", out_dir=tmp_path / "runs", seed=1, plots=False
    )
    # Every later step would start from a broken lab: the run fails, naming the baseline and its ports.
    assert outcome.status == "failed"
    assert outcome.error is not None and outcome.error.startswith(
        "baseline 'dp' did not come up: 16 of 16 ports"
    )
    meta = json.loads((outcome.run_dir / "run.json").read_text())
    assert meta["status"] == "failed" and meta["error"] == outcome.error
    bd = labctl.load_run(outcome.run_dir).breakdown
    assert bd["timed_out"].all()  # 20 ms is shorter than the fast profile's 40-60 ms firmware link-up
    events = list(read_events(outcome.run_dir / "events.jsonl"))
    timeouts = [e for e in events if e.kind == "run.timeout"]
    assert len(timeouts) == 1 and len(timeouts[0].meta["pending"]) == 16
    assert [e.value for e in events if e.kind == "phase"] == ["dp"]  # no step was run on it


async def test_cancel_restores_baseline_and_marks_aborted(
    short_experiment: Path, inventory_path: Path, tmp_path: Path
) -> None:
    task = asyncio.create_task(
        run_experiment(
            short_experiment, inventory_path, profile="fast", out_dir=tmp_path / "runs", seed=2, plots=False
        )
    )
    runs = tmp_path / "runs"
    # Cancel once the first PP reconfiguration's command is out (the baseline's was the first): the switch
    # has moved, or may have (a write cut short), so the baseline must be restored. Cancelled between its
    # phase event and its command, nothing would have moved and there would be nothing to restore.
    for _ in range(400):
        await asyncio.sleep(0.01)
        if runs.exists() and any(runs.iterdir()):
            path = next(runs.iterdir()) / "events.jsonl"
            text = path.read_bytes() if path.exists() else b""
            if b'"value":"pp"' in text and text.count(b'"kind":"ocs.command"') >= 2:
                break
    task.cancel()
    outcome = await task
    assert outcome.status == "aborted"
    events = list(read_events(outcome.run_dir / "events.jsonl"))
    assert any(e.kind == "run.abort" for e in events)
    phases = [e for e in events if e.kind == "phase"]
    assert phases[-1].value == "dp" and phases[-1].meta["measured"] is False  # the restore
    # The restore is a reconfiguration of its own: nothing of it is filed under the interrupted one.
    assert phases[-1].reconfig == phases[-2].reconfig + 1
    restore_t0 = phases[-1].t_ns
    interrupted = [e for e in events if e.reconfig == phases[-2].reconfig]
    assert interrupted and all(e.t_ns <= restore_t0 for e in interrupted)
    final = [e for e in events if e.kind == "ocs.read"][-1]
    from labctl.inventory.schema import load_inventory
    from labctl.run.experiment import build_plan, load_experiment

    spec, src = load_experiment(short_experiment)
    plan = build_plan(spec, load_inventory(inventory_path), src)
    baseline = set().union(*(rp.mapping for rp in plan.phases["dp"].values()))
    assert {tuple(p) for p in final.meta["patches"]} == baseline
    assert json.loads((outcome.run_dir / "run.json").read_text())["status"] == "aborted"


async def test_switch_power_monitor_as_a_second_rx_power_source(tmp_path: Path, inventory_path: Path) -> None:
    exp = tmp_path / "power.yaml"
    exp.write_text(SHORT + "probes: {switch_power_hz: 50}\n")
    outcome = await run_experiment(
        exp, inventory_path, profile="fast", out_dir=tmp_path / "runs", seed=4, plots=False
    )
    assert outcome.status == "completed", outcome.error
    events = list(read_events(outcome.run_dir / "events.jsonl"))
    switch_power = [e for e in events if e.kind == "rx_power" and e.source.startswith("ocs:ocs1/")]
    ports = {int(e.source.rsplit("/", 1)[1]) for e in switch_power}
    assert ports == set(range(1, 17)) | set(range(33, 49))  # both rails' fibers: tx on ingress, rx on egress
    lit_egress = [e for e in switch_power if int(e.source.rsplit("/", 1)[1]) >= 33 and e.value is not None]
    assert lit_egress and all(-10 < e.value < 0 for e in lit_egress)  # type: ignore[operator]
    # The breakdown keeps reading the NIC's own DOM: the switch's readings never become a port's t2.
    bd = labctl.load_run(outcome.run_dir).breakdown
    assert not bd["source"].str.startswith("ocs:").any()


def _assert_failed(outcome: Any, error: str, run_end: str = "failed") -> list[Event]:
    """The run failed with `error`, run.json says the same, and the events end with run.end `run_end` (a
    run whose analysis failed appends a last run.end `failed` after the experiment's own, decision 0069)."""
    assert (outcome.status, outcome.error) == ("failed", error)
    meta = json.loads((outcome.run_dir / "run.json").read_text())
    assert (meta["status"], meta["error"]) == ("failed", error)
    events = list(read_events(outcome.run_dir / "events.jsonl"))
    assert (events[-1].kind, events[-1].value) == ("run.end", run_end)
    return events


def _final_patches(run_dir: Path) -> list[list[int]]:
    reads = [e for e in read_events(run_dir / "events.jsonl") if e.kind == "ocs.read"]
    return reads[-1].meta["patches"]


async def test_an_unexpected_error_mid_run_restores_the_baseline_and_records_its_cause(
    short_experiment: Path, inventory_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from labctl.run.engine import RunEngine

    apply_rails = RunEngine._apply_rails
    calls = 0

    async def apply_then_overflow(self: RunEngine, target: Any) -> None:
        nonlocal calls
        calls += 1
        await apply_rails(self, target)
        if calls == 2:  # the first step has moved the rails' mirrors (the baseline was call 1)
            raise OverflowError("cannot convert float infinity to integer")

    monkeypatch.setattr(RunEngine, "_apply_rails", apply_then_overflow)
    outcome = await run_experiment(
        short_experiment, inventory_path, profile="fast", out_dir=tmp_path / "runs", seed=3, plots=False
    )
    events = _assert_failed(
        outcome, "internal error: OverflowError: cannot convert float infinity to integer"
    )
    assert [e.kind for e in events].count("run.fault") == 1
    phases = [(e.value, e.meta["measured"]) for e in events if e.kind == "phase"]
    assert phases == [("dp", True), ("pp", True), ("dp", False)]  # the restore followed the fault
    inventory = labctl.labs.load(inventory_path)
    spec, src = load_experiment(short_experiment)
    baseline = set().union(*(rp.mapping for rp in build_plan(spec, inventory, src).phases["dp"].values()))
    assert baseline and {tuple(p) for p in _final_patches(outcome.run_dir)} == baseline


async def test_a_switch_that_cannot_connect_fails_the_run_with_its_cause(
    short_experiment: Path, inventory_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from labctl.core.errors import HardwareError
    from labctl.ocs.drivers.sim.switch import SimSwitch

    async def refuse(self: SimSwitch) -> None:
        raise HardwareError("ocs1: cannot connect to 192.0.2.1:3082: timed out after 10 s")

    monkeypatch.setattr(SimSwitch, "connect", refuse)
    outcome = await run_experiment(
        short_experiment, inventory_path, profile="fast", out_dir=tmp_path / "runs", seed=4, plots=False
    )
    # The cause is in run.json, not only on stderr; nothing was touched, so nothing was restored.
    events = _assert_failed(outcome, "ocs1: cannot connect to 192.0.2.1:3082: timed out after 10 s")
    assert not [e for e in events if e.kind == "phase"]


async def test_a_failed_analysis_fails_the_run_and_keeps_its_events(
    short_experiment: Path, inventory_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import labctl.analysis.summary

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(labctl.analysis.summary, "compute_breakdown", broken)
    outcome = await run_experiment(
        short_experiment, inventory_path, profile="fast", out_dir=tmp_path / "runs", seed=5, plots=False
    )
    events = _assert_failed(outcome, "analysis failed: ZeroDivisionError: division by zero")
    assert [e.kind for e in events].count("phase") == 3
    assert [e.value for e in events if e.kind == "run.end"] == ["completed", "failed"]
    assert [e.seq for e in events] == list(range(len(events)))  # one log, seq continuing after the reopen


async def test_steps_and_the_baseline_hold_before_the_next_reconfiguration(
    short_experiment: Path, inventory_path: Path, tmp_path: Path
) -> None:
    outcome = await run_experiment(
        short_experiment, inventory_path, profile="fast", out_dir=tmp_path / "runs", seed=6, plots=False
    )
    assert outcome.status == "completed"
    events = list(read_events(outcome.run_dir / "events.jsonl"))
    starts = [e.t_ns for e in events if e.kind == "phase"]
    for n in range(len(starts) - 1):
        # Each port's recovery is its first traffic.ok after its last traffic.lost of the phase; later
        # ones are heartbeats (one every report interval, staggered per port), which may fall in the hold.
        recovered: dict[str, int | None] = {}
        for e in events:
            if e.reconfig != n or not starts[n] < e.t_ns < starts[n + 1]:
                continue
            if e.kind == "traffic.lost":
                recovered[e.source] = None
            elif e.kind == "traffic.ok" and e.source in recovered and recovered[e.source] is None:
                recovered[e.source] = e.t_ns
        assert recovered and None not in recovered.values(), n
        last_recovery = max(t for t in recovered.values() if t is not None)
        # hold_s is 0.05: the next reconfiguration starts no sooner than that after full recovery.
        assert starts[n + 1] - last_recovery >= 45_000_000, n


async def test_a_kernel_lab_without_root_is_refused_before_any_run_directory(
    short_experiment: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import labctl.labs.kernel
    from labctl.core.errors import HardwareError

    monkeypatch.setattr(labctl.labs.kernel.os, "geteuid", lambda: 1000)
    inventory = Path(__file__).parents[2] / "experiments" / "inventories" / "emulated.yaml"
    with pytest.raises(HardwareError, match="run as root"):
        await run_experiment(
            short_experiment, inventory, profile="fast", out_dir=tmp_path / "runs", plots=False
        )
    assert not (tmp_path / "runs").exists()


def _agents_inventory(default: Path, tmp_path: Path, broker_port: int) -> Path:
    """The default lab as an `agents` lab whose broker is at `broker_port`."""
    path = tmp_path / "agents.yaml"
    text = default.read_text().replace(
        "lab: opus-testbed",
        f"lab: opus-testbed\nkind: agents\nbroker: {{url: 'mqtt://127.0.0.1:{broker_port}'}}",
        1,
    )
    path.write_text(text)
    return path


async def test_a_broker_that_is_not_there_fails_the_run_with_its_cause(
    short_experiment: Path, inventory_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    from labctl.agents.hub import AgentHub

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    inventory = _agents_inventory(inventory_path, tmp_path, port)
    monkeypatch.setattr(
        AgentHub.start, "__defaults__", (0.5,)
    )  # the connect deadline: 10 s is long for a test
    outcome = await run_experiment(
        short_experiment, inventory, profile="fast", out_dir=tmp_path / "runs", seed=9, plots=False
    )
    assert outcome.status == "failed"
    assert outcome.error is not None
    assert outcome.error.startswith(f"MQTT broker 127.0.0.1:{port} not reachable within 0.5 s (last error: ")
    assert "Connection refused" in outcome.error
    meta = json.loads((outcome.run_dir / "run.json").read_text())
    assert meta["error"] == outcome.error
    kinds = [e.kind for e in read_events(outcome.run_dir / "events.jsonl")]
    assert "phase" not in kinds and kinds[-1] == "run.end"


async def test_a_fault_reported_while_the_lab_stops_still_fails_the_run(
    short_experiment: Path, inventory_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """E.g. an agent lost after the last step, while its probes were being stopped: the data may be short."""
    from labctl.run.engine import RunEngine

    read_final_state = RunEngine._read_final_state

    async def agent_lost_meanwhile(self: RunEngine) -> None:
        self.lab.fault.raise_("agent h3 lost: offline")
        await read_final_state(self)

    monkeypatch.setattr(RunEngine, "_read_final_state", agent_lost_meanwhile)
    outcome = await run_experiment(
        short_experiment, inventory_path, profile="fast", out_dir=tmp_path / "runs", seed=10, plots=False
    )
    assert (outcome.status, outcome.error) == ("failed", "agent h3 lost: offline")


async def test_skipped_ticks_reach_the_event_log_while_the_run_goes_on(
    tmp_path: Path, inventory_path: Path
) -> None:
    """Block the run's loop on purpose after each of its first reconfigurations (its samplers running): they
    skip the ticks they missed, and each time a count grows a `sampler.skip` event says so while the run
    goes on (the live page's warning), the last of each equal to run.json's count at the end."""
    import time

    from labctl.run.engine import NullProgress

    class Stalling(NullProgress):
        stalls = 0

        def reconfig_done(self, stage: Any, timed_out: list[str]) -> None:
            if self.stalls < 2:
                self.stalls += 1
                time.sleep(
                    0.03
                )  # the whole loop stalls 30 ms: 30 ticks missed at 1 kHz, past the 2 ms catch-up

    experiment = tmp_path / "held.yaml"
    experiment.write_text(SHORT.replace("repeat: 1", "repeat: 2").replace("hold_s: 0.05", "hold_s: 0.4"))
    outcome = await run_experiment(
        experiment, inventory_path, profile="fast", out_dir=tmp_path, plots=False, progress=Stalling()
    )
    assert outcome.status == "completed", outcome.error
    skips: dict[str, list[Event]] = {}
    phases: list[int] = []
    for e in read_events(outcome.run_dir / "events.jsonl"):
        if e.kind == "sampler.skip":
            skips.setdefault(e.source.removeprefix("probe:"), []).append(e)
        elif e.kind == "phase":
            phases.append(e.t_ns)
    probes = json.loads((outcome.run_dir / "run.json").read_text())["probes"]
    counted = {name: stats["ticks_skipped"] for name, stats in probes.items() if stats.get("ticks_skipped")}
    assert counted, probes  # the stalls above thinned at least one sampler
    assert {name: events[-1].value for name, events in skips.items()} == counted
    for events in skips.values():
        values = [e.value for e in events]
        assert values == sorted(set(values)), values  # one event per growth, never repeated
        assert all(e.meta["stalls"] >= 1 and e.meta["stall_longest_ns"] > 0 for e in events)
    # said while the run went on (before its last reconfiguration started), not only at its end
    assert min(e.t_ns for events in skips.values() for e in events) < phases[-1]
