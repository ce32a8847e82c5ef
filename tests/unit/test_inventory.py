"""Inventory validation: every mistake is one line naming file:line and the field, exit code 2 from the CLI."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from labctl.cli import main
from labctl.core.errors import InputError
from labctl.inventory.config import NetworkSwitchConfig
from labctl.inventory.schema import load_inventory
from labctl.ocs.switches import switch_drivers
from tests.helpers.inventory import GOOD, write


def test_default_inventory_is_the_opus_testbed(inventory_path: Path) -> None:
    inv = load_inventory(inventory_path)
    assert inv.hosts == ["h1", "h2", "h3", "h4"]
    assert inv.rails == [0, 1]
    assert inv.switches["ocs1"].space.n_ingress == 32
    assert len(inv.ports) == 16  # 4 hosts x 2 NICs x 2 ports
    for rail in (0, 1):
        by_host = inv.rail_ports(rail)
        assert all(len(ports) == 2 for ports in by_host.values())
        assert all(p.gpu == rail for ports in by_host.values() for p in ports)
    assert all(1 <= p.tx <= 32 and 33 <= p.rx <= 64 for p in inv.ports)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            GOOD.replace("lab: tiny", "lab: [unclosed"), "inventory.yaml:2: invalid YAML", id="bad-yaml"
        ),
        pytest.param(
            GOOD.replace("lab: tiny\n", ""),
            "inventory.yaml:1: lab: required field is missing",
            id="missing-field",
        ),
        pytest.param(
            GOOD.replace("rx: 5}", "rx: 5, colour: red}"),
            "inventory.yaml:7: hosts.a.nics[0].colour: unknown field",
            id="unknown-field",
        ),
        pytest.param(
            GOOD.replace("switch: ocs1, tx: 2", "switch: ocs9, tx: 2"),
            "inventory.yaml:10: hosts.b.nics[0].switch: unknown switch 'ocs9' (known: ocs1)",
            id="unknown-switch",
        ),
        pytest.param(
            GOOD.replace("tx: 2, rx: 6", "tx: 2, rx: 9"),
            "inventory.yaml:10: hosts.b.nics[0].rx: port 9 is out of range 1..8 of ocs1 (4x4)",
            id="port-out-of-range",
        ),
        pytest.param(
            GOOD.replace("tx: 2, rx: 6", "tx: 1, rx: 6"),
            "inventory.yaml:10: hosts.b.nics[0].tx: ocs1 port 1 is used twice (also at hosts.a.nics[0].tx)",
            id="port-used-twice",
        ),
        pytest.param(
            GOOD.replace("tx: 2, rx: 6", "tx: 6, rx: 2"),
            "inventory.yaml:10: hosts.b.nics[0].tx: port 6 is an egress port of ocs1",
            id="tx-on-egress",
        ),
        pytest.param(
            GOOD.replace("size: 4x4", "size: four"), "inventory.yaml:3: switches.ocs1.size:", id="bad-size"
        ),
        pytest.param(
            GOOD.replace("size: 4x4", "size: 0x10"),
            "inventory.yaml:3: switches.ocs1.size: 16 is a number here; write the port space as INxOUT",
            id="size-read-as-hex",
        ),
        pytest.param(
            GOOD.replace(
                "{driver: sim, size: 4x4}",
                "{driver: polatis-tl1, emulate: true, size: 4x4, password: hunter2}",
            ),
            "switches.ocs1.password: secrets must be written as an environment reference",
            id="literal-secret",
        ),
        pytest.param(
            GOOD.replace("{driver: sim, size: 4x4}", "{driver: sim, size: 4x4, address: 10.0.0.1}"),
            "inventory.yaml:3: switches.ocs1.address: unknown field",  # each driver's own config model
            id="field-of-another-driver",
        ),
        pytest.param(
            GOOD.replace("{driver: sim, size: 4x4}", "{driver: sim, size: 4x4, owned_ports: [1-2, 5-6, 9]}"),
            "inventory.yaml:3: switches.ocs1: owned_ports: [9] are not ports of a 4x4 switch",
            id="owned-port-outside-the-switch",
        ),
        pytest.param(
            GOOD.replace("{driver: sim, size: 4x4}", "{driver: sim, size: 4x4, owned_ports: [1, 5, 6]}"),
            "is not among its owned_ports",  # a NIC fiber on a port of another lab
            id="fiber-on-a-foreign-port",
        ),
        pytest.param(
            GOOD.replace("{driver: sim, size: 4x4}", "{driver: calient-tl1, size: 4x4}"),
            "inventory.yaml:3: switches.ocs1.driver: unknown driver 'calient-tl1' (known: "
            + ", ".join(switch_drivers.names())
            + ")",
            id="unregistered-driver",
        ),
        pytest.param(GOOD + "profile: nope\n", "profile: unknown profile 'nope'", id="unknown-profile"),
        pytest.param(
            GOOD.replace("lab: tiny", "lab: tiny\nlab: again"),
            "inventory.yaml:2: invalid YAML: duplicate key 'lab'",
            id="duplicate-key",
        ),
    ],
)
def test_bad_inventory_is_one_line_naming_the_field(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(InputError) as info:
        load_inventory(path)
    message = str(info.value)
    assert "\n" not in message
    assert expected in message, message


def test_cli_inventory_check_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sys_argv = sys.argv
    sys.argv = ["labctl", "inventory", "check", str(tmp_path / "nope.yaml")]
    try:
        with pytest.raises(SystemExit) as info:
            main()
    finally:
        sys.argv = sys_argv
    assert info.value.code == 2
    assert "nope.yaml: inventory not found" in capsys.readouterr().err


def test_cli_inventory_check_ok(inventory_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sys_argv = sys.argv
    sys.argv = ["labctl", "inventory", "check", str(inventory_path)]
    try:
        main()  # returns normally: exit code 0
    finally:
        sys.argv = sys_argv
    assert "16 NIC ports on rails [0, 1]" in capsys.readouterr().out


def test_secret_resolves_from_environment_and_never_prints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = GOOD.replace(
        "{driver: sim, size: 4x4}",
        '{driver: polatis-tl1, emulate: true, size: 4x4, user: admin, password: "${OCS_PW}"}',
    )
    inv = load_inventory(write(tmp_path, text))
    spec = inv.switches["ocs1"]
    assert isinstance(spec, NetworkSwitchConfig)
    ref = spec.password
    assert ref is not None
    with pytest.raises(InputError, match="environment variable OCS_PW is not set"):
        ref.resolve("ocs1")
    monkeypatch.setenv("OCS_PW", "s3cret-value")
    secret = ref.resolve("ocs1")
    assert secret.reveal() == "s3cret-value"
    assert "s3cret-value" not in repr(secret) and "s3cret-value" not in str(secret)
    assert "s3cret-value" not in str(inv.snapshot())
    assert inv.snapshot()["switches"]["ocs1"]["password"] == "${OCS_PW}"


def test_a_typod_key_is_reported_before_the_field_it_leaves_missing(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        GOOD.replace(
            "{ifname: eth0, rail: 0, switch: ocs1, tx: 1", "{ifnam: eth0, rail: 0, switch: ocs1, tx: 1"
        ),
    )
    with pytest.raises(InputError) as err:
        load_inventory(path)
    assert str(err.value) == f"{path}:7: hosts.a.nics[0].ifnam: unknown field (and 1 more error)"


def test_a_switch_only_inventory_is_valid_for_driving_switches(tmp_path: Path) -> None:
    """`labctl ocs` needs switches only: a bench with an OCS and no hosts must not be told to list any."""
    path = write(
        tmp_path, "lab: bench\nswitches:\n  ocs1: {driver: polatis-tl1, address: 192.0.2.7, user: admin}\n"
    )
    inv = load_inventory(path)
    assert inv.hosts == [] and inv.ports == [] and list(inv.switches) == ["ocs1"]
