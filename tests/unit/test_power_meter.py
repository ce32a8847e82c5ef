"""The power meter without a socket: the emulator's SCPI and averaging, the switch model's light at a tap,
the inventory's `power_meters:`, a missing pyvisa, which labs can reach a meter. The probe against its
emulator over real TCP, and t2 taken from a meter in a run, are tests/integration/test_power_meter.py."""

from __future__ import annotations

import math
import random
import re
import sys
from pathlib import Path

import pytest

from labctl.core.errors import InputError
from labctl.core.extras import MissingExtra, install_hint
from labctl.emulators.meter_light import SwitchLight
from labctl.emulators.power_meter import N77xxEmulator, Slot
from labctl.inventory.schema import load_inventory
from labctl.labs import load
from labctl.models.switch import INSERTION_LOSS_DB, SwitchModel
from labctl.probes.base import MeterSite, ProbeContext, probe_kinds
from labctl.probes.power_meter import PowerMeterProbe
from tests.helpers.power_meter import MS, SETTINGS, write_inventory

pytest.importorskip("pyvisa_py", reason="the power-meter probe needs the [scpi] extra")


# -- the emulator's SCPI -------------------------------------------------------------------------------------
class Step:
    """Dark until `on_ns`, then `mw`: an exact light history."""

    def __init__(self, on_ns: int, mw: float) -> None:
        self.on_ns, self.mw = on_ns, mw

    def mean_mw(self, start_ns: int, end_ns: int) -> float:
        if end_ns <= start_ns:
            return self.mw if start_ns >= self.on_ns else 0.0
        lit = max(0, end_ns - max(start_ns, self.on_ns))
        return self.mw * lit / (end_ns - start_ns)


async def test_emulator_speaks_n77xx_scpi() -> None:
    emu = N77xxEmulator({1: Step(0, 1.0), 2: Step(0, 0.5)})
    assert (await emu.execute("*IDN?") or "").startswith("Keysight Technologies,N7744A,")
    # Short or long mnemonics, any case, optional colon, units; queries answer in base units.
    assert await emu.execute(":sense1:power:wavelength 1310nm") is None
    assert await emu.execute("SENS1:POW:WAV?") == "+1.310000E-06"
    assert await emu.execute("SENSe2:POWer:ATIMe 0.5MS;ATIM?") == "+5.000000E-04"  # relative after `;`
    assert await emu.execute("sens2:pow:unit?") == "0"
    fetched = await emu.execute("FETC1:CHAN1:POW?;:fetch2:channel1:scalar:power:dc?")
    assert fetched is not None
    one, two = (float(v) for v in fetched.split(";"))
    assert one == pytest.approx(0.0, abs=0.05) and two == pytest.approx(-3.01, abs=0.05)
    await emu.execute("SENS1:POW:UNIT 1")
    assert float(await emu.execute("FETC1:POW?") or "nan") == pytest.approx(1e-3, rel=0.01)  # watts
    # Errors queue up in order; a query in error answers nothing; an empty queue says so.
    assert await emu.execute("FETC9:CHAN1:POW?") is None
    await emu.execute("SENS1:POW:ATIM 20S")
    await emu.execute("SENS1:POW:WAV")
    await emu.execute("BOGUS:NODE 1")
    assert await emu.execute("SYST:ERR?") == '-114,"Header suffix out of range"'
    assert await emu.execute("SYST:ERR?") == '-222,"Data out of range"'
    assert await emu.execute("syst:err:next?") == '-109,"Missing parameter"'
    assert await emu.execute("SYST:ERR?") == '-113,"Undefined header;BOGUS:NODE"'
    assert await emu.execute("SYST:ERR?") == '+0,"No error"'
    assert await emu.execute("*CLS;SENS1:POW:ATIM?") == "+1.000000E-03"  # the refused 20 S left it alone


def test_emulator_reading_is_the_mean_over_the_last_completed_window() -> None:
    """Continuous measurement: back-to-back windows of the averaging time from `phase_ns`; FETC gives the
    mean over the last one completed, so a step shows up one window late and half-lit in between."""
    light = Step(on_ns=15 * MS, mw=1.0)
    emu = N77xxEmulator({1: light})
    slot = Slot(light, atim_ns=10 * MS, phase_ns=0)

    def dbm(t_ns: int) -> float:
        mw = emu.fetch_mw(slot, t_ns)
        assert mw is not None
        return 10 * math.log10(mw)

    assert dbm(19 * MS) < -80  # window [0, 10 ms]: dark, though the light came on at 15 ms
    assert dbm(21 * MS) == pytest.approx(-3.01, abs=0.05)  # [10, 20 ms]: lit half of it
    assert dbm(31 * MS) == pytest.approx(0.0, abs=0.05)  # [20, 30 ms]: lit throughout
    # A triggered measurement (INIT:IMM) is available once its window has ended, then held.
    slot.continuous, slot.single = False, (40 * MS, 50 * MS)
    assert emu.fetch_mw(slot, 45 * MS) is None
    assert dbm(50 * MS) == pytest.approx(0.0, abs=0.05)
    assert dbm(90 * MS) == pytest.approx(0.0, abs=0.05)


def test_switch_light_integrates_the_model_history() -> None:
    from labctl.inventory.mapping import PortSpace
    from labctl.inventory.profiles import resolve_profile

    model = SwitchModel("ocs1", PortSpace.parse("4x4"), resolve_profile("fast"), random.Random(0))
    model.transmitting[1] = 0.0 + INSERTION_LOSS_DB  # 1 mW out of the switch
    light = SwitchLight(model, [5])
    light._on_light(5, 1, 100)  # lit from t=100 ns
    light._on_light(5, None, 300)  # dark from 300 ns
    assert light.mean_mw(5, 0, 400) == pytest.approx(0.5)
    assert light.mean_mw(5, 150, 250) == pytest.approx(1.0)
    assert light.mean_mw(5, 200, 200) == pytest.approx(1.0)  # an empty window: the value then
    assert light.mean_mw(5, 300, 1000) == 0.0


# -- inventory and lab ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("channel", "where", "message"),
    [
        ("{switch: ocs9, port: 10}", "switch", "unknown switch 'ocs9' (known: ocs1)"),
        ("{switch: ocs1, port: 3}", "port", "port 3 is not an egress port of ocs1 (9..16)"),
        ("{host: h9, nic: e0}", "host", "unknown host 'h9'"),
        ("{host: h1, nic: eth7}", "nic", "h1 has no NIC port 'eth7' (known: e0)"),
        ("{switch: ocs1, port: 9}", "port", "ocs1 port 9 is already measured"),
    ],
)
def test_bad_channel_is_one_line(tmp_path: Path, channel: str, where: str, message: str) -> None:
    channels = f"      1: {{host: h1, nic: e0}}\n      2: {channel}\n"
    with pytest.raises(InputError) as caught:
        load_inventory(write_inventory(tmp_path, channels))
    text = str(caught.value)
    assert "\n" not in text
    assert "inventory.yaml:" in text and f"power_meters.pm1.channels.2.{where}: {message}" in text


def test_a_channel_with_both_or_neither_target_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"inventory.yaml:\d+: .*either \{switch, port\} or \{host, nic\}"):
        load_inventory(write_inventory(tmp_path, "      1: {host: h1, nic: e0, switch: ocs1, port: 9}\n"))


def test_labs_refuse_meters_they_cannot_reach(tmp_path: Path) -> None:
    path = write_inventory(tmp_path)
    path.write_text(path.read_text().replace("emulate: true", "address: 192.0.2.7"))
    with pytest.raises(
        InputError, match=r"inventory.yaml:\d+: power_meters.pm1: the light of a simulated lab"
    ):
        load(path)


def test_missing_pyvisa_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inv = load_inventory(write_inventory(tmp_path))
    site = MeterSite("pm1", inv.model.power_meters["pm1"], inv.meter_channels("pm1"), lambda: ("x", 1))
    monkeypatch.setitem(sys.modules, "pyvisa", None)  # `import pyvisa` now raises ImportError
    with pytest.raises(MissingExtra) as caught:
        probe_kinds.get("power-meter").build(ProbeContext(SETTINGS, meters=[site]))
    assert str(caught.value) == (
        "the power-meter probe (Keysight N77xx over SCPI) needs pyvisa (it is not installed): "
        + install_hint("scpi")
    )


REHEARSAL = Path(__file__).resolve().parents[2] / "experiments" / "inventories" / "rehearsal.yaml"


def _rehearsal_without_meters() -> str:
    """The rehearsal inventory less its own `power_meters:` (each test here appends one of its own)."""
    return re.sub(r"(?m)^power_meters:\n(?:[ #].*\n|\n)*", "", REHEARSAL.read_text())


METER_AT = """
power_meters:
  pm1:
    address: 192.0.2.40
    {emulate}channels: {{1: {{host: h1, nic: ens1f0np0}}, 2: {{switch: ocs1, port: 34}}}}
"""


def test_the_real_lab_polls_the_meter_at_its_address(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from labctl.labs import real
    from labctl.labs.base import LabContext

    path = tmp_path / "real.yaml"
    path.write_text(_rehearsal_without_meters() + METER_AT.format(emulate=""))
    inv = load_inventory(path)
    lab = real.build(LabContext(inv, inv.profile(), random.Random(1), lambda _e: None, SETTINGS))
    try:
        (probe,) = [p for p in lab.probes if isinstance(p, PowerMeterProbe)]
        (meter,) = probe.meters
        assert meter.site.endpoint() == ("192.0.2.40", 5025)
        assert [ch.label for ch in meter.site.channels] == ["h1/ens1f0np0", "ocs1/34"]
        assert not lab.start_hooks[1:]  # nothing served for it: the hub starts, no emulator
    finally:
        lab.close()
    path.write_text(_rehearsal_without_meters() + METER_AT.format(emulate="emulate: true\n    "))
    monkeypatch.setenv("LABCTL_REHEARSAL_PASSWORD", "x")  # the inventory's switch secret
    with pytest.raises(InputError, match=r"real.yaml:\d+: power_meters.pm1: a real lab polls power meters"):
        load(path)
