"""reconfig-timeline end to end against the TL1 emulator (profile fast, in-process): the lab starts a TL1
server around the switch model that lights the simulated NICs and the controller drives it over TCP."""

from __future__ import annotations

from pathlib import Path

import pytest

import labctl
from labctl.core.events import read_events
from labctl.run.lifecycle import run_experiment
from tests.helpers.tl1_e2e import TL1_INVENTORY

PW = "e2e-Secret-9f3a"


def files_containing(root: Path, needle: bytes) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


async def test_reconfig_timeline_runs_over_tl1(experiment_path: Path, tmp_path: Path) -> None:
    outcome = await run_experiment(
        experiment_path, TL1_INVENTORY, profile="fast", out_dir=tmp_path / "runs", seed=11
    )
    assert outcome.status == "completed", outcome.error
    run = labctl.load_run(outcome.run_dir)
    measured = run.breakdown[run.breakdown["reconfig"] > 0]
    assert sorted(measured["reconfig"].unique()) == list(range(1, 9))
    assert len(measured) == 8 * 16 and not measured["timed_out"].any()
    marks = ["t0_command_ns", "t1_switch_done_ns", "t2_rx_power_ns", "t4_carrier_up_ns", "t5_traffic_ns"]
    assert measured[marks].notna().all().all()
    assert (measured["t1_switch_done_ns"] > measured["t0_command_ns"]).all()
    events = list(read_events(outcome.run_dir / "events.jsonl"))
    io = [e for e in events if e.kind == "ocs.io"]
    verbs = {e.meta["command"].split(":")[0] for e in io}
    assert {"ACT-USER", "RTRV-EQPT", "RTRV-PATCH", "DLT-PATCH", "ENT-PATCH", "CANC-USER"} <= verbs
    assert all(e.meta["status"] == "COMPLD" for e in io)
    # Both rails share the switch: the other rail's changes come back to nobody (one session), and the
    # final read-back over TL1 shows the baseline.
    final = [e for e in events if e.kind == "ocs.read"][-1]
    assert len(final.meta["patches"]) == 16
    for path in ("timeline.png", "breakdown.csv", "summary.json"):
        assert (outcome.run_dir / path).stat().st_size > 0


async def test_inventory_password_never_reaches_the_run_dir(
    experiment_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LABCTL_TEST_TL1_PASSWORD", PW)
    inventory = tmp_path / "inv.yaml"
    inventory.write_text(
        TL1_INVENTORY.read_text().replace(
            "{driver: polatis-tl1, emulate: true, size: 32x32}",
            '{driver: polatis-tl1, emulate: true, size: 32x32, user: root, password: "${LABCTL_TEST_TL1_PASSWORD}"}',
        )
    )
    short = tmp_path / "short.yaml"
    short.write_text(
        "name: short\nphases:\n  dp: {pairs: [[h1, h2], [h3, h4]]}\n  pp: {pairs: [[h1, h3], [h2, h4]]}\n"
        "baseline: dp\ncycle: [pp]\nrepeat: 1\nhold_s: 0\nrecovery_timeout_s: 5\n"
    )
    outcome = await run_experiment(
        short, inventory, profile="fast", out_dir=tmp_path / "runs", seed=1, plots=False
    )
    assert outcome.status == "completed", outcome.error
    assert "${LABCTL_TEST_TL1_PASSWORD}" in (outcome.run_dir / "run.json").read_text()
    assert "ACT-USER::root:1::********;" in (outcome.run_dir / "events.jsonl").read_text()
    assert not files_containing(tmp_path / "runs", PW.encode())
