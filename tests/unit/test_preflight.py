"""`labctl lab check` (labctl.run.preflight) agrees with what a run does: the owned-ports test is converge's, the
hosts' interfaces are inspected only where the agents' probes read them, and a module the Rx-power probe
refuses fails the check with the probe's words."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from labctl.agents import inspect
from labctl.agents.inspect import inspect_port
from labctl.inventory.mapping import MappingDiff
from labctl.inventory.profiles import resolve_profile
from labctl.inventory.schema import NicPort
from labctl.linux.transceiver import FlatImage, ModuleEeprom, PagedImage, read_dom
from labctl.models.switch import SwitchModel
from labctl.ocs.drivers.sim import DRIVER as SIM
from labctl.ocs.protocol import crossing_patches
from labctl.ocs.switches import emulate_switch
from labctl.probes.rxpower import RxPowerProbe
from labctl.probes.rxpower_ports import ModulePort
from labctl.run.preflight import Check, _port_checks, _read_switch
from tests.helpers.dom import put, qsfp28
from tests.unit.test_dom import cmis_pages

FAST = resolve_profile("fast")


@pytest.mark.parametrize(
    ("patches", "crossing"),
    [
        ({(1, 9), (2, 10)}, []),  # both ends owned
        ({(5, 13)}, []),  # both ends another lab's
        ({(2, 14), (5, 10), (1, 9)}, [(2, 14), (5, 10)]),  # owned ingress → foreign egress, and back
    ],
)
async def test_the_switch_check_reports_the_patches_converge_refuses_to_remove(
    patches: set[tuple[int, int]], crossing: list[tuple[int, int]]
) -> None:
    config = SIM.config.model_validate({"driver": "sim", "size": "8x8", "owned_ports": ["1-4", "9-12"]})
    owned = config.owned
    assert owned is not None
    model = SwitchModel("ocs1", config.space, FAST, random.Random(0))
    await model.execute(MappingDiff(remove=frozenset(), add=frozenset(patches)))
    out: list[Check] = []
    try:
        await _read_switch(
            "switch ocs1", config, emulate_switch("ocs1", config, model, lambda e: None), "model", out
        )
    finally:
        model.cancel_pending()
    [row] = [c for c in out if c.item == "owned ports"]
    assert crossing_patches(patches, owned) == crossing
    assert row.ok is (not crossing)
    if crossing:
        assert str(crossing) in row.detail


# -- a transceiver the Rx-power probe refuses fails the check, in the probe's words -----------------------------
def sfp_without_ddm() -> bytes:
    img = bytearray(512)
    put(img, 0, "03")  # SFP
    put(img, 92, "00")  # no digital diagnostics: identity only, no lanes
    return bytes(img)


def qsfp28_one_lane_dark() -> bytes:
    return bytes(qsfp28())  # lanes 1-4: 0.8, 0.1, 0 (no light), 1.0 mW


def cmis_without_rx_monitor() -> dict[tuple[int, int, int], bytes]:
    pages = cmis_pages()
    page01 = bytearray(pages[(0x50, 0, 1)])
    put(page01, 160 - 128, "03")  # Tx bias and Tx power monitors, no Rx power monitor: lanes, unmonitored
    pages[(0x50, 0, 1)] = bytes(page01)
    return pages


def cmis_flat_memory() -> dict[tuple[int, int, int], bytes]:
    lower = bytearray(256)
    put(lower, 0, "18 40 80")  # QSFP-DD, CMIS 4.0, flat memory: no per-lane monitors at all
    return {(0x50, 0, 0): bytes(lower)}


MODULES: dict[str, Callable[[], ModuleEeprom]] = {
    "qsfp28, one lane dark": lambda: FlatImage(qsfp28_one_lane_dark()),
    "sfp without diagnostics": lambda: FlatImage(sfp_without_ddm()),
    "cmis without an rx monitor": lambda: PagedImage(cmis_without_rx_monitor()),
    "cmis flat memory": lambda: PagedImage(cmis_flat_memory()),
}


@pytest.mark.parametrize("module", MODULES)
async def test_check_and_run_agree_on_a_ports_transceiver(
    module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the agent reports (inspect_port) and the check makes of it, against what the rx-power probe does
    with the same module at start: the probe refuses exactly the modules the check fails, for the reason
    the check gives. A lane with no light passes (the patch may simply not be made yet)."""
    open_module = MODULES[module]
    monkeypatch.setattr(inspect, "read_module", lambda ifname: read_dom(open_module()))
    port = NicPort("h1", "lo", 0, None, "ocs1", 1, 9, 100, None)  # lo: an interface every host has
    facts = await asyncio.to_thread(inspect_port, port)  # as the agent runs it: pyroute2 wants no loop
    [row] = [c for c in _port_checks(port.label, None, facts) if c.item.startswith("module")]

    probe = RxPowerProbe([ModulePort(port.source, port.host, open_module)], hz=100)
    async with probe:
        pass
    refusal = probe.unsampled.get(port.source)

    assert row.ok is (refusal is None), (row, refusal)
    if refusal is not None:
        assert refusal == f"{port.source}: {row.detail}"
        assert "has no Rx power monitor" in row.detail
    else:
        assert row.detail == "QSFP28: 4 lane(s): -0.97 dBm, -10.00 dBm, no light, 0.00 dBm"


async def test_the_module_row_names_vendor_part_and_serial(monkeypatch: pytest.MonkeyPatch) -> None:
    from labctl.models.module_eeprom import EmulatedQsfp28

    module = EmulatedQsfp28(rx_power_mw=0.5, vendor="ACME OPTICS", part_number="QSFP-X", serial="SN42")
    monkeypatch.setattr(inspect, "read_module", lambda ifname: read_dom(module))
    port = NicPort("h1", "lo", 0, None, "ocs1", 1, 9, 100, None)
    facts = await asyncio.to_thread(inspect_port, port)
    assert facts["module"]["identity"]["serial_number"] == "SN42"
    [row] = [c for c in _port_checks(port.label, None, facts) if c.item.startswith("module")]
    assert row.ok and row.detail.startswith("QSFP28 ACME OPTICS QSFP-X SN42: 4 lane(s): -3.01 dBm")


def test_the_module_declaration_is_checked_like_any_field(tmp_path: Path) -> None:
    from labctl.core.errors import InputError
    from labctl.inventory.schema import load_inventory

    path = tmp_path / "inventory.yaml"
    path.write_text(
        "lab: t\nswitches:\n  ocs1: {driver: sim, size: 8x8}\nhosts:\n  h1:\n    nics:\n"
        "      - {ifname: p0, rail: 0, switch: ocs1, tx: 1, rx: 9, module: perhaps}\n"
    )
    with pytest.raises(InputError) as bad:
        load_inventory(path)
    line = str(bad.value)
    assert line.startswith(f"{path}:7: hosts.h1.nics[0].module: ") and "\n" not in line, line


def test_the_rx_power_probe_leaves_ports_without_a_module_alone() -> None:
    """A port declared `module: false` is not among the rx-power probe's ports: no EEPROM is opened, no
    sampler.error is written for it."""
    from labctl.probes.base import PortSite, ProbeContext
    from labctl.probes.rxpower import PROBE
    from labctl.probes.sampling import ProbeSettings

    with_module = NicPort("h1", "lo", 0, None, "ocs1", 1, 9, 100, None)
    without = NicPort("h1", "nosuch0", 0, None, "ocs1", 2, 10, 100, None, None, False)
    probe = PROBE.build(ProbeContext(ProbeSettings(), ports=[PortSite(with_module), PortSite(without)]))
    assert isinstance(probe, RxPowerProbe)
    assert [p.source for p in probe.ports] == [with_module.source]
