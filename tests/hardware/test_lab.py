"""Against a real lab (`--lab INVENTORY`): each switch keeps the OpticalSwitch contract, the lab passes its
preflight, and a short experiment runs end to end with every mark the lab can produce."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from labctl.core.events import Event
from labctl.inventory.schema import Inventory
from labctl.inventory.topology import rail_scope
from labctl.ocs.switches import open_switch
from labctl.run.lifecycle import run_experiment

pytestmark = pytest.mark.hardware

REPO = Path(__file__).resolve().parents[2]


async def test_every_switch_keeps_the_contract(lab: Inventory) -> None:
    """Connect, read, apply a pairing of the rail's NIC fibers (verified by read-back), apply it again (nothing
    sent), disconnect those ports; then, whether or not a step failed, put back the patches found there and
    close."""
    for rail in lab.rails:
        name = lab.rail_switch(rail)
        events: list[Event] = []
        switch = open_switch(name, lab.switches[name], events.append)
        scope = rail_scope(lab, rail)
        await switch.connect()
        try:
            found = (await switch.get_mapping()).value
            before = {p for p in found if p[0] in scope or p[1] in scope}
            try:
                ports = [p for ports in lab.rail_ports(rail).values() for p in ports]
                # Every NIC port's light goes to the next one's receiver (a ring over the rail).
                ring = {(a.tx, b.rx) for a, b in zip(ports, ports[1:] + ports[:1], strict=True)}
                result = await switch.apply(ring, scope=scope)
                assert result.value.mapping >= ring and result.start_ns <= result.end_ns
                again = await switch.apply(ring, scope=scope)
                assert again.value.attempts == 0
                await switch.disconnect(sorted(scope))
                assert not {p for p in (await switch.get_mapping()).value if p[0] in scope or p[1] in scope}
            finally:
                # What we found, back, whether or not the contract held: it is someone's lab.
                await switch.apply(before, scope=scope)
        finally:
            await switch.close()
        kinds = {e.kind for e in events}
        assert {"ocs.command", "ocs.complete", "ocs.read"} <= kinds


def test_preflight_passes(lab_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "labctl.cli", "lab", "check", "-i", str(lab_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr


async def test_a_short_experiment_runs_end_to_end(lab: Inventory, lab_path: Path, tmp_path: Path) -> None:
    experiment = tmp_path / "short.yaml"
    experiment.write_text(
        (REPO / "experiments" / "reconfig-timeline.yaml").read_text().replace("repeat: 2", "repeat: 1")
    )
    outcome = await run_experiment(experiment, lab_path, out_dir=tmp_path / "runs", plots=False)
    assert outcome.status == "completed", outcome.error
    rows = pd.read_csv(outcome.run_dir / "breakdown.csv")
    rows = rows[rows.reconfig > 0]
    assert len(rows) > 0 and not rows.timed_out.any()
    for mark in ("t0_command_ns", "t1_switch_done_ns", "t4_carrier_up_ns", "t5_traffic_ns"):
        assert rows[mark].notna().all(), mark
