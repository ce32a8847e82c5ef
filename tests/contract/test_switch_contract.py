"""The `OpticalSwitch` contract (labctl.testing.switch_contract) on every registered driver with an emulator.

The suite itself ships in the wheel, so that a lab's own driver runs it too; here it runs once per driver
that has an `emulate` entry: registering a driver with one puts it here with no edit to this file.
"""

from __future__ import annotations

import inspect

from labctl.ocs.switches import switch_drivers
from labctl.testing.switch_contract import SwitchContract, emulated_drivers, is_network_driver

DRIVERS = emulated_drivers()
"""Every driver this suite runs against: all those that can be driven over the lab's switch model."""

NETWORK_DRIVERS = tuple(name for name in DRIVERS if is_network_driver(name))
"""Drivers of a switch at an address, emulated only when the config says `emulate: true`."""

WITHOUT_EMULATOR: frozenset[str] = frozenset()
"""Registered drivers knowingly left out of this suite (no `emulate` entry). A new driver without one
fails test_the_suite_covers_every_registered_driver until it gets an emulator or is named here."""


class TestEveryDriver(SwitchContract):
    driver = DRIVERS


def test_the_suite_covers_every_registered_driver() -> None:
    registered = switch_drivers.all()  # imports every entry: a broken one fails here
    with_emulator = {name for name, entry in registered.items() if entry.emulate is not None}
    assert set(DRIVERS) == with_emulator
    assert {"sim", "polatis-tl1"} <= with_emulator  # today's drivers: the suite must not shrink silently
    assert {"polatis-tl1", "polatis-netconf", "polatis-scpi", "dicon-serial"} <= set(NETWORK_DRIVERS)
    missing = set(registered) - with_emulator - WITHOUT_EMULATOR
    assert not missing, f"driver(s) {sorted(missing)} have no `emulate` entry, so no contract test runs them"
    # Every case of the suite runs once per driver (it takes the `driver` or `rig` fixture).
    cases = {name: f for name, f in vars(SwitchContract).items() if name.startswith("test_") and callable(f)}
    assert len(cases) >= 10
    for name, case in cases.items():
        parameters = inspect.signature(case).parameters
        assert {"driver", "rig"} & set(parameters), f"{name} does not run per driver"
    assert set(cases) >= SwitchContract.NETWORK_ONLY
