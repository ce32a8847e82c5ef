"""A tune run on the built-in simulated lab (issue 40's Done-when): autoneg on/off × 2 FEC modes, 4
reconfigurations each, fast profile. It completes; the report ranks the settings and their firmware medians
match the profile's link model within their CIs; every port's settings after the run equal those before
(from the recorded read-backs). And the restore runs on failure, on abort, and a restore that fails says
which port holds what."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from labctl.analysis.store import load_run
from labctl.core.errors import HardwareError
from labctl.inventory.profiles import resolve_profile
from labctl.models.link_control import ModelLinkControl
from labctl.nic.settings import LinkSettings, PortRef
from labctl.run.lifecycle import run_experiment
from tests.helpers.tune import assert_restored_as_read_before

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "experiments" / "tune-autoneg-fec.yaml"
INVENTORY = REPO / "inventory.yaml"


def test_a_tune_run_ranks_the_settings_and_puts_every_port_back(tmp_path: Path) -> None:
    outcome = asyncio.run(run_experiment(EXAMPLE, INVENTORY, profile="fast", out_dir=tmp_path, seed=11))
    assert outcome.status == "completed", outcome.error
    # its figures, drawn by the run's workers: the usual three and those by link setting (decision 0080)
    for name in ("headline", "timeline", "distributions", "settings-distributions", "settings-timeline"):
        assert (outcome.run_dir / f"{name}.png").stat().st_size > 0, name
    section = outcome.summary["by_link_setting"]
    labels = {"autoneg=on,fec=rs", "autoneg=on,fec=off", "autoneg=off,fec=rs", "autoneg=off,fec=off"}
    assert set(section["settings"]) == labels and section["reference"] == "autoneg=on,fec=rs"
    assert {item["setting"] for item in section["ranking"]} == labels
    medians = [item["median"] for item in section["ranking"]]
    assert medians == sorted(medians)
    # The profile's model: firmware_up_ms's midpoint times each setting's factor. The measured firmware
    # phase starts at t2, a sampled mark up to its bracket after the light came: the CI is widened by that.
    profile = resolve_profile("fast")
    low, high = profile.firmware_up_ms
    slack = outcome.summary["resolution"]["t2"]["max"] + profile.range_ns("optical_settle_ms")[1]
    for label, entry in section["settings"].items():
        settings = dict(part.split("=") for part in label.split(","))
        factor = profile.link.factor(settings["autoneg"] == "on", settings["fec"], False)
        expected = (low + high) / 2 * 1e6 * factor
        lo, hi = entry["firmware"]["median_ci"]
        assert lo - slack <= expected <= hi + slack, (label, expected, entry["firmware"])
        assert entry["reconfigurations"] == 4
    # autoneg off is about half of on (the seed's 6 s against 3 s), and the data can tell them apart
    off = section["settings"]["autoneg=off,fec=rs"]["firmware"]["vs_reference"]
    assert off["ci"][1] < 0 and not off["includes_0"]
    # every port's settings after the run are what was read before it (the recorded read-backs)
    assert_restored_as_read_before(outcome.run_dir)
    meta = json.loads((outcome.run_dir / "run.json").read_text())
    assert meta["link_settings"]["restored"] is True
    assert all(p["on_before"] for p in meta["link_settings"]["ports"].values())
    saved = json.loads((outcome.run_dir / "link-settings-before.json").read_text())
    assert len(saved["ports"]) == 16
    # the breakdown names each row's setting; the baseline's rows have none
    frame = load_run(outcome.run_dir).breakdown
    assert set(frame.loc[frame["reconfig"] > 0, "link_setting"]) == labels
    assert set(frame.loc[frame["reconfig"] == 0, "link_setting"]) == {""}


def _small(tmp_path: Path) -> Path:
    data = yaml.safe_load(EXAMPLE.read_text())
    data.update(reconfigurations=1, hold_s=0.05, sweep={"autoneg": [True, False]}, order="as-written")
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _failing_apply(monkeypatch: pytest.MonkeyPatch, fails: Any) -> list[tuple[PortRef, LinkSettings]]:
    """ModelLinkControl.apply raising where `fails(call number, port, settings)` says (the NIC refused)."""
    real = ModelLinkControl.apply
    calls: list[tuple[PortRef, LinkSettings]] = []

    async def apply(self: ModelLinkControl, port: PortRef, settings: LinkSettings) -> LinkSettings:
        calls.append((port, settings))
        if fails(len(calls), port, settings):
            raise HardwareError(f"{port.label}: the NIC refused {settings.label}")
        return await real(self, port, settings)

    monkeypatch.setattr(ModelLinkControl, "apply", apply)
    return calls


def test_a_failed_apply_fails_the_run_and_every_port_is_restored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _failing_apply(monkeypatch, lambda n, port, settings: n == 20)  # the second setting, its 4th port
    outcome = asyncio.run(
        run_experiment(_small(tmp_path), INVENTORY, profile="fast", out_dir=tmp_path, seed=2, plots=False)
    )
    assert outcome.status == "failed"
    assert outcome.error is not None and "the NIC refused autoneg=off" in outcome.error
    assert_restored_as_read_before(outcome.run_dir)
    meta = json.loads((outcome.run_dir / "run.json").read_text())
    assert meta["link_settings"]["restored"] is True


def test_a_restore_that_fails_fails_the_run_naming_the_port_and_what_it_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    victim = PortRef("h2", "ens1f0np0")
    _failing_apply(monkeypatch, lambda n, port, settings: port == victim and settings.speed_mbps is not None)
    outcome = asyncio.run(
        run_experiment(_small(tmp_path), INVENTORY, profile="fast", out_dir=tmp_path, seed=2, plots=False)
    )
    assert outcome.status == "failed"
    assert outcome.error is not None
    assert (
        "link settings NOT restored: 1 port(s) not back as found: h2/ens1f0np0 holds autoneg=off,"
        in outcome.error
    )
    meta = json.loads((outcome.run_dir / "run.json").read_text())
    state = meta["link_settings"]
    assert state["restored"] is False
    assert state["ports"]["h2/ens1f0np0"]["on_before"] is False
    assert state["ports"]["h2/ens1f0np0"]["holds"]["autoneg"] is False
    assert "restore_failed" in state["ports"]["h2/ens1f0np0"]
    assert sum(not p["on_before"] for p in state["ports"].values()) == 1


def test_an_abort_mid_sweep_restores_every_port(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    applied = asyncio.Event()

    def note(n: int, port: PortRef, settings: LinkSettings) -> bool:
        if n == 17:  # the second setting's first port: the run is mid-sweep
            applied.set()
        return False

    _failing_apply(monkeypatch, note)

    async def main() -> Any:
        task = asyncio.ensure_future(
            run_experiment(_small(tmp_path), INVENTORY, profile="fast", out_dir=tmp_path, seed=2, plots=False)
        )
        await applied.wait()
        task.cancel()  # what the CLI does on SIGINT/SIGTERM
        return await task

    outcome = asyncio.run(main())
    assert outcome.status == "aborted"
    assert_restored_as_read_before(outcome.run_dir)
    meta = json.loads((outcome.run_dir / "run.json").read_text())
    assert meta["link_settings"]["restored"] is True
