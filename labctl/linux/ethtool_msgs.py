"""The ethtool generic-netlink messages for a port's link settings: encoders and decoders, no I/O.

Messages (uapi/linux/ethtool_netlink.h; the kernel's attribute policy is in
Documentation/networking/ethtool-netlink.rst): STRSET_GET (string sets ETH_SS_LINK_MODES, ETH_SS_PRIV_FLAGS),
LINKINFO_GET, LINKMODES_GET/SET, FEC_GET/SET, PRIVFLAGS_GET/SET. Every request starts with the request
header (a nest holding the device name and ETHTOOL_A_HEADER_FLAGS).

Bitsets come in two forms and both are decoded here: compact (ETHTOOL_A_BITSET_SIZE plus VALUE and MASK as
arrays of u32 words, bit i in word i // 32) and verbose (ETHTOOL_A_BITSET_BITS: one nest per bit with its
INDEX, NAME and, where the set has a mask, a VALUE flag when the bit is set). NOMASK marks a list: the bits
given are the value and there is no mask. Names of compact bits come from the kernel's string sets, those of
verbose bits with them. A link-mode bitset in a LINKMODES reply has advertised modes as value and supported
modes as mask; FEC modes are link-mode bits too (ETHTOOL_LINK_MODE_FEC_*_BIT), as ethtool(8) maps them.

Requests are encoded as labctl.linux.genl sends them (the sequence number stamped there); SET requests ask
for an ACK, so success is an NLMSG_ERROR with code 0 and a refusal carries the kernel's extack message.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from labctl.linux.genl import GenericNetlink
from labctl.linux.netlink import (
    NLA_F_NESTED,
    NLA_TYPE_MASK,
    NLATTR,
    NLM_F_ACK,
    NLMSGHDR,
    align,
    attr,
    cstr,
    u32,
)

ETHTOOL_GENL_NAME = "ethtool"
ETHTOOL_GENL_VERSION = 1

# Requests (user space to kernel) and the kernel's replies.
ETHTOOL_MSG_STRSET_GET = 1
ETHTOOL_MSG_LINKINFO_GET = 2
ETHTOOL_MSG_LINKMODES_GET = 4
ETHTOOL_MSG_LINKMODES_SET = 5
ETHTOOL_MSG_PRIVFLAGS_GET = 13
ETHTOOL_MSG_PRIVFLAGS_SET = 14
ETHTOOL_MSG_FEC_GET = 29
ETHTOOL_MSG_FEC_SET = 30
ETHTOOL_MSG_STRSET_GET_REPLY = 1
ETHTOOL_MSG_LINKINFO_GET_REPLY = 2
ETHTOOL_MSG_LINKMODES_GET_REPLY = 4
ETHTOOL_MSG_PRIVFLAGS_GET_REPLY = 14
ETHTOOL_MSG_FEC_GET_REPLY = 30

# Request header (attribute 1 of every message above).
ETHTOOL_A_HEADER = 1
ETHTOOL_A_HEADER_DEV_INDEX = 1
ETHTOOL_A_HEADER_DEV_NAME = 2
ETHTOOL_A_HEADER_FLAGS = 3
ETHTOOL_FLAG_COMPACT_BITSETS = 1 << 0

# Bitsets.
ETHTOOL_A_BITSET_NOMASK = 1
ETHTOOL_A_BITSET_SIZE = 2
ETHTOOL_A_BITSET_BITS = 3
ETHTOOL_A_BITSET_VALUE = 4
ETHTOOL_A_BITSET_MASK = 5
ETHTOOL_A_BITSET_BITS_BIT = 1
ETHTOOL_A_BITSET_BIT_INDEX = 1
ETHTOOL_A_BITSET_BIT_NAME = 2
ETHTOOL_A_BITSET_BIT_VALUE = 3

# String sets.
ETHTOOL_A_STRSET_HEADER = 1
ETHTOOL_A_STRSET_STRINGSETS = 2
ETHTOOL_A_STRINGSETS_STRINGSET = 1
ETHTOOL_A_STRINGSET_ID = 1
ETHTOOL_A_STRINGSET_COUNT = 2
ETHTOOL_A_STRINGSET_STRINGS = 3
ETHTOOL_A_STRINGS_STRING = 1
ETHTOOL_A_STRING_INDEX = 1
ETHTOOL_A_STRING_VALUE = 2
ETH_SS_PRIV_FLAGS = 2
ETH_SS_LINK_MODES = 9

# LINKINFO, LINKMODES, FEC, PRIVFLAGS.
ETHTOOL_A_LINKINFO_PORT = 2
ETHTOOL_A_LINKINFO_PHYADDR = 3
ETHTOOL_A_LINKINFO_TP_MDIX = 4
ETHTOOL_A_LINKINFO_TP_MDIX_CTRL = 5
ETHTOOL_A_LINKINFO_TRANSCEIVER = 6
ETHTOOL_A_LINKMODES_AUTONEG = 2
ETHTOOL_A_LINKMODES_OURS = 3
ETHTOOL_A_LINKMODES_PEER = 4
ETHTOOL_A_LINKMODES_SPEED = 5
ETHTOOL_A_LINKMODES_DUPLEX = 6
ETHTOOL_A_FEC_MODES = 2
ETHTOOL_A_FEC_AUTO = 3
ETHTOOL_A_FEC_ACTIVE = 4
ETHTOOL_A_PRIVFLAGS_FLAGS = 2

AUTONEG_DISABLE = 0
AUTONEG_ENABLE = 1
DUPLEX_HALF = 0
DUPLEX_FULL = 1
DUPLEX_UNKNOWN = 0xFF
SPEED_UNKNOWN = 0xFFFFFFFF  # (u32)-1

# Link-mode bits that are not link modes: the port types, pause and autoneg advertisement, FEC.
ETHTOOL_LINK_MODE_AUTONEG_BIT = 6
ETHTOOL_LINK_MODE_FEC_NONE_BIT = 49
ETHTOOL_LINK_MODE_FEC_RS_BIT = 50
ETHTOOL_LINK_MODE_FEC_BASER_BIT = 51
ETHTOOL_LINK_MODE_FEC_LLRS_BIT = 74
FEC_BITS: Mapping[str, int] = {
    "off": ETHTOOL_LINK_MODE_FEC_NONE_BIT,
    "rs": ETHTOOL_LINK_MODE_FEC_RS_BIT,
    "baser": ETHTOOL_LINK_MODE_FEC_BASER_BIT,
    "llrs": ETHTOOL_LINK_MODE_FEC_LLRS_BIT,
}
"""ethtool(8)'s FEC encodings (`--set-fec encoding off|rs|baser|llrs`) as link-mode bits; `auto` is
ETHTOOL_A_FEC_AUTO, not a bit."""
FEC_NAMES: Mapping[int, str] = {bit: name for name, bit in FEC_BITS.items()}

_U8 = struct.Struct("=B")


class EthtoolCodecError(ValueError):
    """A reply that does not have the layout the kernel documents."""


# -- attributes ------------------------------------------------------------------------------------------


def iter_attrs(data: bytes | bytearray | memoryview) -> Iterator[tuple[int, memoryview]]:
    """(type with flags masked off, payload) for every attribute in `data`, repeated ones included."""
    view = memoryview(data)
    at = 0
    while at + NLATTR.size <= len(view):
        length, kind = NLATTR.unpack_from(view, at)
        if length < NLATTR.size or at + length > len(view):
            raise EthtoolCodecError(
                f"attribute of length {length} at offset {at} overruns its {len(view)} bytes"
            )
        yield kind & NLA_TYPE_MASK, view[at + NLATTR.size : at + length]
        at += align(length)


def _attrs(data: bytes | bytearray | memoryview) -> dict[int, memoryview]:
    return dict(iter_attrs(data))


def _u8(payload: memoryview) -> int:
    if len(payload) < 1:
        raise EthtoolCodecError("u8 attribute without a byte")
    return int(payload[0])


def _u32(payload: memoryview) -> int:
    if len(payload) < 4:
        raise EthtoolCodecError(f"u32 attribute of {len(payload)} bytes")
    return int(struct.unpack_from("=I", payload)[0])


def _str(payload: memoryview) -> str:
    return bytes(payload).split(b"\0", 1)[0].decode(errors="replace")


# -- bitsets ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Bitset:
    """A decoded bitset: the indexes set in its value, those in its mask (None for a list), and the names the
    verbose form carried (the compact form carries none: see `named`)."""

    size: int
    value: frozenset[int]
    mask: frozenset[int] | None = None
    names: Mapping[int, str] = field(default_factory=dict)

    def named(self, bits: Iterable[int], strings: Mapping[int, str] | None = None) -> list[str]:
        """Names of `bits` in index order: the verbose form's own, else the string set's, else `bit<i>`."""
        table = strings or {}
        return [self.names.get(i) or table.get(i) or f"bit{i}" for i in sorted(bits)]


def decode_bitset(payload: memoryview) -> Bitset:
    """A bitset in either form."""
    top = _attrs(payload)
    nomask = ETHTOOL_A_BITSET_NOMASK in top
    size = _u32(top[ETHTOOL_A_BITSET_SIZE]) if ETHTOOL_A_BITSET_SIZE in top else 0
    bits = top.get(ETHTOOL_A_BITSET_BITS)
    if bits is None and ETHTOOL_A_BITSET_VALUE not in top:
        # compact with SIZE 0, or verbose with no bit listed: an empty set
        return Bitset(size, frozenset(), None if nomask else frozenset())
    if bits is not None:
        value: set[int] = set()
        listed: set[int] = set()
        names: dict[int, str] = {}
        for kind, bit in iter_attrs(bits):
            if kind != ETHTOOL_A_BITSET_BITS_BIT:
                continue
            one = _attrs(bit)
            if ETHTOOL_A_BITSET_BIT_INDEX not in one:
                raise EthtoolCodecError("verbose bitset bit without ETHTOOL_A_BITSET_BIT_INDEX")
            index = _u32(one[ETHTOOL_A_BITSET_BIT_INDEX])
            listed.add(index)
            if ETHTOOL_A_BITSET_BIT_NAME in one:
                names[index] = _str(one[ETHTOOL_A_BITSET_BIT_NAME])
            if nomask or ETHTOOL_A_BITSET_BIT_VALUE in one:
                value.add(index)
        return Bitset(size, frozenset(value), None if nomask else frozenset(listed), names)
    words = bytes(top[ETHTOOL_A_BITSET_VALUE])
    if len(words) % 4 or len(words) * 8 < size:
        raise EthtoolCodecError(f"compact bitset of {size} bits with a {len(words)}-byte value")
    mask = None if nomask else _word_bits(bytes(top.get(ETHTOOL_A_BITSET_MASK, memoryview(b""))), size)
    return Bitset(size, _word_bits(words, size), mask)


def _word_bits(words: bytes, size: int) -> frozenset[int]:
    out: set[int] = set()
    for w, (word,) in enumerate(struct.iter_unpack("=I", words[: (len(words) // 4) * 4])):
        while word:
            low = word & -word
            index = w * 32 + low.bit_length() - 1
            if index < size:
                out.add(index)
            word ^= low
    return frozenset(out)


def encode_bitset_compact(size: int, value: Sequence[int], mask: Sequence[int] | None) -> bytes:
    """SIZE, VALUE (and MASK, or NOMASK when `mask` is None) as u32 words."""
    nwords = (size + 31) // 32

    def words(bits: Sequence[int]) -> bytes:
        out = [0] * nwords
        for i in bits:
            if not 0 <= i < size:
                raise ValueError(f"bit {i} outside a {size}-bit set")
            out[i // 32] |= 1 << (i % 32)
        return struct.pack(f"={nwords}I", *out)

    parts = [attr(ETHTOOL_A_BITSET_NOMASK, b"")] if mask is None else []
    parts += [attr(ETHTOOL_A_BITSET_SIZE, u32(size)), attr(ETHTOOL_A_BITSET_VALUE, words(value))]
    if mask is not None:
        parts.append(attr(ETHTOOL_A_BITSET_MASK, words(mask)))
    return b"".join(parts)


def encode_bitset_verbose(bits: Sequence[tuple[int | str, bool]], *, nomask: bool = False) -> bytes:
    """BITS, one nest per (index or name, on). With a mask (the default) every bit listed is changed and a
    VALUE flag marks those set; with `nomask` the bits listed (all `on`) are the whole new value."""
    nests = []
    for key, on in bits:
        if nomask and not on:
            raise ValueError(f"a bit list (NOMASK) cannot clear {key!r}")
        one = attr(ETHTOOL_A_BITSET_BIT_INDEX, u32(key)) if isinstance(key, int) else b""
        one += attr(ETHTOOL_A_BITSET_BIT_NAME, cstr(key)) if isinstance(key, str) else b""
        if on and not nomask:
            one += attr(ETHTOOL_A_BITSET_BIT_VALUE, b"")
        nests.append(attr(ETHTOOL_A_BITSET_BITS_BIT | NLA_F_NESTED, one))
    head = attr(ETHTOOL_A_BITSET_NOMASK, b"") if nomask else b""
    return head + attr(ETHTOOL_A_BITSET_BITS | NLA_F_NESTED, b"".join(nests))


# -- requests --------------------------------------------------------------------------------------------


def header(ifname: str, flags: int = 0) -> bytes:
    """The request header: device name (and flags when any)."""
    inner = attr(ETHTOOL_A_HEADER_DEV_NAME, cstr(ifname))
    if flags:
        inner += attr(ETHTOOL_A_HEADER_FLAGS, u32(flags))
    return attr(ETHTOOL_A_HEADER | NLA_F_NESTED, inner)


def request(family: int, cmd: int, attrs: bytes, *, ack: bool = False) -> bytearray:
    """A generic netlink request (seq 0, stamped when sent); `ack` asks for an NLMSG_ERROR(0) on success."""
    msg = GenericNetlink.message(family, cmd, ETHTOOL_GENL_VERSION, attrs)
    if ack:
        length, kind, flags, seq, pid = NLMSGHDR.unpack_from(msg)
        NLMSGHDR.pack_into(msg, 0, length, kind, flags | NLM_F_ACK, seq, pid)
    return msg


def get_request(family: int, cmd: int, ifname: str, *, compact: bool = True) -> bytearray:
    """LINKINFO_GET, LINKMODES_GET, FEC_GET or PRIVFLAGS_GET for one device: the header alone."""
    return request(family, cmd, header(ifname, ETHTOOL_FLAG_COMPACT_BITSETS if compact else 0))


def strset_request(family: int, ifname: str, set_id: int) -> bytearray:
    """STRSET_GET for one string set (ETH_SS_LINK_MODES is global, ETH_SS_PRIV_FLAGS the device's)."""
    inner = attr(ETHTOOL_A_STRINGSETS_STRINGSET | NLA_F_NESTED, attr(ETHTOOL_A_STRINGSET_ID, u32(set_id)))
    sets = attr(ETHTOOL_A_STRSET_STRINGSETS | NLA_F_NESTED, inner)
    return request(family, ETHTOOL_MSG_STRSET_GET, header(ifname) + sets)


def linkmodes_set_request(
    family: int,
    ifname: str,
    *,
    autoneg: bool | None = None,
    speed_mbps: int | None = None,
    duplex: str | None = None,
    ours: Sequence[tuple[int | str, bool]] | None = None,
) -> bytearray:
    """LINKMODES_SET with only the attributes given; `ours` changes the advertised modes listed (a bitset
    with a mask: modes not listed stay as they are)."""
    parts = [header(ifname)]
    if autoneg is not None:
        parts.append(
            attr(ETHTOOL_A_LINKMODES_AUTONEG, _U8.pack(AUTONEG_ENABLE if autoneg else AUTONEG_DISABLE))
        )
    if ours is not None:
        parts.append(attr(ETHTOOL_A_LINKMODES_OURS | NLA_F_NESTED, encode_bitset_verbose(ours)))
    if speed_mbps is not None:
        if not 0 < speed_mbps < SPEED_UNKNOWN:
            raise ValueError(f"speed {speed_mbps} Mb/s out of range")
        parts.append(attr(ETHTOOL_A_LINKMODES_SPEED, u32(speed_mbps)))
    if duplex is not None:
        code = {"full": DUPLEX_FULL, "half": DUPLEX_HALF}.get(duplex)
        if code is None:
            raise ValueError(f"duplex {duplex!r} is not 'full' or 'half'")
        parts.append(attr(ETHTOOL_A_LINKMODES_DUPLEX, _U8.pack(code)))
    return request(family, ETHTOOL_MSG_LINKMODES_SET, b"".join(parts), ack=True)


def fec_set_request(family: int, ifname: str, fec: str) -> bytearray:
    """FEC_SET as `ethtool --set-fec IF encoding <fec>` sends it: the FEC link-mode bit as a list (so it
    replaces the configured modes) and ETHTOOL_A_FEC_AUTO; `auto` is the flag with an empty list."""
    if fec != "auto" and fec not in FEC_BITS:
        raise ValueError(f"FEC {fec!r} is none of auto, {', '.join(FEC_BITS)}")
    bits: list[tuple[int | str, bool]] = [] if fec == "auto" else [(FEC_BITS[fec], True)]
    attrs = b"".join(
        (
            header(ifname),
            attr(ETHTOOL_A_FEC_MODES | NLA_F_NESTED, encode_bitset_verbose(bits, nomask=True)),
            attr(ETHTOOL_A_FEC_AUTO, _U8.pack(1 if fec == "auto" else 0)),
        )
    )
    return request(family, ETHTOOL_MSG_FEC_SET, attrs, ack=True)


def privflags_set_request(family: int, ifname: str, flags: Sequence[tuple[str, bool]]) -> bytearray:
    """PRIVFLAGS_SET changing only the flags named (a bitset with a mask, bits by name)."""
    bits: list[tuple[int | str, bool]] = list(flags)
    attrs = header(ifname) + attr(ETHTOOL_A_PRIVFLAGS_FLAGS | NLA_F_NESTED, encode_bitset_verbose(bits))
    return request(family, ETHTOOL_MSG_PRIVFLAGS_SET, attrs, ack=True)


# -- replies (the payload after the genl header) -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LinkInfo:
    """LINKINFO_GET: PORT_* (0 TP ... 0xef none), PHY address, MDI-X state and control, XCVR_*."""

    port: int | None
    phyaddr: int | None
    tp_mdix: int | None
    tp_mdix_ctrl: int | None
    transceiver: int | None


@dataclass(frozen=True, slots=True)
class LinkModes:
    """LINKMODES_GET: autoneg, our modes (value advertised, mask supported), the peer's, speed and duplex."""

    autoneg: bool | None
    ours: Bitset | None
    peer: Bitset | None
    speed_mbps: int | None
    duplex: str | None
    """'full', 'half' or None (unknown)."""


@dataclass(frozen=True, slots=True)
class FecState:
    """FEC_GET: configured FEC link-mode bits, the auto flag, the active FEC's bit (None: not reported)."""

    modes: Bitset | None
    auto: bool
    active: int | None


def decode_linkinfo(payload: memoryview) -> LinkInfo:
    a = _attrs(payload)

    def get(kind: int) -> int | None:
        return _u8(a[kind]) if kind in a else None

    return LinkInfo(
        get(ETHTOOL_A_LINKINFO_PORT),
        get(ETHTOOL_A_LINKINFO_PHYADDR),
        get(ETHTOOL_A_LINKINFO_TP_MDIX),
        get(ETHTOOL_A_LINKINFO_TP_MDIX_CTRL),
        get(ETHTOOL_A_LINKINFO_TRANSCEIVER),
    )


def decode_linkmodes(payload: memoryview) -> LinkModes:
    a = _attrs(payload)
    speed = _u32(a[ETHTOOL_A_LINKMODES_SPEED]) if ETHTOOL_A_LINKMODES_SPEED in a else SPEED_UNKNOWN
    duplex = _u8(a[ETHTOOL_A_LINKMODES_DUPLEX]) if ETHTOOL_A_LINKMODES_DUPLEX in a else DUPLEX_UNKNOWN
    return LinkModes(
        autoneg=_u8(a[ETHTOOL_A_LINKMODES_AUTONEG]) == AUTONEG_ENABLE
        if ETHTOOL_A_LINKMODES_AUTONEG in a
        else None,
        ours=decode_bitset(a[ETHTOOL_A_LINKMODES_OURS]) if ETHTOOL_A_LINKMODES_OURS in a else None,
        peer=decode_bitset(a[ETHTOOL_A_LINKMODES_PEER]) if ETHTOOL_A_LINKMODES_PEER in a else None,
        speed_mbps=None if speed in (0, SPEED_UNKNOWN) else speed,
        duplex={DUPLEX_FULL: "full", DUPLEX_HALF: "half"}.get(duplex),
    )


def decode_fec(payload: memoryview) -> FecState:
    a = _attrs(payload)
    return FecState(
        modes=decode_bitset(a[ETHTOOL_A_FEC_MODES]) if ETHTOOL_A_FEC_MODES in a else None,
        auto=ETHTOOL_A_FEC_AUTO in a and _u8(a[ETHTOOL_A_FEC_AUTO]) != 0,
        active=_u32(a[ETHTOOL_A_FEC_ACTIVE]) if ETHTOOL_A_FEC_ACTIVE in a else None,
    )


def decode_privflags(payload: memoryview) -> Bitset:
    """PRIVFLAGS_GET: the flags as a bitset (value: on; mask: every flag the driver has)."""
    a = _attrs(payload)
    if ETHTOOL_A_PRIVFLAGS_FLAGS not in a:
        raise EthtoolCodecError("PRIVFLAGS_GET reply without ETHTOOL_A_PRIVFLAGS_FLAGS")
    return decode_bitset(a[ETHTOOL_A_PRIVFLAGS_FLAGS])


def decode_strset(payload: memoryview, set_id: int) -> dict[int, str]:
    """STRSET_GET: index → string of string set `set_id`."""
    a = _attrs(payload)
    out: dict[int, str] = {}
    for kind, one in iter_attrs(a.get(ETHTOOL_A_STRSET_STRINGSETS, memoryview(b""))):
        if kind != ETHTOOL_A_STRINGSETS_STRINGSET:
            continue
        s = _attrs(one)
        if ETHTOOL_A_STRINGSET_ID not in s or _u32(s[ETHTOOL_A_STRINGSET_ID]) != set_id:
            continue
        for k, string in iter_attrs(s.get(ETHTOOL_A_STRINGSET_STRINGS, memoryview(b""))):
            if k != ETHTOOL_A_STRINGS_STRING:
                continue
            t = _attrs(string)
            if ETHTOOL_A_STRING_INDEX in t and ETHTOOL_A_STRING_VALUE in t:
                out[_u32(t[ETHTOOL_A_STRING_INDEX])] = _str(t[ETHTOOL_A_STRING_VALUE])
    return out


def is_link_mode(name: str) -> bool:
    """A real link mode (`100000baseCR4/Full`), not a port type, pause, autoneg or FEC bit (`TP`, `RS`)."""
    return "/" in name


def fec_name(bits: frozenset[int], auto: bool) -> str | None:
    """The configured FEC as one ethtool name: `auto` when the flag is set, else the single FEC bit (with
    several, the first of rs, baser, llrs, off); None when no FEC bit is set."""
    if auto:
        return "auto"
    for name in ("rs", "baser", "llrs", "off"):
        if FEC_BITS[name] in bits:
            return name
    return None
