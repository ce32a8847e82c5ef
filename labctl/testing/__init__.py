"""labctl.testing: labctl's contract suites and test fixtures, for a lab that writes its own driver or probe.

Shipped in the wheel; it needs pytest and pytest-asyncio (labctl's `[test]` extra), which nothing else in
labctl imports, and no other labctl module imports this package (tests/unit/test_import_contract.py).

- `SwitchContract` (labctl.testing.switch_contract): subclass it and name your switch driver.
- `ProbeContract` (labctl.testing.probe_contract): subclass it, name your probe and its harness; labctl's
  harnesses (`MODEL_PORTS`, `SWITCH_MONITOR`, `VETH_PAIR`, ... and `HARNESSES` by probe) are in
  labctl.testing.harnesses.
- labctl.testing.plugin: the pytest plugin (the `labctl` pytest11 entry point) with the fixtures
  `labctl_no_leaked_tasks`, `labctl_sim_lab`, `labctl_emulator`, `labctl_mosquitto`, `labctl_kernel_fabric`,
  `labctl_adversarial_agent`.
- `Mosquitto` (a private broker), `require` (skip, or fail in labctl's CI).
- `AdversarialAgent` (labctl.testing.adversary): an agent holding one host's credentials that runs honestly
  for its host and forges replies for the others (the `labctl_adversarial_agent` fixture starts one).

The names below are imported on first use (PEP 562): importing the plugin loads none of the suites.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

import pytest

# Before any suite is imported: their asserts report like a test's (the plugin, when loaded through its entry
# point, is rewritten by pytest itself).
pytest.register_assert_rewrite(
    "labctl.testing.switch_contract", "labctl.testing.probe_contract", "labctl.testing.harnesses"
)

_EXPORTS = {
    "SwitchContract": "labctl.testing.switch_contract",
    "ProbeContract": "labctl.testing.probe_contract",
    "Harness": "labctl.testing.harnesses",
    "HARNESSES": "labctl.testing.harnesses",
    "MODEL_PORTS": "labctl.testing.harnesses",
    "MODEL_PORTS_RC": "labctl.testing.harnesses",
    "SWITCH_MONITOR": "labctl.testing.harnesses",
    "POWER_METER": "labctl.testing.harnesses",
    "VETH_PAIR": "labctl.testing.harnesses",
    "VETH_PAIR_RC": "labctl.testing.harnesses",
    "VETH_PAIR_WINDOW": "labctl.testing.harnesses",
    "RDMA_DEVICE": "labctl.testing.harnesses",
    "Mosquitto": "labctl.testing.mosquitto",
    "AdversarialAgent": "labctl.testing.adversary",
    "require": "labctl.testing.support",
    "IN_CI": "labctl.testing.support",
}

if TYPE_CHECKING:
    from labctl.testing.adversary import AdversarialAgent
    from labctl.testing.harnesses import (
        HARNESSES,
        MODEL_PORTS,
        MODEL_PORTS_RC,
        POWER_METER,
        RDMA_DEVICE,
        SWITCH_MONITOR,
        VETH_PAIR,
        VETH_PAIR_RC,
        VETH_PAIR_WINDOW,
        Harness,
    )
    from labctl.testing.mosquitto import Mosquitto
    from labctl.testing.probe_contract import ProbeContract
    from labctl.testing.support import IN_CI, require
    from labctl.testing.switch_contract import SwitchContract


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'labctl.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "HARNESSES",
    "IN_CI",
    "MODEL_PORTS",
    "MODEL_PORTS_RC",
    "POWER_METER",
    "RDMA_DEVICE",
    "SWITCH_MONITOR",
    "VETH_PAIR",
    "VETH_PAIR_RC",
    "VETH_PAIR_WINDOW",
    "AdversarialAgent",
    "Harness",
    "Mosquitto",
    "ProbeContract",
    "SwitchContract",
    "require",
]
