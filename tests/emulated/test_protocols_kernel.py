"""Any protocol in front of the kernel-real lab: the emulated Opus testbed (namespaces, veth NICs, tc
cross-connects) with its switch driven over NETCONF, SCPI or a serial line instead of TL1. The driver
talks to its emulator over real sockets (a pty for serial); the emulator's switch model moves the kernel
fabric's cross-connects; carrier and traffic are real kernel events. Root only."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from labctl.analysis.breakdown_table import read_breakdown_csv
from labctl.core.events import Kind, read_events
from labctl.linux import netns
from labctl.run.lifecycle import run_experiment
from tests.conftest import REPO

pytestmark = pytest.mark.emulated

EMULATED = REPO / "experiments" / "inventories" / "emulated.yaml"
TL1_SWITCH = "{driver: polatis-tl1, size: 32x32, emulate: true}"


@pytest.mark.parametrize("driver", ["polatis-netconf", "polatis-scpi", "dicon-serial"])
async def test_the_kernel_lab_runs_behind_every_protocol(
    driver: str, tmp_path: Path, fabric_prefix: str
) -> None:
    source = EMULATED.read_text()
    assert TL1_SWITCH in source
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(source.replace(TL1_SWITCH, f"{{driver: {driver}, size: 32x32, emulate: true}}"))
    experiment = tmp_path / "short.yaml"
    experiment.write_text(
        "name: short\nrails: [0, 1]\nphases:\n  dp: {pairs: [[h1, h2], [h3, h4]]}\n"
        "  pp: {pairs: [[h1, h3], [h2, h4]]}\nbaseline: dp\ncycle: [pp]\nrepeat: 1\nhold_s: 0.1\n"
        "recovery_timeout_s: 20\n"
    )
    try:
        outcome = await run_experiment(
            experiment, inventory, profile="emulated-fast", out_dir=tmp_path / "runs", seed=5, plots=False
        )
    finally:
        assert netns.list_netns(f"lr-{os.getpid()}-") == []  # the run's own fabric is gone
    assert outcome.status == "completed", outcome.error
    rows = read_breakdown_csv(outcome.run_dir / "breakdown.csv")
    rows = rows[rows["reconfig"] > 0]
    assert len(rows) == 16 and not rows["timed_out"].any()
    marks = ["t0_command_ns", "t1_switch_done_ns", "t2_rx_power_ns", "t3_firmware_up_ns", "t4_carrier_up_ns"]
    assert rows[[*marks, "t5_traffic_ns"]].notna().all().all()
    io = [e for e in read_events(outcome.run_dir / "events.jsonl") if e.kind == Kind.OCS_IO]
    assert io, "the driver's wire commands are in the record"


async def test_a_replayed_job_waits_for_real_traffic_on_the_kernel_lab(
    tmp_path: Path, fabric_prefix: str
) -> None:
    """`ready: link` on the kernel lab: each replayed operation waits until every moved port carries real
    UDP traffic again, so a switch's exposed part includes the (emulated) firmware link-up; the stall still
    equals the model over the run's own recorded switch times."""
    import csv

    experiment = tmp_path / "replay.yaml"
    experiment.write_text(
        (REPO / "experiments" / "replay-opus-testbed.yaml")
        .read_text()
        .replace("ready: switch", "ready: link")
        .replace("steps: 2", "steps: 1")
    )
    outcome = await run_experiment(
        experiment, EMULATED, profile="emulated-fast", out_dir=tmp_path / "runs", seed=2
    )
    assert outcome.status == "completed", outcome.error
    [step] = list(csv.DictReader((outcome.run_dir / "replay_steps.csv").read_text().splitlines()))
    assert int(step["stall_ns"]) == int(step["model_stall_ns"]) > 0
    assert step["fallback"] == "False"
    events = list(read_events(outcome.run_dir / "events.jsonl"))
    ok = [e.t_ns for e in events if e.kind == Kind.TRAFFIC_OK]
    switched = [e.meta for e in events if e.kind == "workload.op" and e.meta["switched"]]
    assert len(switched) == 4
    for op in switched:
        # released only once a real kernel ping-pong answered on the new circuits, which took the
        # emulated firmware link-up (emulated-fast: 100-150 ms) after the switch acknowledged
        assert op["ready_ns"] - op["switch_done_ns"] >= 90_000_000, op
        assert any(op["switch_done_ns"] < t <= op["ready_ns"] for t in ok), op
