"""NetlinkLinkControl (labctl.nic.netlink) end to end over a scripted kernel: the real EthtoolLink driver and
GenericNetlink transport, on a socket object that answers as the kernel's ethtool family does.

The scripted kernel models one NIC port (mlx5-like: 25G/100G modes, autoneg, FEC none/RS/BASER, three
private flags). It reads every SET with pyroute2's decoders (the codec's own are not used to judge it),
changes its state as the kernel would, and answers an ACK, or an NLMSG_ERROR carrying an extack message
(NLMSGERR_ATTR_MSG) where a real driver refuses. Replies are laid out by tests/unit/test_ethtool_link_codec's
kernel_bitset (ethnl_put_bitset32's order), compact or verbose as the request's header flags ask.
"""

from __future__ import annotations

import asyncio
import errno
import struct
from collections.abc import Callable
from typing import Any

import pytest
from pyroute2.netlink.generic.ethtool import ethtool_linkmode_msg, ethtool_strset_msg

from labctl.core.errors import HardwareError, InputError
from labctl.linux import ethtool_msgs as m
from labctl.linux.ethtool_link import EthtoolLink
from labctl.linux.genl import CTRL_ATTR_FAMILY_ID, GENL_ID_CTRL, GENLMSGHDR, GenericNetlink
from labctl.linux.netlink import NLM_F_ACK, NLMSG_ERROR, NLMSGERR_ATTR_MSG, NLMSGHDR, attr, cstr, u32
from labctl.nic.netlink import NetlinkLinkControl
from labctl.nic.settings import (
    LinkControl,
    LinkSettingMismatch,
    LinkSettings,
    LinkSettingUnsupported,
    LinkSupport,
    PortRef,
)
from tests.unit.test_ethtool_link_codec import (
    LINK_MODE_NAMES,
    NBITS,
    decoded,
    fec_msg,
    kernel_bitset,
    nest,
    privflags_msg,
    reply_header,
)

FAMILY = 0x1D
PORT = PortRef("h1", "eth2")
NLM_F_CAPPED, NLM_F_ACK_TLVS = 0x100, 0x200
FLAG_NAMES = ["rx_cqe_moder", "tx_cqe_moder", "rx_cqe_compress"]
REPLY_CMD = {
    m.ETHTOOL_MSG_STRSET_GET: m.ETHTOOL_MSG_STRSET_GET_REPLY,
    m.ETHTOOL_MSG_LINKINFO_GET: m.ETHTOOL_MSG_LINKINFO_GET_REPLY,
    m.ETHTOOL_MSG_LINKMODES_GET: m.ETHTOOL_MSG_LINKMODES_GET_REPLY,
    m.ETHTOOL_MSG_FEC_GET: m.ETHTOOL_MSG_FEC_GET_REPLY,
    m.ETHTOOL_MSG_PRIVFLAGS_GET: m.ETHTOOL_MSG_PRIVFLAGS_GET_REPLY,
}


class Refused(Exception):
    def __init__(self, code: int, extack: str | None = None) -> None:
        self.code, self.extack = code, extack


class ScriptedKernel:
    """The socket GenericNetlink talks to: one device `eth2`, its state, and what was sent."""

    def __init__(self, *, veth: bool = False) -> None:
        self.veth = veth
        self.autoneg = not veth
        self.speed, self.duplex = (10000, 1) if veth else (100000, 1)
        self.supported = set() if veth else {6, 13, 31, 37, 38, 49, 50, 51}
        self.advertised = set() if veth else {6, 13, 38}
        self.fec, self.fec_auto = {50}, 0
        self.flags = {0: True, 1: False, 2: True}
        self.ignore_fec = False  # a driver that ACKs and changes nothing
        self.sent: list[int] = []  # genl commands, in order
        self._queue: list[bytes] = []

    # -- the socket interface GenericNetlink uses --------------------------------------------------------

    def setsockopt(self, *args: object) -> None:
        pass

    def settimeout(self, timeout: float) -> None:
        pass

    def bind(self, address: object) -> None:
        pass

    def close(self) -> None:
        pass

    def send(self, msg: bytes | bytearray) -> int:
        length, kind, flags, seq, _ = NLMSGHDR.unpack_from(msg)
        cmd = GENLMSGHDR.unpack_from(msg, NLMSGHDR.size)[0]
        if kind == GENL_ID_CTRL:
            self._reply(seq, GENL_ID_CTRL, 1, attr(CTRL_ATTR_FAMILY_ID, struct.pack("=H", FAMILY)))
            return len(msg)
        assert kind == FAMILY
        self.sent.append(cmd)
        try:
            body = self._answer(cmd, bytes(msg))
        except Refused as e:
            self._error(seq, bytes(msg[:length]), e.code, e.extack)
            return len(msg)
        if body is None:
            assert flags & NLM_F_ACK, "the kernel answers a successful SET only when asked (NLM_F_ACK)"
            self._error(seq, bytes(msg[:length]), 0, None)  # the ACK
        else:
            self._reply(seq, FAMILY, REPLY_CMD[cmd], body)
        return len(msg)

    def recv_into(self, buf: bytearray) -> int:
        data = self._queue.pop(0)
        buf[: len(data)] = data
        return len(data)

    def _reply(self, seq: int, kind: int, cmd: int, body: bytes) -> None:
        payload = GENLMSGHDR.pack(cmd, 1, 0) + body
        self._queue.append(NLMSGHDR.pack(NLMSGHDR.size + len(payload), kind, 0, seq, 0) + payload)

    def _error(self, seq: int, request: bytes, code: int, extack: str | None) -> None:
        body = struct.pack("=i", -code) + request[: NLMSGHDR.size]
        flags = NLM_F_CAPPED
        if extack is not None:
            body += attr(NLMSGERR_ATTR_MSG, cstr(extack))
            flags |= NLM_F_ACK_TLVS
        self._queue.append(NLMSGHDR.pack(NLMSGHDR.size + len(body), NLMSG_ERROR, flags, seq, 0) + body)

    # -- the ethtool family ----------------------------------------------------------------------------

    def _answer(self, cmd: int, msg: bytes) -> bytes | None:
        head = decoded(ethtool_linkmode_msg, msg).get_attr("ETHTOOL_A_LINKMODES_HEADER")  # attr 1 everywhere
        if head.get_attr("ETHTOOL_A_HEADER_DEV_NAME") != "eth2":
            raise Refused(errno.ENODEV, "no device matches name")
        compact = bool((head.get_attr("ETHTOOL_A_HEADER_FLAGS") or 0) & m.ETHTOOL_FLAG_COMPACT_BITSETS)
        names = None if compact else LINK_MODE_NAMES
        if cmd == m.ETHTOOL_MSG_STRSET_GET:
            return self._strset(msg)
        if cmd == m.ETHTOOL_MSG_LINKMODES_GET:
            ours = kernel_bitset(NBITS, self.advertised, self.supported, names, compact)
            return b"".join(
                (
                    reply_header(),
                    attr(m.ETHTOOL_A_LINKMODES_AUTONEG, bytes([int(self.autoneg)])),
                    nest(m.ETHTOOL_A_LINKMODES_OURS, ours),
                    attr(m.ETHTOOL_A_LINKMODES_SPEED, u32(self.speed)),
                    attr(m.ETHTOOL_A_LINKMODES_DUPLEX, bytes([self.duplex])),
                )
            )
        if self.veth and cmd != m.ETHTOOL_MSG_LINKINFO_GET:
            raise Refused(errno.EOPNOTSUPP)
        if cmd == m.ETHTOOL_MSG_FEC_GET:
            modes = nest(m.ETHTOOL_A_FEC_MODES, kernel_bitset(NBITS, self.fec, None, names, compact))
            return reply_header() + modes + attr(m.ETHTOOL_A_FEC_AUTO, bytes([self.fec_auto]))
        if cmd == m.ETHTOOL_MSG_PRIVFLAGS_GET:
            on = {i for i, v in self.flags.items() if v}
            flag_names = None if compact else dict(enumerate(FLAG_NAMES))
            bitset = kernel_bitset(len(FLAG_NAMES), on, set(self.flags), flag_names, compact)
            return reply_header() + nest(m.ETHTOOL_A_PRIVFLAGS_FLAGS, bitset)
        if cmd == m.ETHTOOL_MSG_LINKMODES_SET:
            self._set_linkmodes(decoded(ethtool_linkmode_msg, msg))
            return None
        if cmd == m.ETHTOOL_MSG_FEC_SET:
            self._set_fec(decoded(fec_msg, msg))
            return None
        if cmd == m.ETHTOOL_MSG_PRIVFLAGS_SET:
            self._set_privflags(decoded(privflags_msg, msg))
            return None
        raise Refused(errno.EOPNOTSUPP)

    def _strset(self, msg: bytes) -> bytes:
        p = decoded(ethtool_strset_msg, msg)
        (one,) = p.get_attr("ETHTOOL_A_STRSET_STRINGSETS").get_attrs("ETHTOOL_A_STRINGSETS_STRINGSET")
        set_id = one.get_attr("ETHTOOL_A_STRINGSET_ID")
        table = LINK_MODE_NAMES if set_id == m.ETH_SS_LINK_MODES else dict(enumerate(FLAG_NAMES))
        strings = b"".join(
            nest(1, attr(m.ETHTOOL_A_STRING_INDEX, u32(i)), attr(m.ETHTOOL_A_STRING_VALUE, cstr(s)))
            for i, s in sorted(table.items())
        )
        sset = nest(1, attr(1, u32(set_id)), attr(2, u32(len(table))), nest(3, strings))
        return reply_header() + nest(m.ETHTOOL_A_STRSET_STRINGSETS, sset)

    @staticmethod
    def _bits(bitset: Any, table: dict[int, str]) -> list[tuple[int, bool]]:
        index = {name: i for i, name in table.items()}
        out = []
        for bit in bitset.get_attr("ETHTOOL_A_BITSET_BITS").get_attrs("ETHTOOL_A_BITSET_BITS_BIT"):
            i = bit.get_attr("ETHTOOL_A_BITSET_BIT_INDEX")
            if i is None:
                name = bit.get_attr("ETHTOOL_A_BITSET_BIT_NAME")
                if name not in index:
                    raise Refused(errno.EINVAL, "bit name not found")
                i = index[name]
            out.append((i, bit.get_attr("ETHTOOL_A_BITSET_BIT_VALUE") is not None))
        return out

    def _set_linkmodes(self, p: Any) -> None:
        if (autoneg := p.get_attr("ETHTOOL_A_LINKMODES_AUTONEG")) is not None:
            self.autoneg = bool(autoneg)
        if (speed := p.get_attr("ETHTOOL_A_LINKMODES_SPEED")) is not None:
            if speed not in (25000, 100000):
                raise Refused(errno.EINVAL, "requested speed not supported")
            self.speed = speed
        if (ours := p.get_attr("ETHTOOL_A_LINKMODES_OURS")) is not None:
            for i, on in self._bits(ours, LINK_MODE_NAMES):
                (self.advertised.add if on else self.advertised.discard)(i)

    def _set_fec(self, p: Any) -> None:
        bits = {i for i, _ in self._bits(p.get_attr("ETHTOOL_A_FEC_MODES"), LINK_MODE_NAMES)}
        if not bits <= self.supported:
            raise Refused(errno.EINVAL, "invalid FEC modes requested")
        if not self.ignore_fec:
            self.fec, self.fec_auto = bits, p.get_attr("ETHTOOL_A_FEC_AUTO")

    def _set_privflags(self, p: Any) -> None:
        for i, on in self._bits(p.get_attr("ETHTOOL_A_PRIVFLAGS_FLAGS"), dict(enumerate(FLAG_NAMES))):
            self.flags[i] = on


class VethLink(EthtoolLink):
    def driver(self, ifname: str) -> str | None:
        return "veth"


def control(kernel: ScriptedKernel, *, compact: bool = True) -> NetlinkLinkControl:
    def open_link() -> EthtoolLink:
        cls = VethLink if kernel.veth else EthtoolLink
        return cls(compact=compact, nl=GenericNetlink(kernel, 1.0))  # type: ignore[arg-type]

    return NetlinkLinkControl(open_link=open_link, management=dict)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


SETS = {m.ETHTOOL_MSG_LINKMODES_SET, m.ETHTOOL_MSG_FEC_SET, m.ETHTOOL_MSG_PRIVFLAGS_SET}


def sets(kernel: ScriptedKernel) -> list[int]:
    return [c for c in kernel.sent if c in SETS]


# -- support and read ------------------------------------------------------------------------------------


def test_it_is_a_link_control() -> None:
    assert isinstance(control(ScriptedKernel()), LinkControl)


@pytest.mark.parametrize("compact", [True, False], ids=["compact", "verbose"])
def test_support_lists_link_modes_fec_and_private_flags(compact: bool) -> None:
    kernel = ScriptedKernel()
    support = run(control(kernel, compact=compact).support(PORT))
    assert support == LinkSupport(
        autoneg=True,
        link_modes=("25000baseCR/Full", "100000baseSR4/Full", "100000baseCR4/Full"),
        fec_modes=("off", "rs", "baser", "auto"),
        priv_flags=tuple(FLAG_NAMES),
    )
    assert sets(kernel) == []  # a probe changes nothing


@pytest.mark.parametrize("compact", [True, False], ids=["compact", "verbose"])
def test_read_returns_every_setting(compact: bool) -> None:
    kernel = ScriptedKernel()
    got = run(control(kernel, compact=compact).read(PORT))
    assert got == LinkSettings(
        autoneg=True,
        speed_mbps=100000,
        duplex="full",
        link_modes=("100000baseCR4/Full",),
        fec="rs",
        priv_flags=(("rx_cqe_compress", True), ("rx_cqe_moder", True), ("tx_cqe_moder", False)),
    )
    assert sets(kernel) == []
    if not compact:  # the verbose replies carry the names: no string set fetched
        assert m.ETHTOOL_MSG_STRSET_GET not in kernel.sent


def test_a_veth_has_nothing_to_set_in_one_line() -> None:
    kernel = ScriptedKernel(veth=True)
    ctl = control(kernel)
    support = run(ctl.support(PortRef("h1", "eth2")))
    assert support == LinkSupport(autoneg=False, note="veth has no link modes, FEC or private flags to set")
    assert support.refusal(LinkSettings(fec="rs")) == "veth has no link modes, FEC or private flags to set"
    got = run(ctl.read(PORT))
    assert got == LinkSettings(autoneg=False, speed_mbps=10000, duplex="full", link_modes=(), fec=None)
    with pytest.raises(LinkSettingUnsupported) as exc:
        run(ctl.apply(PORT, LinkSettings(autoneg=False, speed_mbps=1000)))
    assert str(exc.value) == "h1/eth2: cannot set autoneg=off,speed_mbps=1000: Operation not supported"


# -- apply -----------------------------------------------------------------------------------------------


def test_apply_sends_only_the_fields_set_and_reads_back() -> None:
    kernel = ScriptedKernel()
    ctl = control(kernel)
    got = run(ctl.apply(PORT, LinkSettings(fec="baser")))
    assert sets(kernel) == [m.ETHTOOL_MSG_FEC_SET]
    assert got.fec == "baser" and got.link_modes == ("100000baseCR4/Full",) and got.autoneg is True
    kernel.sent.clear()
    got = run(ctl.apply(PORT, LinkSettings(priv_flags=(("tx_cqe_moder", True),))))
    assert sets(kernel) == [m.ETHTOOL_MSG_PRIVFLAGS_SET]
    assert dict(got.priv_flags) == {"rx_cqe_moder": True, "tx_cqe_moder": True, "rx_cqe_compress": True}
    kernel.sent.clear()
    got = run(ctl.apply(PORT, LinkSettings(fec="auto")))
    assert got.fec == "auto" and kernel.fec == set() and kernel.fec_auto == 1


def test_apply_link_modes_in_any_order_leaves_pause_and_autoneg_bits_alone() -> None:
    kernel = ScriptedKernel()
    asked = LinkSettings(autoneg=True, link_modes=("100000baseCR4/Full", "25000baseCR/Full"))
    got = run(control(kernel).apply(PORT, asked))
    assert sets(kernel) == [m.ETHTOOL_MSG_LINKMODES_SET]
    # LinkSettings keeps link modes sorted: asked in any order, read in the kernel's bit order, they compare equal
    assert got.link_modes == ("100000baseCR4/Full", "25000baseCR/Full")
    assert asked.differences(got) == []
    assert kernel.advertised == {6, 13, 31, 38}


def test_apply_all_at_once_sends_each_set_once() -> None:
    kernel = ScriptedKernel()
    asked = LinkSettings(
        autoneg=False, speed_mbps=25000, duplex="full", fec="off", priv_flags=(("rx_cqe_moder", False),)
    )
    got = run(control(kernel).apply(PORT, asked))
    assert sets(kernel) == [m.ETHTOOL_MSG_LINKMODES_SET, m.ETHTOOL_MSG_FEC_SET, m.ETHTOOL_MSG_PRIVFLAGS_SET]
    assert asked.differences(got) == []


def test_a_read_back_that_differs_is_a_mismatch() -> None:
    kernel = ScriptedKernel()
    kernel.ignore_fec = True
    with pytest.raises(LinkSettingMismatch) as exc:
        run(control(kernel).apply(PORT, LinkSettings(fec="baser")))
    assert str(exc.value) == "h1/eth2: read back after setting: fec: asked 'baser', read 'rs'"


@pytest.mark.parametrize(
    ("settings", "line"),
    [
        (
            LinkSettings(fec="llrs"),
            "h1/eth2: cannot set fec=llrs: Invalid argument (kernel: invalid FEC modes requested)",
        ),
        (
            LinkSettings(autoneg=False, speed_mbps=40000),
            "h1/eth2: cannot set autoneg=off,speed_mbps=40000: Invalid argument (kernel: requested speed not "
            "supported)",
        ),
        (
            LinkSettings(link_modes=("800000baseXX/Full",)),
            "h1/eth2: cannot set link_modes=800000baseXX/Full: Invalid argument (kernel: bit name not found)",
        ),
        (
            LinkSettings(priv_flags=(("no_such_flag", True),)),
            "h1/eth2: cannot set no_such_flag=on: Invalid argument (kernel: bit name not found)",
        ),
    ],
)
def test_a_refusal_is_one_line_with_the_kernels_message(settings: LinkSettings, line: str) -> None:
    with pytest.raises(LinkSettingUnsupported) as exc:
        run(control(ScriptedKernel()).apply(PORT, settings))
    assert str(exc.value) == line and "\n" not in str(exc.value)
    assert exc.value.port == PORT and exc.value.settings == settings


def test_a_missing_interface_is_bad_input() -> None:
    call: Callable[[NetlinkLinkControl], Any]
    for call in (lambda c: c.read(PortRef("h1", "eth9")), lambda c: c.support(PortRef("h1", "eth9"))):
        with pytest.raises(InputError) as exc:
            run(call(control(ScriptedKernel())))
        assert str(exc.value) == "h1/eth9: no such interface"


def test_other_kernel_errors_are_hardware_errors_in_one_line() -> None:
    kernel = ScriptedKernel()
    original = kernel._answer

    def busy(cmd: int, msg: bytes) -> bytes | None:
        if cmd == m.ETHTOOL_MSG_LINKMODES_GET:
            raise Refused(errno.EBUSY, "firmware\nbusy")
        return original(cmd, msg)

    kernel._answer = busy  # type: ignore[method-assign]
    with pytest.raises(HardwareError) as exc:
        run(control(kernel).read(PORT))
    assert str(exc.value) == "h1/eth2: ethtool netlink: Device or resource busy (kernel: firmware busy)"
