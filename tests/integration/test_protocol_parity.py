"""Parity across protocols: the same experiment on the TL1-, NETCONF-, SCPI- and serial-emulated lab.

Each driver with an emulator drives its protocol's emulator over real sockets (or a pty) around the same
switch model that lights the simulated NICs. Whatever the protocol, the controller must ask for the same
changes in the same order (one diff per switch per reconfiguration, its rails together, none retried) and every port must
recover with every mark present. A driver registered with an emulator is enrolled with no edit here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import labctl
from labctl.core.events import Kind, read_events
from labctl.ocs.switches import switch_drivers
from labctl.run.lifecycle import run_experiment

ROOT = Path(__file__).resolve().parents[2]
TL1_INVENTORY = ROOT / "experiments" / "inventories" / "tl1-emulated.yaml"
TL1_SWITCH = "{driver: polatis-tl1, emulate: true, size: 32x32}"
EMULATED = tuple(
    name
    for name in switch_drivers.names()
    if switch_drivers.get(name).emulate is not None
    and "emulate" in switch_drivers.get(name).config.model_fields
)
EXPERIMENT = (
    "name: parity\nrails: [0, 1]\nphases:\n  dp: {pairs: [[h1, h2], [h3, h4]]}\n"
    "  pp: {pairs: [[h1, h3], [h2, h4]]}\nbaseline: dp\ncycle: [pp, dp]\nrepeat: 1\nhold_s: 0.05\n"
    "recovery_timeout_s: 10\n"
)


def test_every_protocol_with_an_emulator_is_in_the_parity_run() -> None:
    assert "polatis-tl1" in EMULATED
    assert "sim" not in EMULATED  # the in-process driver has no protocol to compare


async def _run(driver: str, tmp_path: Path) -> tuple[list[tuple[Any, ...]], Any]:
    os.makedirs(tmp_path, exist_ok=True)
    inventory = tmp_path / f"{driver}.yaml"
    source = TL1_INVENTORY.read_text()
    assert TL1_SWITCH in source
    inventory.write_text(source.replace(TL1_SWITCH, f"{{driver: {driver}, emulate: true, size: 32x32}}"))
    experiment = tmp_path / "parity.yaml"
    experiment.write_text(EXPERIMENT)
    outcome = await run_experiment(
        experiment, inventory, profile="fast", out_dir=tmp_path / "runs", seed=3, plots=False
    )
    assert outcome.status == "completed", f"{driver}: {outcome.error}"
    commands = [
        (
            e.reconfig,
            tuple(e.meta.get("rails") or [e.meta.get("rail")]),
            tuple(map(tuple, e.meta["remove"])),
            tuple(map(tuple, e.meta["add"])),
        )
        for e in read_events(outcome.run_dir / "events.jsonl")
        if e.kind == Kind.OCS_COMMAND
    ]
    return sorted(commands, key=lambda c: (c[0], c[1])), labctl.load_run(outcome.run_dir)


@pytest.mark.parametrize("driver", [d for d in EMULATED if d != "polatis-tl1"])
async def test_the_same_experiment_asks_the_same_changes_over_every_protocol(
    driver: str, tmp_path: Path
) -> None:
    reference, _ = await _run("polatis-tl1", tmp_path / "tl1")
    commands, run = await _run(driver, tmp_path / driver)
    assert commands == reference  # same diffs, same order per reconfiguration and rail, no retries
    # baseline + 2 reconfigurations, both rails of the one switch in each command (decision 0054)
    assert [c[:2] for c in reference] == [(0, (0, 1)), (1, (0, 1)), (2, (0, 1))]
    measured = run.breakdown[run.breakdown["reconfig"] > 0]
    assert len(measured) == 2 * 16 and not measured["timed_out"].any()
    marks = ["t0_command_ns", "t1_switch_done_ns", "t2_rx_power_ns", "t4_carrier_up_ns", "t5_traffic_ns"]
    assert measured[marks].notna().all().all(), f"{driver}: a mark is missing"
    assert run.summary["flagged_rows"] == 0
