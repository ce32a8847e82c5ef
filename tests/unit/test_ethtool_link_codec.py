"""The ethtool-netlink link-settings codec (labctl.linux.ethtool_msgs): every SET and GET request read back by
an independent decoder, and GET replies built as the kernel builds them decoded.

The independent decoder is pyroute2 0.9.7's ethtool message classes (pyroute2.netlink.generic.ethtool):
ethtool_linkmode_msg (LINKMODES), ethtool_strset_msg (STRSET) and its ethtoolheader / ethtoolbitset nests.
pyroute2 has no class for FEC or PRIVFLAGS messages; for those the test declares one with pyroute2's own nla
machinery from the kernel's attribute policy (include/uapi/linux/ethtool_netlink.h and
Documentation/networking/ethtool-netlink.rst: ETHTOOL_A_FEC_{HEADER=1, MODES=2 bitset, AUTO=3 u8, ACTIVE=4
u32}; ETHTOOL_A_PRIVFLAGS_{HEADER=1, FLAGS=2 bitset}), reusing pyroute2's header and bitset nests.

Replies: `kernel_bitset` lays a bitset out in the order the kernel's ethnl_put_bitset32() writes it (NOMASK
when there is no mask, SIZE, then VALUE/MASK words or one BITS_BIT nest per bit in the mask with INDEX, NAME
and a VALUE flag for set bits), framed with labctl.linux.netlink's attribute helper only, not with the
codec's encoders. Link-mode indexes are the kernel's (ETH_SS_LINK_MODES as this machine's kernel answered
it: 5 1000baseT/Full, 6 Autoneg, 13 Pause, 31 25000baseCR/Full, 37 100000baseSR4/Full, 38
100000baseCR4/Full, 49/50/51/74 the FEC bits None/RS/BASER/LLRS).
"""

from __future__ import annotations

import struct
from typing import Any

import pytest
from pyroute2.netlink import NLA_F_NESTED, genlmsg
from pyroute2.netlink.generic.ethtool import ETHTOOL_MSG_LINKINFO_GET as PR_LINKINFO_GET
from pyroute2.netlink.generic.ethtool import ETHTOOL_MSG_LINKMODES_GET as PR_LINKMODES_GET
from pyroute2.netlink.generic.ethtool import ETHTOOL_MSG_LINKMODES_SET as PR_LINKMODES_SET
from pyroute2.netlink.generic.ethtool import ETHTOOL_MSG_PRIVFLAGS_GET as PR_PRIVFLAGS_GET
from pyroute2.netlink.generic.ethtool import ETHTOOL_MSG_PRIVFLAGS_SET as PR_PRIVFLAGS_SET
from pyroute2.netlink.generic.ethtool import ETHTOOL_MSG_STRSET_GET as PR_STRSET_GET
from pyroute2.netlink.generic.ethtool import (
    ethtool_linkinfo_msg,
    ethtool_linkmode_msg,
    ethtool_strset_msg,
    ethtoolbitset,
    ethtoolheader,
)

from labctl.linux import ethtool_msgs as m
from labctl.linux.netlink import NLM_F_ACK, NLM_F_REQUEST, attr, cstr, u32

FAMILY = 0x1C
UAPI_FEC_GET, UAPI_FEC_SET = 29, 30  # enum ethtool_msg_user in uapi/linux/ethtool_netlink.h (not in pyroute2)


class fec_msg(genlmsg):
    """FEC_GET/FEC_SET per the kernel's policy (pyroute2 0.9.7 has no class for them)."""

    nla_map = (
        ("ETHTOOL_A_FEC_UNSPEC", "none"),
        ("ETHTOOL_A_FEC_HEADER", "ethtoolheader"),
        ("ETHTOOL_A_FEC_MODES", "ethtoolbitset"),
        ("ETHTOOL_A_FEC_AUTO", "uint8"),
        ("ETHTOOL_A_FEC_ACTIVE", "uint32"),
    )
    ethtoolheader = ethtoolheader
    ethtoolbitset = ethtoolbitset


class privflags_msg(genlmsg):
    """PRIVFLAGS_GET/PRIVFLAGS_SET per the kernel's policy (pyroute2 0.9.7 has no class for them)."""

    nla_map = (
        ("ETHTOOL_A_PRIVFLAGS_UNSPEC", "none"),
        ("ETHTOOL_A_PRIVFLAGS_HEADER", "ethtoolheader"),
        ("ETHTOOL_A_PRIVFLAGS_FLAGS", "ethtoolbitset"),
    )
    ethtoolheader = ethtoolheader
    ethtoolbitset = ethtoolbitset


def decoded(cls: type[genlmsg], msg: bytes | bytearray) -> Any:
    out = cls(bytes(msg))
    out.decode()
    return out


def nested_flags(parent: Any, name: str) -> list[int]:
    """The raw nla type flags pyroute2 kept for each `name` attribute of `parent`."""
    return [a.get_flags() for a in parent["attrs"] if a.name == name]


def pr_bits(bitset: Any) -> list[tuple[int | None, str | None, bool]]:
    """(index, name, VALUE flag present) for each BITS_BIT nest, as pyroute2 decodes them."""
    bits = bitset.get_attr("ETHTOOL_A_BITSET_BITS")
    assert nested_flags(bitset, "ETHTOOL_A_BITSET_BITS") == [NLA_F_NESTED]
    out = []
    for bit in bits.get_attrs("ETHTOOL_A_BITSET_BITS_BIT"):
        out.append(
            (
                bit.get_attr("ETHTOOL_A_BITSET_BIT_INDEX"),
                bit.get_attr("ETHTOOL_A_BITSET_BIT_NAME"),
                bit.get_attr("ETHTOOL_A_BITSET_BIT_VALUE") is not None,
            )
        )
    return out


def check_header(msg: Any, cmd: int, header_attr: str, ifname: str, flags: int | None, ack: bool) -> None:
    assert msg["header"]["type"] == FAMILY
    assert msg["header"]["flags"] == NLM_F_REQUEST | (NLM_F_ACK if ack else 0)
    assert msg["cmd"] == cmd and msg["version"] == m.ETHTOOL_GENL_VERSION
    head = msg.get_attr(header_attr)
    assert nested_flags(msg, header_attr) == [NLA_F_NESTED]
    assert head.get_attr("ETHTOOL_A_HEADER_DEV_NAME") == ifname
    assert head.get_attr("ETHTOOL_A_HEADER_FLAGS") == flags


# -- SET requests ----------------------------------------------------------------------------------------


def test_linkmodes_set_carries_only_the_fields_given() -> None:
    msg = m.linkmodes_set_request(FAMILY, "eth2", autoneg=False, speed_mbps=100000, duplex="full")
    p = decoded(ethtool_linkmode_msg, msg)
    check_header(p, PR_LINKMODES_SET, "ETHTOOL_A_LINKMODES_HEADER", "eth2", None, ack=True)
    assert p.get_attr("ETHTOOL_A_LINKMODES_AUTONEG") == m.AUTONEG_DISABLE
    assert p.get_attr("ETHTOOL_A_LINKMODES_SPEED") == 100000
    assert p.get_attr("ETHTOOL_A_LINKMODES_DUPLEX") == m.DUPLEX_FULL
    assert p.get_attr("ETHTOOL_A_LINKMODES_OURS") is None

    only_autoneg = decoded(ethtool_linkmode_msg, m.linkmodes_set_request(FAMILY, "eth2", autoneg=True))
    names = [a.name for a in only_autoneg["attrs"]]
    assert names == ["ETHTOOL_A_LINKMODES_HEADER", "ETHTOOL_A_LINKMODES_AUTONEG"]
    assert only_autoneg.get_attr("ETHTOOL_A_LINKMODES_AUTONEG") == m.AUTONEG_ENABLE
    half = decoded(ethtool_linkmode_msg, m.linkmodes_set_request(FAMILY, "eth2", duplex="half"))
    assert half.get_attr("ETHTOOL_A_LINKMODES_DUPLEX") == m.DUPLEX_HALF


def test_linkmodes_set_advertises_with_a_mask_by_index_and_by_name() -> None:
    ours: list[tuple[int | str, bool]] = [(37, False), (38, True), ("200000baseCR4/Full", True)]
    p = decoded(ethtool_linkmode_msg, m.linkmodes_set_request(FAMILY, "eth2", ours=ours))
    bitset = p.get_attr("ETHTOOL_A_LINKMODES_OURS")
    assert nested_flags(p, "ETHTOOL_A_LINKMODES_OURS") == [NLA_F_NESTED]
    assert bitset.get_attr("ETHTOOL_A_BITSET_NOMASK") is None  # a mask: bits not listed stay
    assert pr_bits(bitset) == [(37, None, False), (38, None, True), (None, "200000baseCR4/Full", True)]


@pytest.mark.parametrize(
    ("fec", "bits", "auto"),
    [("off", [49], 0), ("rs", [50], 0), ("baser", [51], 0), ("llrs", [74], 0), ("auto", [], 1)],
)
def test_fec_set_sends_ethtool8s_link_mode_bit_as_a_list(fec: str, bits: list[int], auto: int) -> None:
    p = decoded(fec_msg, m.fec_set_request(FAMILY, "eth2", fec))
    check_header(p, UAPI_FEC_SET, "ETHTOOL_A_FEC_HEADER", "eth2", None, ack=True)
    modes = p.get_attr("ETHTOOL_A_FEC_MODES")
    assert modes.get_attr("ETHTOOL_A_BITSET_NOMASK") is not None  # a list: replaces the configured modes
    assert pr_bits(modes) == [(b, None, False) for b in bits]
    assert p.get_attr("ETHTOOL_A_FEC_AUTO") == auto


def test_fec_set_refuses_an_unknown_encoding() -> None:
    with pytest.raises(ValueError, match="FEC 'fc' is none of auto, off, rs, baser, llrs"):
        m.fec_set_request(FAMILY, "eth2", "fc")


def test_privflags_set_changes_only_the_flags_named() -> None:
    msg = m.privflags_set_request(FAMILY, "eth2", [("rx_cqe_compress", True), ("tx_port_ts", False)])
    p = decoded(privflags_msg, msg)
    check_header(p, PR_PRIVFLAGS_SET, "ETHTOOL_A_PRIVFLAGS_HEADER", "eth2", None, ack=True)
    flags = p.get_attr("ETHTOOL_A_PRIVFLAGS_FLAGS")
    assert flags.get_attr("ETHTOOL_A_BITSET_NOMASK") is None
    assert pr_bits(flags) == [(None, "rx_cqe_compress", True), (None, "tx_port_ts", False)]


def test_set_values_out_of_range_are_refused_before_sending() -> None:
    with pytest.raises(ValueError, match="speed 0 Mb/s out of range"):
        m.linkmodes_set_request(FAMILY, "eth2", speed_mbps=0)
    with pytest.raises(ValueError, match="duplex 'both'"):
        m.linkmodes_set_request(FAMILY, "eth2", duplex="both")
    with pytest.raises(ValueError, match="cannot clear"):
        m.encode_bitset_verbose([(3, False)], nomask=True)


# -- GET requests ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cmd", "cls", "head"),
    [
        (PR_LINKINFO_GET, ethtool_linkinfo_msg, "ETHTOOL_A_LINKINFO_HEADER"),
        (PR_LINKMODES_GET, ethtool_linkmode_msg, "ETHTOOL_A_LINKMODES_HEADER"),
        (UAPI_FEC_GET, fec_msg, "ETHTOOL_A_FEC_HEADER"),
        (PR_PRIVFLAGS_GET, privflags_msg, "ETHTOOL_A_PRIVFLAGS_HEADER"),
    ],
)
def test_get_requests_are_the_header_with_the_compact_flag(cmd: int, cls: type[genlmsg], head: str) -> None:
    p = decoded(cls, m.get_request(FAMILY, cmd, "eth2"))
    check_header(p, cmd, head, "eth2", m.ETHTOOL_FLAG_COMPACT_BITSETS, ack=False)
    assert [a.name for a in p["attrs"]] == [head]
    verbose = decoded(cls, m.get_request(FAMILY, cmd, "eth2", compact=False))
    check_header(verbose, cmd, head, "eth2", None, ack=False)


def test_strset_request_names_one_set() -> None:
    p = decoded(ethtool_strset_msg, m.strset_request(FAMILY, "eth2", m.ETH_SS_LINK_MODES))
    check_header(p, PR_STRSET_GET, "ETHTOOL_A_STRSET_HEADER", "eth2", None, ack=False)
    sets = p.get_attr("ETHTOOL_A_STRSET_STRINGSETS").get_attrs("ETHTOOL_A_STRINGSETS_STRINGSET")
    assert [s.get_attr("ETHTOOL_A_STRINGSET_ID") for s in sets] == [9]


# -- replies, laid out as the kernel lays them out --------------------------------------------------------


def nest(kind: int, *children: bytes) -> bytes:
    return attr(kind | 0x8000, b"".join(children))


def kernel_bitset(
    size: int, value: set[int], mask: set[int] | None, names: dict[int, str] | None, compact: bool
) -> bytes:
    """ethnl_put_bitset32()'s layout (see the module docstring)."""
    out = attr(m.ETHTOOL_A_BITSET_NOMASK, b"") if mask is None else b""
    out += attr(m.ETHTOOL_A_BITSET_SIZE, u32(size))
    if compact:
        nwords = (size + 31) // 32

        def words(bits: set[int]) -> bytes:
            w = [0] * nwords
            for i in bits:
                w[i // 32] |= 1 << (i % 32)
            return struct.pack(f"={nwords}I", *w)

        out += attr(m.ETHTOOL_A_BITSET_VALUE, words(value))
        if mask is not None:
            out += attr(m.ETHTOOL_A_BITSET_MASK, words(mask))
        return out
    listed = mask if mask is not None else value
    bits = b""
    for i in sorted(listed):
        one = attr(m.ETHTOOL_A_BITSET_BIT_INDEX, u32(i))
        if names and i in names:
            one += attr(m.ETHTOOL_A_BITSET_BIT_NAME, cstr(names[i]))
        if mask is not None and i in value:
            one += attr(m.ETHTOOL_A_BITSET_BIT_VALUE, b"")
        bits += nest(m.ETHTOOL_A_BITSET_BITS_BIT, one)
    return out + nest(m.ETHTOOL_A_BITSET_BITS, bits)


def reply_header(ifname: str = "eth2", index: int = 4) -> bytes:
    return nest(
        m.ETHTOOL_A_HEADER,
        attr(m.ETHTOOL_A_HEADER_DEV_INDEX, u32(index)),
        attr(m.ETHTOOL_A_HEADER_DEV_NAME, cstr(ifname)),
    )


LINK_MODE_NAMES = {
    5: "1000baseT/Full",
    6: "Autoneg",
    13: "Pause",
    31: "25000baseCR/Full",
    37: "100000baseSR4/Full",
    38: "100000baseCR4/Full",
    49: "None",
    50: "RS",
    51: "BASER",
    74: "LLRS",
}
SUPPORTED = {6, 13, 31, 37, 38, 49, 50, 51}
ADVERTISED = {6, 13, 38, 50}
NBITS = 121  # __ETHTOOL_LINK_MODE_MASK_NBITS on this machine's kernel


def linkmodes_reply(compact: bool) -> memoryview:
    names = None if compact else LINK_MODE_NAMES
    body = b"".join(
        (
            reply_header(),
            attr(m.ETHTOOL_A_LINKMODES_AUTONEG, bytes([1])),
            nest(m.ETHTOOL_A_LINKMODES_OURS, kernel_bitset(NBITS, ADVERTISED, SUPPORTED, names, compact)),
            nest(m.ETHTOOL_A_LINKMODES_PEER, kernel_bitset(NBITS, {6, 38, 50}, None, names, compact)),
            attr(m.ETHTOOL_A_LINKMODES_SPEED, u32(100000)),
            attr(m.ETHTOOL_A_LINKMODES_DUPLEX, bytes([1])),
        )
    )
    return memoryview(body)


@pytest.mark.parametrize("compact", [True, False], ids=["compact", "verbose"])
def test_linkmodes_reply_decodes_in_either_form(compact: bool) -> None:
    modes = m.decode_linkmodes(linkmodes_reply(compact))
    assert (modes.autoneg, modes.speed_mbps, modes.duplex) == (True, 100000, "full")
    assert modes.ours is not None and modes.peer is not None
    assert modes.ours.value == ADVERTISED and modes.ours.mask == SUPPORTED
    assert modes.peer.value == {6, 38, 50} and modes.peer.mask is None
    assert modes.ours.size == NBITS
    strings = LINK_MODE_NAMES if compact else None
    advertised = [n for n in modes.ours.named(modes.ours.value, strings) if m.is_link_mode(n)]
    assert advertised == ["100000baseCR4/Full"]
    supported = [n for n in modes.ours.named(SUPPORTED, strings) if m.is_link_mode(n)]
    assert supported == ["25000baseCR/Full", "100000baseSR4/Full", "100000baseCR4/Full"]


def test_unknown_speed_and_duplex_read_as_none() -> None:
    body = reply_header() + attr(m.ETHTOOL_A_LINKMODES_SPEED, u32(0xFFFFFFFF))
    body += attr(m.ETHTOOL_A_LINKMODES_DUPLEX, bytes([0xFF]))
    modes = m.decode_linkmodes(memoryview(body))
    assert (modes.speed_mbps, modes.duplex, modes.ours) == (None, None, None)


@pytest.mark.parametrize("compact", [True, False], ids=["compact", "verbose"])
def test_fec_reply_names_the_configured_mode_as_ethtool_does(compact: bool) -> None:
    names = None if compact else LINK_MODE_NAMES

    def fec_reply(bits: set[int], auto: int, active: int | None) -> memoryview:
        body = reply_header() + nest(m.ETHTOOL_A_FEC_MODES, kernel_bitset(NBITS, bits, None, names, compact))
        body += attr(m.ETHTOOL_A_FEC_AUTO, bytes([auto]))
        if active is not None:
            body += attr(m.ETHTOOL_A_FEC_ACTIVE, u32(active))
        return memoryview(body)

    rs = m.decode_fec(fec_reply({50}, 0, 50))
    assert rs.modes is not None and rs.modes.value == {50} and rs.active == 50 and not rs.auto
    assert m.fec_name(rs.modes.value, rs.auto) == "rs"
    auto = m.decode_fec(fec_reply(set(), 1, 51))
    assert m.fec_name(frozenset(), auto.auto) == "auto" and auto.active == 51
    for bits, name in (({49}, "off"), ({51}, "baser"), ({74}, "llrs"), ({50, 51}, "rs")):
        got = m.decode_fec(fec_reply(bits, 0, None))
        assert got.modes is not None and m.fec_name(got.modes.value, got.auto) == name
        assert got.active is None


@pytest.mark.parametrize("compact", [True, False], ids=["compact", "verbose"])
def test_privflags_reply(compact: bool) -> None:
    names = {0: "rx_cqe_moder", 1: "tx_cqe_moder", 2: "rx_cqe_compress"}
    bitset = kernel_bitset(3, {0, 2}, {0, 1, 2}, None if compact else names, compact)
    flags = m.decode_privflags(memoryview(reply_header() + nest(m.ETHTOOL_A_PRIVFLAGS_FLAGS, bitset)))
    assert flags.value == {0, 2} and flags.mask == {0, 1, 2}
    assert flags.named([0, 1, 2], names if compact else None) == list(names.values())


def test_linkinfo_reply() -> None:
    body = reply_header() + b"".join(
        attr(kind, bytes([v]))
        for kind, v in (
            (m.ETHTOOL_A_LINKINFO_PORT, 0x03),  # PORT_FIBRE
            (m.ETHTOOL_A_LINKINFO_PHYADDR, 0),
            (m.ETHTOOL_A_LINKINFO_TP_MDIX, 0),
            (m.ETHTOOL_A_LINKINFO_TP_MDIX_CTRL, 0),
            (m.ETHTOOL_A_LINKINFO_TRANSCEIVER, 1),  # XCVR_EXTERNAL
        )
    )
    assert m.decode_linkinfo(memoryview(body)) == m.LinkInfo(3, 0, 0, 0, 1)


def test_strset_reply() -> None:
    strings = b"".join(
        nest(
            m.ETHTOOL_A_STRINGS_STRING,
            attr(m.ETHTOOL_A_STRING_INDEX, u32(i)),
            attr(m.ETHTOOL_A_STRING_VALUE, cstr(name)),
        )
        for i, name in sorted(LINK_MODE_NAMES.items())
    )
    one = nest(
        m.ETHTOOL_A_STRINGSETS_STRINGSET,
        attr(m.ETHTOOL_A_STRINGSET_ID, u32(9)),
        attr(m.ETHTOOL_A_STRINGSET_COUNT, u32(len(LINK_MODE_NAMES))),
        nest(m.ETHTOOL_A_STRINGSET_STRINGS, strings),
    )
    body = memoryview(reply_header() + nest(m.ETHTOOL_A_STRSET_STRINGSETS, one))
    assert m.decode_strset(body, m.ETH_SS_LINK_MODES) == LINK_MODE_NAMES
    assert m.decode_strset(body, m.ETH_SS_PRIV_FLAGS) == {}


def test_a_truncated_reply_is_a_codec_error_not_a_crash() -> None:
    body = bytearray(linkmodes_reply(True))
    with pytest.raises(m.EthtoolCodecError, match="overruns"):
        m.decode_linkmodes(memoryview(body[:-20]))  # ends inside the PEER nest
    with pytest.raises(m.EthtoolCodecError, match="without ETHTOOL_A_PRIVFLAGS_FLAGS"):
        m.decode_privflags(memoryview(reply_header()))


def test_fec_bits_are_the_kernels_link_mode_bits() -> None:
    assert {LINK_MODE_NAMES[bit] for bit in m.FEC_BITS.values()} == {"None", "RS", "BASER", "LLRS"}
    assert m.FEC_NAMES[74] == "llrs"
