"""The ethtool-netlink link-settings GET side against this machine's kernel, read-only, with ethtool(8) as
an independent peer.

A veth pair in a throwaway namespace: LINKINFO and LINKMODES answer (veth reports 10000 Mb/s full duplex,
autoneg off, no link modes); FEC and PRIVFLAGS answer EOPNOTSUPP; every SET is refused with EOPNOTSUPP,
which NetlinkLinkControl turns into one line. The only SETs sent go to that veth and are refused by the
kernel before any driver code runs. The host's eth0, where it answers LINKMODES_GET, is only read (never
set). No real NIC with link modes, FEC or private flags exists here: the success paths of SET are covered
by tests/unit/test_ethtool_link_control.py's scripted kernel only.
"""

from __future__ import annotations

import asyncio
import errno
import os
import re
import shutil
import socket
import subprocess

import pytest

from labctl.core.errors import InputError
from labctl.linux import ethtool_msgs as m
from labctl.linux.ethtool_link import EthtoolLink
from labctl.linux.netlink import NetlinkError
from labctl.nic.netlink import NetlinkLinkControl
from labctl.nic.settings import LinkSettings, LinkSettingUnsupported, LinkSupport, PortRef
from tests.conftest import require
from tests.emulated.conftest import NetnsFactory, ip

pytestmark = pytest.mark.emulated

PORT_NAMES = {0x00: "Twisted Pair", 0x03: "FIBRE", 0x05: "Direct Attach Copper", 0xEF: "None", 0xFF: "Other"}
XCVR_NAMES = {0x00: "internal", 0x01: "external"}


def ethtool(ifname: str, netns: str | None = None, *args: str) -> str:
    """`ethtool [args] IF` (read-only options only), inside `netns` when given."""
    require(shutil.which("ethtool") is not None, "needs ethtool(8)")
    cmd = ["ethtool", *args, ifname]
    if netns is not None:
        cmd = ["ip", "netns", "exec", netns, *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, check=False).stdout


def field(text: str, name: str) -> str | None:
    found = re.search(rf"^\s*{re.escape(name)}:\s*(.*?)\s*$", text, re.MULTILINE)
    return found.group(1) if found else None


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def veth(netns: NetnsFactory) -> str:
    name = netns("ethl")
    ip("-n", name, "link", "add", "va", "type", "veth", "peer", "name", "vb")
    ip("-n", name, "link", "set", "va", "up")
    return name


def test_veth_reads_as_ethtool_reports_it(veth: str) -> None:
    text = ethtool("va", veth)
    for compact in (True, False):
        with EthtoolLink(veth, compact=compact) as link:
            info = link.linkinfo("va")
            modes = link.linkmodes("va")
            for get in (link.fec, link.privflags):
                with pytest.raises(NetlinkError) as exc:
                    get("va")
                assert exc.value.errno == errno.EOPNOTSUPP
        assert f"{modes.speed_mbps}Mb/s" == field(text, "Speed") == "10000Mb/s"
        assert (modes.duplex or "").capitalize() == field(text, "Duplex") == "Full"
        assert ("on" if modes.autoneg else "off") == field(text, "Auto-negotiation") == "off"
        assert modes.ours is not None and modes.ours.value == modes.ours.mask == frozenset()
        assert field(text, "Supported link modes") == field(text, "Advertised link modes") == "Not reported"
        assert info.port is not None and PORT_NAMES.get(info.port) == field(text, "Port")
        assert str(info.phyaddr) == field(text, "PHYAD")
        assert info.transceiver is not None and XCVR_NAMES.get(info.transceiver) == field(text, "Transceiver")


def test_the_kernels_link_mode_names_put_fec_where_the_codec_does(veth: str) -> None:
    with EthtoolLink(veth) as link:
        names = link.link_mode_names("va")
    assert {names[bit] for bit in m.FEC_BITS.values()} == {"None", "RS", "BASER", "LLRS"}
    assert names[m.ETHTOOL_LINK_MODE_AUTONEG_BIT] == "Autoneg"
    assert names[0] == "10baseT/Half" and all(m.is_link_mode(names[i]) for i in (0, 5, 38))


def test_link_control_on_a_veth(veth: str) -> None:
    ctl = NetlinkLinkControl(veth)
    port = PortRef(socket.gethostname(), "va")
    before = open_fds()
    support = asyncio.run(ctl.support(port))
    assert support == LinkSupport(autoneg=False, note="veth has no link modes, FEC or private flags to set")
    held = asyncio.run(ctl.read(port))
    assert held == LinkSettings(autoneg=False, speed_mbps=10000, duplex="full", link_modes=(), fec=None)
    for settings in (
        LinkSettings(autoneg=False, speed_mbps=1000, duplex="full"),
        LinkSettings(fec="rs"),
        LinkSettings(priv_flags=(("x", True),)),
    ):
        assert support.refusal(settings) == support.note
        with pytest.raises(LinkSettingUnsupported) as exc:
            asyncio.run(ctl.apply(port, settings))
        assert str(exc.value) == f"{port.label}: cannot set {settings.label}: Operation not supported"
    assert asyncio.run(ctl.read(port)) == held  # nothing changed
    assert open_fds() == before  # each call's socket closed


def test_a_missing_interface_is_one_line_with_the_kernels_message(veth: str) -> None:
    with EthtoolLink(veth) as link, pytest.raises(NetlinkError) as exc:
        link.linkmodes("nope")
    assert exc.value.errno == errno.ENODEV and exc.value.kernel_message == "no device matches name"
    with pytest.raises(InputError) as exc2:
        asyncio.run(NetlinkLinkControl(veth).read(PortRef("h1", "nope")))
    assert str(exc2.value) == f"h1/nope: no such interface (netns {veth})"


def test_the_hosts_eth0_read_only() -> None:
    """Read eth0 where this machine has one that answers LINKMODES_GET; never set it."""
    require(os.path.exists("/sys/class/net/eth0"), "no eth0 here")
    try:
        with EthtoolLink() as link:
            modes = link.linkmodes("eth0")
    except NetlinkError as e:
        pytest.skip(f"eth0 does not answer LINKMODES_GET: {e}")
    text = ethtool("eth0")
    speed = field(text, "Speed")
    assert speed == (f"{modes.speed_mbps}Mb/s" if modes.speed_mbps is not None else "Unknown!")
    duplex = field(text, "Duplex") or ""
    assert duplex.startswith(modes.duplex.capitalize() if modes.duplex else "Unknown")
    assert ("on" if modes.autoneg else "off") == field(text, "Auto-negotiation")
    held = asyncio.run(NetlinkLinkControl().read(PortRef(socket.gethostname(), "eth0")))
    assert (held.autoneg, held.speed_mbps, held.duplex) == (modes.autoneg, modes.speed_mbps, modes.duplex)
    advertised = field(text, "Advertised link modes")
    if advertised == "Not reported":
        assert held.link_modes == ()
    else:
        assert held.link_modes and held.link_modes[0] in (advertised or "")


def test_a_port_carrying_the_management_path_is_refused_in_one_line(veth: str) -> None:
    """A real host's agent never changes the link settings of the interface its default route, or its
    route to the broker, leaves through (read from the namespace's routing table over rtnetlink): support
    says so in its note, apply refuses without sending anything. Another port of the host is not refused
    for it."""
    from labctl.nic.netlink import management_ports

    ip("-n", veth, "link", "add", "vc", "type", "veth", "peer", "name", "vd")
    ip("-n", veth, "link", "set", "vc", "up")
    ip("-n", veth, "addr", "add", "10.99.0.1/24", "dev", "va")
    ip("-n", veth, "addr", "add", "10.98.0.1/24", "dev", "vc")
    ip("-n", veth, "route", "add", "default", "via", "10.99.0.2", "dev", "va")
    assert management_ports(veth) == {"va": "the default route"}
    assert management_ports(veth, towards="10.98.0.7") == {
        "va": "the default route",
        "vc": "the route to the broker 10.98.0.7",
    }
    ctl = NetlinkLinkControl(veth)
    host = socket.gethostname()
    support = asyncio.run(ctl.support(PortRef(host, "va")))
    assert support.note == (
        "va carries the default route: labctl never changes its link settings (the host would be cut off)"
    )
    assert support.refusal(LinkSettings(autoneg=True)) == support.note
    with pytest.raises(LinkSettingUnsupported) as exc:
        asyncio.run(ctl.apply(PortRef(host, "va"), LinkSettings(autoneg=False)))
    assert str(exc.value) == f"{host}/va: cannot set autoneg=off: {support.note}"
    assert "\n" not in str(exc.value)
    assert asyncio.run(ctl.support(PortRef(host, "vc"))).note == (
        "veth has no link modes, FEC or private flags to set"
    )
    broker_side = NetlinkLinkControl(veth, management=lambda: management_ports(veth, towards="10.98.0.7"))
    assert "the route to the broker 10.98.0.7" in (
        asyncio.run(broker_side.support(PortRef(host, "vc"))).note or ""
    )
