"""The sim driver's variable optical attenuators on the real clock (decision 0064): the Rx power the NIC
model reads drops by the attenuation once the light arrives, follows each change, and the driver writes an
`ocs.voa` event per setting. The model's arithmetic alone is tests/unit/test_voa.py."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from types import SimpleNamespace

import pytest

from labctl.core.clock import now_ns
from labctl.core.errors import InputError
from labctl.core.events import Event
from labctl.models.fabric import SimFabric
from labctl.models.switch import SwitchModel
from labctl.ocs.drivers.sim.switch import SimSwitch
from labctl.ocs.protocol import OCS_VOA, VariableAttenuator, attenuator_of
from labctl.testing.harnesses import tiny_inventory


async def test_the_sim_driver_attenuates_the_rx_power_the_nic_reads(tmp_path: Path) -> None:
    inv = tiny_inventory(tmp_path)
    profile = inv.profile()
    rng = random.Random(3)
    models = SwitchModel.many({n: s.space for n, s in inv.switches.items()}, profile, rng)
    fabric = SimFabric(inv, models, profile, rng)
    events: list[Event] = []
    switch = SimSwitch(models["ocs1"], events.append)
    assert isinstance(switch, VariableAttenuator) and attenuator_of(switch) is switch
    assert attenuator_of(SimpleNamespace(switch=switch)) is switch and attenuator_of(object()) is None
    a, b = inv.ports
    await switch.connect()
    try:
        await switch.set_attenuation([b.rx], 4.0)  # before the light: it applies when the light comes
        await switch.apply({(a.tx, b.rx), (b.tx, a.rx)})
        await asyncio.sleep(profile.optical_settle_ms[1] / 1000 + 0.05)
        level = fabric.state(b).rx_level_dbm
        resolution = profile.rx_noise_db + 0.01
        assert fabric.rx_power_dbm(b, now_ns()) == pytest.approx(level - 4.0, abs=resolution)
        await switch.set_attenuation([b.rx], 10.0)
        assert fabric.rx_power_dbm(b, now_ns()) == pytest.approx(level - 10.0, abs=resolution)
        assert (await switch.read_attenuation([b.rx, a.rx])).value == {b.rx: 10.0, a.rx: 0.0}
        await switch.set_attenuation([b.rx], 0.0)
        assert fabric.rx_power_dbm(b, now_ns()) == pytest.approx(level, abs=resolution)
        assert [e.value for e in events if e.kind == OCS_VOA] == [4.0, 10.0, 0.0]
        with pytest.raises(InputError, match="ingress"):
            await switch.set_attenuation([a.tx], 1.0)
        with pytest.raises(InputError, match=r"0\.\.40 dB"):
            await switch.set_attenuation([b.rx], 41.0)
    finally:
        await switch.close()
        fabric.cancel_pending()
        for model in models.values():
            model.cancel_pending()
