"""`labctl emulate ocs DRIVER` in its own process and `labctl ocs connect|apply|show|disconnect` against it,
for every protocol: the path a lab engineer takes to try a driver before pointing it at a real switch.

What differs per protocol is only how the inventory reaches the emulator (the address it printed; a pty
or console-server URL for a serial switch; the SSH host key it printed, pinned, for NETCONF; a password
where the protocol logs in). The commands and their answers are the same for all.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from labctl.ocs.switches import switch_drivers

PW = "cli-Secret-41c7"
LABCTL = [sys.executable, "-m", "labctl.cli"]
CASES = [
    pytest.param("polatis-tl1", "", id="tl1"),
    pytest.param("polatis-netconf", "", id="netconf"),
    pytest.param("polatis-scpi", "", id="scpi"),
    pytest.param("dicon-serial", "pty", id="serial-pty"),
    pytest.param("dicon-serial", "socket", id="serial-socket"),
    pytest.param("dicon-serial", "rfc2217", id="serial-rfc2217"),
]


def test_every_driver_with_a_standalone_emulator_is_here() -> None:
    served = {n for n in switch_drivers.names() if switch_drivers.get(n).emulator is not None}
    assert served == {p.values[0] for p in CASES}


def _switch_line(driver: str, transport: str, banner: list[str]) -> str:
    m = re.search(r"listening on 127\.0\.0\.1:(\d+)", banner[0])
    assert m, banner
    fields = [f"driver: {driver}", "size: 4x4", "timeout_s: 10"]
    if transport:
        url = {
            "pty": next(line.split()[-1] for line in banner if "reachable at /dev/" in line),
            "socket": f"socket://127.0.0.1:{m[1]}",
            "rfc2217": next(line.split()[-1] for line in banner if "rfc2217://" in line),
        }[transport]
        fields.append(f"url: {url}")
    else:
        fields += ["address: 127.0.0.1", f"port: {m[1]}"]
    if switch_drivers.get(driver).emulator.password_env:  # type: ignore[union-attr]
        fields += ["user: admin", 'password: "${POLATIS_PASSWORD}"']
    key = next((line.split()[2] for line in banner if line.strip().startswith("host key")), None)
    if key:
        fields += ["host_key: pinned", f"host_key_sha256: {key}"]
    return "{" + ", ".join(fields) + "}"


@pytest.mark.parametrize(("driver", "transport"), CASES)
def test_labctl_ocs_against_the_protocol_emulator(driver: str, transport: str, tmp_path: Path) -> None:
    env = {**os.environ, "POLATIS_PASSWORD": PW}
    # by protocol name, as a lab engineer who knows the protocol but not labctl's driver names would
    chosen = ["--protocol", driver.rsplit("-", 1)[-1]]
    emu = subprocess.Popen(
        [*LABCTL, "emulate", "ocs", *chosen, "--port", "0", "--size", "4x4", "--switching-ms", "1"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert emu.stdout is not None
        banner = [emu.stdout.readline()]
        # the lines that say how to reach it (endpoints, host key) follow the listening line
        extra = {"dicon-serial": 3, "polatis-netconf": 1}.get(driver, 0)
        banner += [emu.stdout.readline() for _ in range(extra)]
        inventory = tmp_path / "inv.yaml"
        inventory.write_text(
            "lab: cli\nswitches:\n  ocs1: "
            + _switch_line(driver, transport, banner)
            + "\nhosts:\n  a:\n    nics:\n      - {ifname: eth0, rail: 0, switch: ocs1, tx: 1, rx: 5}\n"
        )

        def run(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [*LABCTL, "ocs", *args, "-i", str(inventory)],
                env=env,
                capture_output=True,
                text=True,
                timeout=90,
                check=False,
            )

        connected = run("connect", "1", "5", "--json")
        assert connected.returncode == 0, connected.stderr
        assert json.loads(connected.stdout)["patches"] == [[1, 5]]
        mapping = tmp_path / "map.yaml"
        mapping.write_text("patches: [[1, 6], [2, 5]]\n")
        applied = run("apply", str(mapping))
        assert applied.returncode == 0, applied.stderr
        assert "2 added" in applied.stdout and "verified" in applied.stdout
        shown = run("show", "--json")
        assert json.loads(shown.stdout)["patches"] == [[1, 6], [2, 5]]
        gone = run("disconnect", "5", "6", "--json")
        assert json.loads(gone.stdout)["patches"] == []
        bad = run("connect", "1", "2")
        assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "not an egress port" in bad.stderr
        for result in (connected, applied, shown, gone, bad):
            assert "Traceback" not in result.stderr and PW not in result.stdout + result.stderr
    finally:
        emu.terminate()
        emu.wait(10)
        if emu.stdout is not None:
            emu.stdout.close()
    assert emu.returncode == 0


def test_an_unknown_protocol_is_one_line_naming_the_known_ones() -> None:
    proc = subprocess.run(
        [*LABCTL, "emulate", "ocs", "--protocol", "openflow"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "no emulator speaks it (protocols: netconf, scpi, serial, tl1)" in proc.stderr
