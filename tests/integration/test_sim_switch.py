"""The simulated switch on the real clock: a timeout policy bounds a whole apply, and the NIC model recovers
in order and drops on light loss. The rest is tests/unit/test_sim_switch.py."""

from __future__ import annotations

import asyncio
import random

import pytest

from labctl.core.errors import HardwareError
from labctl.core.events import Event
from labctl.inventory.mapping import MappingDiff
from labctl.inventory.schema import load_inventory
from labctl.models.fabric import SimFabric
from labctl.models.switch import SwitchModel
from labctl.ocs.drivers.sim.switch import SimSwitch
from labctl.ocs.protocol import TimeoutPolicy
from tests.helpers.sim_switch import FAST, make_switch


async def test_timeout_policy_bounds_a_whole_apply() -> None:
    events: list[Event] = []
    sw = make_switch(events, TimeoutPolicy(operation_s=0.05))

    async def stuck(diff: MappingDiff) -> None:
        await asyncio.sleep(10)

    sw._send = stuck  # type: ignore[method-assign]
    await sw.connect()
    with pytest.raises(HardwareError, match=r"ocs1: apply did not finish within 0.05 s"):
        await sw.apply([(1, 9)])


async def test_nic_model_recovers_in_order_and_drops_on_light_loss(inventory_path) -> None:
    inv = load_inventory(inventory_path)
    rng = random.Random(3)
    model = SwitchModel("ocs1", inv.switches["ocs1"].space, FAST, rng)
    fabric = SimFabric(inv, {"ocs1": model}, FAST, rng)
    seen: list[tuple[str, str, int, int]] = []
    fabric.add_listener(lambda port, kind, value, t: seen.append((port.label, kind, value, t)))
    h1, h2 = inv.rail_ports(0)["h1"][0], inv.rail_ports(0)["h2"][0]
    sw = SimSwitch(model, lambda e: None)
    await sw.connect()
    await sw.apply([(h1.tx, h2.rx), (h2.tx, h1.rx)])
    await asyncio.sleep(0.15)  # fast profile: firmware 40-60 ms, transport +10-20 ms
    ups = {(label, kind): t for label, kind, value, t in seen if value == 1}
    for label in (h1.label, h2.label):
        assert ups[(label, "link.firmware")] < ups[(label, "carrier")] < ups[(label, "transport")]
        assert 70_000 <= ups[(label, "carrier")] - ups[(label, "link.firmware")] <= 80_000
    assert fabric.rx_power_dbm(h1, ups[(h1.label, "carrier")]) is not None
    t_cut = seen[-1][3]
    await sw.apply([], scope={h1.tx, h1.rx, h2.tx, h2.rx})
    await asyncio.sleep(0.02)
    downs = [(label, kind) for label, kind, value, t in seen if value == 0 and t > t_cut]
    assert (h1.label, "carrier") in downs and (h2.label, "transport") in downs
    assert fabric.rx_power_dbm(h1, t_cut) is None  # no light is None, never a made-up floor
    fabric.cancel_pending()
    model.cancel_pending()
