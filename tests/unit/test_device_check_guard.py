"""The read-only switch bench/device_check.py turns on first thing (labctl.linux.readonly): with it on,
every SET path raises before a byte is sent; with it off, the same calls send their request."""

from __future__ import annotations

import asyncio

import pytest

from labctl.linux import readonly
from labctl.linux.ethtool_link import EthtoolLink
from labctl.linux.netns import write_sysctl
from labctl.linux.readonly import WritesForbidden, check_write, read_only
from labctl.linux.rtnl import Rtnl
from labctl.nic.netlink import NetlinkLinkControl
from labctl.nic.settings import LinkSettings, PortRef

FAMILY = 0x1C


class RecordingNetlink:
    """A GenericNetlink stand-in: records every request and answers each with an ACK (empty payload)."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.closed = False

    def resolve_family(self, name: str) -> int:
        return FAMILY

    def request(self, msg: bytearray) -> memoryview:
        self.sent.append(bytes(msg))
        return memoryview(b"")

    def close(self) -> None:
        self.closed = True


class RecordingSocket:
    """A NETLINK_ROUTE socket stand-in: records what is sent, answers each request with an ACK."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self._seq = 0

    def settimeout(self, timeout: float | None) -> None:
        pass

    def send(self, data: bytes) -> int:
        self.sent.append(bytes(data))
        self._seq = int.from_bytes(data[8:12], "little")
        return len(data)

    def recv(self, size: int) -> bytes:
        # NLMSG_ERROR (type 2) with code 0: the ACK of the request just sent
        body = (0).to_bytes(4, "little") + bytes(16)
        header = (16 + len(body)).to_bytes(4, "little") + (2).to_bytes(2, "little") + bytes(2)
        return header + self._seq.to_bytes(4, "little") + bytes(4) + body

    def close(self) -> None:
        pass


def _sets(link: EthtoolLink) -> list[tuple[str, object]]:
    return [
        ("LINKMODES_SET", lambda: link.set_linkmodes("eth0", autoneg=False, speed_mbps=100_000)),
        ("FEC_SET", lambda: link.set_fec("eth0", "rs")),
        ("PRIVFLAGS_SET", lambda: link.set_privflags("eth0", [("rx_cqe_compress", True)])),
    ]


@pytest.mark.parametrize("which", ["LINKMODES_SET", "FEC_SET", "PRIVFLAGS_SET"])
def test_each_ethtool_set_raises_and_sends_nothing(which: str) -> None:
    nl = RecordingNetlink()
    link = EthtoolLink(nl=nl)  # type: ignore[arg-type]
    call = dict(_sets(link))[which]
    with read_only(), pytest.raises(WritesForbidden, match=which):
        call()  # type: ignore[operator]
    assert nl.sent == []


def test_without_the_switch_each_ethtool_set_is_sent() -> None:
    nl = RecordingNetlink()
    link = EthtoolLink(nl=nl)  # type: ignore[arg-type]
    assert not readonly.writes_forbidden()
    for _, call in _sets(link):
        call()  # type: ignore[operator]
    assert len(nl.sent) == 3


def test_link_up_and_down_raise_and_send_nothing() -> None:
    sock = RecordingSocket()
    rtnl = Rtnl(sock)  # type: ignore[arg-type]
    with read_only():
        for up in (False, True):
            with pytest.raises(WritesForbidden, match="rtnetlink request 16"):
                rtnl.set_up(7, up)
        with pytest.raises(WritesForbidden):
            rtnl.add_ingress_qdisc(7)
    assert sock.sent == []
    rtnl.set_up(7, True)  # the switch restored: the request goes out
    assert len(sock.sent) == 1


def test_a_link_control_apply_is_refused_before_the_kernel_sees_it() -> None:
    nl = RecordingNetlink()
    control = NetlinkLinkControl(open_link=lambda: EthtoolLink(nl=nl), management=lambda: {})  # type: ignore[arg-type]
    with read_only(), pytest.raises(WritesForbidden, match="FEC_SET"):
        asyncio.run(control.apply(PortRef("h1", "eth0"), LinkSettings(fec="rs")))
    assert nl.sent == []


def test_a_sysctl_write_is_refused() -> None:
    with read_only(), pytest.raises(WritesForbidden, match="sysctl net/ipv4/ip_forward"):
        write_sysctl(None, "net/ipv4/ip_forward", "1")


def test_reads_still_go_out() -> None:
    nl = RecordingNetlink()
    link = EthtoolLink(nl=nl)  # type: ignore[arg-type]
    with read_only():
        fec = link.fec("eth0")  # FEC_GET: the recording kernel answers an empty reply
    assert len(nl.sent) == 1 and fec.modes is None and not fec.auto


def test_forbid_writes_is_for_the_rest_of_the_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(readonly, "_forbidden", False)  # restored after the test
    readonly.forbid_writes()
    assert readonly.writes_forbidden()
    with pytest.raises(WritesForbidden, match="read-only: refused to do it"):
        check_write("do it")
