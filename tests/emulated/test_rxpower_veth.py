"""The real netlink module-EEPROM read against a kernel device without a module: a veth in a namespace.

This exercises our raw generic-netlink encoding end to end (family lookup, attribute layout, error and
extended-ack parsing) and the exact "no module EEPROM on IF" error. No live module exists here, so the
success path of a read is covered by the decoder tests and the emulated module only.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator

import pytest

from labctl.core.errors import InputError
from labctl.linux.ethtool import (
    ETHTOOL_A_MODULE_EEPROM_I2C_ADDRESS,
    ETHTOOL_A_MODULE_EEPROM_LENGTH,
    ETHTOOL_A_MODULE_EEPROM_OFFSET,
    ETHTOOL_A_MODULE_EEPROM_PAGE,
    ETHTOOL_GENL_VERSION,
    ETHTOOL_MSG_MODULE_EEPROM_GET,
    NetlinkModuleEeprom,
    NoModuleEepromError,
    NoSuchInterfaceError,
    open_module_eeprom,
    read_module,
)
from labctl.linux.genl import GenericNetlink
from labctl.linux.netlink import NetlinkError
from labctl.linux.netlink import attr as _attr
from labctl.probes.rxpower import RxPowerProbe
from labctl.probes.rxpower_ports import ModulePort
from tests.conftest import require

pytestmark = pytest.mark.emulated


@pytest.fixture
def veth_ns() -> Iterator[str]:
    """A namespace `lt<pid>-dom` holding veth pair va/vb, both up; deleted afterwards."""
    require(sys.platform == "linux", "needs Linux")
    require(os.geteuid() == 0, "needs root for network namespaces")
    require(shutil.which("ip") is not None, "needs iproute2 (ip)")
    name = f"lt{os.getpid()}-dom"
    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
    try:
        for cmd in (
            ["link", "add", "va", "type", "veth", "peer", "name", "vb"],
            ["link", "set", "va", "up"],
            ["link", "set", "vb", "up"],
        ):
            subprocess.run(["ip", "-n", name, *cmd], check=True, capture_output=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)


def test_veth_has_no_module_eeprom(veth_ns: str) -> None:
    with pytest.raises(NoModuleEepromError) as exc:
        open_module_eeprom("vb", veth_ns)
    assert str(exc.value) == f"no module EEPROM on vb (netns {veth_ns})"
    with pytest.raises(NoModuleEepromError) as exc:
        read_module("va", veth_ns)
    assert str(exc.value) == f"no module EEPROM on va (netns {veth_ns})"


def test_without_netns_the_message_names_only_the_interface() -> None:
    require(sys.platform == "linux" and os.geteuid() == 0, "needs Linux and root")
    with pytest.raises(NoModuleEepromError) as exc:
        open_module_eeprom("lo")  # the host's loopback: always there, never a module
    assert str(exc.value) == "no module EEPROM on lo"


def test_kernel_parses_our_request(veth_ns: str) -> None:
    nl = NetlinkModuleEeprom("vb", veth_ns)
    try:
        assert nl.family > 0x10  # a dynamically assigned genl family id
        # A well-formed request reaches the device op: EOPNOTSUPP (a veth has no module).
        with pytest.raises(NetlinkError) as exc:
            nl.read_raw(0x50, 0, 0, 34, 8)
        assert exc.value.errno == errno.EOPNOTSUPP
        # The same request with LENGTH out of the kernel's policy (1..128) is refused by attribute
        # validation before the device is asked (ERANGE plus an extended-ack message), so the kernel did
        # parse our attributes.
        attrs = b"".join(
            (
                nl._header,
                _attr(ETHTOOL_A_MODULE_EEPROM_OFFSET, (0).to_bytes(4, sys.byteorder)),
                _attr(ETHTOOL_A_MODULE_EEPROM_LENGTH, (200).to_bytes(4, sys.byteorder)),
                _attr(ETHTOOL_A_MODULE_EEPROM_PAGE, b"\x00"),
                _attr(ETHTOOL_A_MODULE_EEPROM_I2C_ADDRESS, b"\x50"),
            )
        )
        msg = GenericNetlink.message(nl.family, ETHTOOL_MSG_MODULE_EEPROM_GET, ETHTOOL_GENL_VERSION, attrs)
        with pytest.raises(NetlinkError) as exc:
            nl.nl.request(msg)
        assert exc.value.errno == errno.ERANGE
        assert exc.value.kernel_message  # e.g. "integer out of range"
        # Our own limits stop an out-of-range request before it is sent.
        with pytest.raises(ValueError, match="half-page"):
            nl.read_raw(0x50, 0, 0, 120, 16)
    finally:
        nl.close()


def test_missing_interface_and_namespace(veth_ns: str) -> None:
    with pytest.raises(NoSuchInterfaceError, match=f"no interface nope0 \\(netns {veth_ns}\\)"):
        open_module_eeprom("nope0", veth_ns)
    with pytest.raises(InputError, match="network namespace 'lt-absent-x' does not exist"):
        open_module_eeprom("vb", "lt-absent-x")


def test_cli_read_on_veth_is_one_line(veth_ns: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "labctl.cli", "dom", "read", "vb", "--netns", veth_ns],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 1
    assert out.stderr == f"error: no module EEPROM on vb (netns {veth_ns})\n"
    assert out.stdout == ""


async def test_probe_on_veth_reports_the_missing_module_and_leaks_nothing(veth_ns: str) -> None:
    """A port without a module is not sampled: one sampler.error with the exact reason, nothing left open."""
    probe = RxPowerProbe([ModulePort.of_interface("h1", "vb", netns=veth_ns)], hz=1000)
    assert [p.source for p in probe.ports] == ["nic:h1/vb"]
    async with probe:
        events = [e async for e in probe.events()]  # ends: nothing to sample
    assert [(e.kind, e.source, e.value) for e in events] == [
        ("sampler.error", "nic:h1/vb", f"no module EEPROM on vb (netns {veth_ns})")
    ]
    assert probe.polled == []  # nothing left open
    assert probe.unsampled == {"nic:h1/vb": f"no module EEPROM on vb (netns {veth_ns})"}
