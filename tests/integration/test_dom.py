"""DOM on the real clock and through the CLI: a module that stops answering is given up while the other ports
go on sampling; `labctl dom decode` as a subprocess. The decoder on hand-written images is
tests/unit/test_dom.py."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from labctl.linux.ethtool import ModuleEepromError
from labctl.models.module_eeprom import EmulatedQsfp28
from labctl.probes.rxpower import RxPowerProbe
from labctl.probes.rxpower_ports import ModulePort
from tests.helpers.dom import _collect, _Flaky, qsfp28


def test_cli_decode_json_and_errors(tmp_path) -> None:  # type: ignore[no-untyped-def]
    good = tmp_path / "qsfp.hex"
    good.write_text(bytes(qsfp28()).hex(" "))
    run = [sys.executable, "-m", "labctl.cli", "dom", "decode"]
    out = subprocess.run([*run, str(good), "--hex"], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    import json

    doc = json.loads(out.stdout)
    assert doc["module"] == "sff8636"
    assert [lane["rx_power_dbm"] for lane in doc["lanes"]][2] is None
    bad = tmp_path / "short.bin"
    bad.write_bytes(bytes(qsfp28()[:50]))
    out = subprocess.run([*run, str(bad)], capture_output=True, text=True, check=False)
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0
    assert out.stderr.startswith(f"error: {bad}: truncated sff8636 image (50 bytes)")
    out = subprocess.run([*run, str(good)], capture_output=True, text=True, check=False)  # hex without --hex
    assert out.returncode == 2
    assert "add --hex" in out.stderr


async def test_a_module_that_stops_answering_is_dropped_and_the_other_ports_go_on() -> None:
    """One dead module: its port is given up (a `sampler.error` event says why), the others keep being
    sampled, and leaving the probe raises the failure so the run records it."""
    dead = _Flaky(EmulatedQsfp28(rx_power_mw=0.5), failures=10**9)
    good = EmulatedQsfp28(rx_power_mw=0.5)
    probe = RxPowerProbe(
        [
            ModulePort("nic:h1/dead", "h1", lambda: dead, (1,)),
            ModulePort("nic:h1/good", "h1", lambda: good, (1,)),
        ],
        hz=2000,
        max_error_streak_s=0.01,  # 20 failed reads
        report_interval_ns=5_000_000,
    )
    with pytest.raises(ModuleEepromError, match=r"^nic:h1/dead: 20 consecutive failed reads, last: I2C NAK$"):
        async with probe:
            events = await asyncio.wait_for(_collect(probe, 40), 5)
    errors = [e for e in events if e.kind == "sampler.error"]
    assert [(e.source, e.meta["read_errors"]) for e in errors] == [("nic:h1/dead", 20)]
    after = [e for e in events if e.source == "nic:h1/good" and e.t_ns > errors[0].t_ns]
    assert after, "the good port must go on after the dead one was given up"
    assert probe.read_errors == 20  # not one more: the dead module is no longer read


def test_cli_decode_prints_the_identity(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    path = tmp_path / "module.bin"
    path.write_bytes(EmulatedQsfp28(vendor="ACME OPTICS", part_number="QSFP-X", serial="SN42").image())
    out = subprocess.run(
        [sys.executable, "-m", "labctl.cli", "dom", "decode", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    identity = json.loads(out.stdout)["identity"]
    assert (identity["vendor_name"], identity["part_number"], identity["serial_number"]) == (
        "ACME OPTICS",
        "QSFP-X",
        "SN42",
    )
