"""The hardware tier's own promises, kept without a lab: tests/hardware/test_lab.py drives someone's real
switch, so when a step of its contract test fails it must still put back the patches it found there.

No root needed: the switch is the simulated driver over an in-process model, standing in for `open_switch`.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any

import pytest

from labctl.inventory.schema import load_inventory
from labctl.inventory.topology import rail_scope
from labctl.models.switch import SwitchModel
from labctl.ocs.drivers.sim.switch import SimSwitch
from labctl.ocs.protocol import ApplyResult, EventSink, Timed
from tests.conftest import REPO
from tests.hardware import test_lab

INVENTORY = REPO / "experiments" / "inventories" / "rehearsal.yaml"


class FailingDisconnect(SimSwitch):
    """A switch whose `disconnect` fails, as a real one can mid-test (a refused command, a dropped session)."""

    async def disconnect(
        self, ports: Iterable[int], *, context: dict[str, Any] | None = None
    ) -> Timed[ApplyResult]:
        raise RuntimeError("injected: the switch refused the disconnect")


async def test_the_contract_test_puts_back_what_it_found_even_when_it_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lab = load_inventory(INVENTORY)  # its switch is never dialled: open_switch is replaced below
    [(name, spec)] = lab.switches.items()
    model = SwitchModel(name, spec.space, lab.profile(), random.Random(0))
    scope = set().union(*(rail_scope(lab, rail) for rail in lab.rails))
    # Someone's patches on the lab's ports, crossed so that the test's ring must change them.
    h1 = [p for p in lab.ports if p.host == "h1" and p.rail == 0]
    found = {(h1[0].tx, h1[1].rx), (h1[1].tx, h1[0].rx)}
    seed = SimSwitch(model, lambda e: None)
    await seed.connect()
    await seed.apply(found)
    opened: list[FailingDisconnect] = []

    def open_failing(switch: str, _spec: object, emit: EventSink) -> FailingDisconnect:
        opened.append(FailingDisconnect(model, emit, name=switch))
        return opened[-1]

    monkeypatch.setattr(test_lab, "open_switch", open_failing)
    with pytest.raises(RuntimeError, match="injected"):
        await test_lab.test_every_switch_keeps_the_contract(lab)
    assert opened, "the contract test never opened the switch"
    assert {p for p in model.patches if p[0] in scope or p[1] in scope} == found
    assert not opened[0]._connected  # and closed it
