"""Checking an inventory loads no switch or fabric model, probe, event loop or array stack: behaviour, not
speed, is asserted here.

`labctl inventory check` (and every `labs.load`, `import labctl.inventory.schema`) builds the inventory's
config union, which imports every switch driver's package, and runs the lab kind's `check`. Those import
their drivers, models and probes (numpy), asyncio and the agents' MQTT client only inside the functions that
open, emulate or build something. Read from the modules' source, through labctl's own modules, with the
reader of tests/unit/test_cli_startup.py (load-time imports: not function bodies, not `if TYPE_CHECKING:`);
the registry's own imports of its entries are named here, since no source line shows them.
tests/integration/test_lazy_imports.py checks the same in a fresh interpreter's `sys.modules`.
"""

from __future__ import annotations

import pytest

from labctl.core.registry import LAB_KINDS, SWITCH_DRIVERS
from tests.unit.test_cli_startup import load_time_closure

NOT_FOR_A_CHECK = (
    "numpy",
    "pandas",
    "matplotlib",
    "pyarrow",
    "asyncio",
    "aiomqtt",
    "labctl.models",
    "labctl.probes",
    "labctl.agents",
    "labctl.run",
    "labctl.analysis",
)
# The lab kinds whose check needs nothing it would build; `agents` and `real` check broker settings
# (labctl.agents.broker) and the agents kind is built by every `labctl agent` that loads it.
LIGHT_KINDS = ("simulated", "kernel")


def _entry_module(target: str) -> str:
    return target.partition(":")[0]


ENTRY_POINTS = [
    "labctl.inventory.schema",
    "labctl.labs",
    *(_entry_module(SWITCH_DRIVERS[name]) for name in SWITCH_DRIVERS),
    *(_entry_module(LAB_KINDS[name]) for name in LIGHT_KINDS),
]


def _heavy(module: str, heavy: tuple[str, ...]) -> list[str]:
    return sorted(
        f"{name} (imported by {by})"
        for name, by in load_time_closure(module).items()
        if any(name == h or name.startswith(h + ".") for h in heavy)
    )


def test_the_reader_sees_what_a_lab_kind_builds_with() -> None:
    """The agents lab kind does load its models and MQTT client with its module: the reader finds them."""
    found = _heavy(_entry_module(LAB_KINDS["agents"]), NOT_FOR_A_CHECK)
    assert any(f.startswith("numpy ") for f in found) and any(f.startswith("aiomqtt ") for f in found)


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_loading_and_checking_an_inventory_imports_nothing_it_does_not_use(module: str) -> None:
    assert _heavy(module, NOT_FOR_A_CHECK) == []


def test_every_labctl_process_reads_the_package_metadata_only_for_an_install_hint() -> None:
    """labctl.core.extras loads with every command (labctl.cli); importlib.metadata only in install_hint."""
    assert _heavy("labctl.core.extras", ("importlib.metadata",)) == []
    assert _heavy("labctl.cli", ("importlib.metadata",)) == []
