"""Variable optical attenuators (decision 0064): the switch model's attenuation per mode, the Rx power the
NIC model reads lowered by it, the sim driver's `VariableAttenuator`, and an experiment's attenuation sweep
compiled to `Attenuate` steps (bad input is one line with file:line)."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from labctl.core.errors import InputError
from labctl.inventory.mapping import PortSpace
from labctl.inventory.profiles import resolve_profile
from labctl.inventory.schema import load_inventory
from labctl.models.switch import INSERTION_LOSS_DB, MAX_ATTENUATION_DB, OpmConfig, SwitchModel, VoaSetting
from labctl.ocs.drivers.sim.switch import SimSwitch
from labctl.run.experiment import build_plan, load_experiment
from labctl.run.steps import Attenuate, Reconfigure


def _model() -> SwitchModel:
    model = SwitchModel("ocs1", PortSpace(4, 4), resolve_profile("fast"), random.Random(1))
    model.transmitting.update({1: 0.0, 2: -4.0})
    return model


def test_each_mode_attenuates_as_the_yang_describes() -> None:
    model = _model()
    model.lit[5] = 1  # ingress 1's light reaches egress 5
    assert model.power_dbm(5) == -INSERTION_LOSS_DB
    model.set_voa(5, VoaSetting("VOA_MODE_RELATIVE", 5.0))
    assert model.attenuation_db(5) == 5.0 and model.power_dbm(5) == -INSERTION_LOSS_DB - 5.0
    model.set_voa(5, VoaSetting("VOA_MODE_RELATIVE", 1.0, reference=2))  # 1 dB below ingress 2's -4 dBm
    assert model.attenuation_db(5) == pytest.approx(5.0)
    model.set_voa(5, VoaSetting("VOA_MODE_ABSOLUTE", -10.0))  # to -10 dBm out
    assert model.power_dbm(5) == pytest.approx(-10.0)
    model.set_voa(5, VoaSetting("VOA_MODE_ABSOLUTE", 3.0))  # above the light: nothing to take off
    assert model.attenuation_db(5) == 0.0
    model.set_voa(5, VoaSetting("VOA_MODE_RELATIVE", 2.345))
    assert model.attenuation_db(5) == 2.35  # to the YANG's two fraction digits
    model.set_voa(5, VoaSetting("VOA_MODE_FIXED"))  # holds what was in force
    assert model.voa_setting(5).held_db == 2.35
    model.set_voa(5, VoaSetting("VOA_MODE_MAXIMUM"))
    assert model.attenuation_db(5) == MAX_ATTENUATION_DB
    model.set_voa(5, VoaSetting())
    assert model.voa == {} and model.power_dbm(1) == 0.0  # ingress light is never attenuated
    with pytest.raises(ValueError, match="egress"):
        model.set_voa(1, VoaSetting("VOA_MODE_RELATIVE", 1.0))
    with pytest.raises(ValueError, match="atten-mode"):
        model.set_voa(5, VoaSetting("LOUD"))


def test_the_power_monitor_offset_is_added_to_readings_only() -> None:
    model = _model()
    model.set_opm(1, OpmConfig(1310.0, 2.0, 3))
    assert model.monitor_dbm(1) == 2.0 and model.power_dbm(1) == 0.0
    assert model.opm_config(1) == OpmConfig(1310.0, 2.0, 3)
    model.set_opm(1, OpmConfig())
    assert model.opm == {}
    with pytest.raises(ValueError, match=r"1260\.\.1640"):
        model.set_opm(1, OpmConfig(wavelength_nm=900.0))


SWEEP = """\
name: voa-sweep
phases:
  dp: {pairs: [[h1, h2], [h3, h4]]}
  pp: {pairs: [[h1, h3], [h2, h4]]}
baseline: dp
cycle: [pp, dp]
repeat: 3
voa:
  - {switch: ocs1, ports: [33], atten_db: [0, 5]}
"""


def _plan(tmp_path: Path, text: str, inventory_path: Path) -> Any:
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    spec, src = load_experiment(path)
    return build_plan(spec, load_inventory(inventory_path), src)


def test_a_sweep_sets_the_attenuators_before_each_repetition_and_clears_them(
    tmp_path: Path, inventory_path: Path
) -> None:
    plan = _plan(tmp_path, SWEEP, inventory_path)
    kinds = [
        (type(s).__name__, getattr(s, "atten_db", getattr(s, "phase", None)))
        for s in plan.program
        if isinstance(s, Attenuate | Reconfigure)
    ]
    assert kinds == [
        ("Reconfigure", "dp"),
        ("Attenuate", 0.0),
        ("Reconfigure", "pp"),
        ("Reconfigure", "dp"),
        ("Attenuate", 5.0),
        ("Reconfigure", "pp"),
        ("Reconfigure", "dp"),
        ("Attenuate", 0.0),  # levels cycle
        ("Reconfigure", "pp"),
        ("Reconfigure", "dp"),
        ("Attenuate", 0.0),  # the run ends with the attenuators cleared
    ]
    assert all(s.ports == (33,) and s.switch == "ocs1" for s in plan.program if isinstance(s, Attenuate))
    assert len(plan.steps) == 6  # the reconfigurations are the experiment's, unchanged


@pytest.mark.parametrize(
    ("sweep", "expected"),
    [
        ("{switch: ocs9, ports: [33], atten_db: [1]}", "exp.yaml:9: voa[0].switch: unknown switch 'ocs9'"),
        ("{switch: ocs1, ports: [3], atten_db: [1]}", "exp.yaml:9: voa[0].ports[0]: port 3 is not an egress"),
        ("{switch: ocs1, ports: [33], atten_db: [50]}", "exp.yaml:9: voa[0].atten_db[0]"),
        ("{switch: ocs1, ports: [], atten_db: [1]}", "exp.yaml:9: voa[0].ports"),
    ],
)
def test_a_bad_sweep_is_one_line_with_file_and_line(
    tmp_path: Path, inventory_path: Path, sweep: str, expected: str
) -> None:
    text = SWEEP.replace("{switch: ocs1, ports: [33], atten_db: [0, 5]}", sweep)
    with pytest.raises(InputError) as info:
        _plan(tmp_path, text, inventory_path)
    assert expected in str(info.value) and "\n" not in str(info.value)


async def test_the_attenuate_step_refuses_a_switch_without_attenuators() -> None:
    messages: list[str] = []
    run: Any = SimpleNamespace(
        lab=SimpleNamespace(switches={"ocs1": object()}),
        progress=SimpleNamespace(message=messages.append),
        attenuated={},
    )
    with pytest.raises(InputError, match="no variable optical attenuators"):
        await Attenuate("ocs1", (33,), 5.0).execute(run)
    model = SwitchModel("ocs1", PortSpace(32, 32), resolve_profile("fast"), random.Random(1))
    switch = SimSwitch(model, lambda _e: None)
    await switch.connect()
    run.lab.switches["ocs1"] = SimpleNamespace(switch=switch)  # a driver inside its emulator's wrapper
    await Attenuate("ocs1", (33,), 5.0).execute(run)
    assert model.voa_setting(33).level == 5.0 and messages == ["ocs1: port(s) 33 attenuated 5 dB"]
    assert run.attenuated == {"ocs1": {33}}  # what the run sets back on any exit
    # A run stopped mid-sweep: the engine's restore clears what the steps left attenuated.
    from labctl.run.engine import RunEngine

    await RunEngine._clear_attenuation(run)
    assert model.voa_setting(33).level == 0.0 and run.attenuated == {}
    await Attenuate("ocs1", (33,), 0.0).execute(run)
    assert run.attenuated == {"ocs1": set()}
