"""A minimal rtnetlink codec and a blocking request socket, for the operations that sit on measured paths.

pyroute2 builds and parses every attribute of every message (~0.2 ms per RTM_NEWLINK, see
../shared/reference/probes.md §2.2); the fabric flips fiber ends and re-programs cross-connects while a
reconfiguration is being timed, and the carrier probe parses thousands of link messages a second, so both
use these few hand-encoded messages instead. Only what labctl needs is here: link admin state, veth
creation with chosen ifindexes, an ingress qdisc, u32 + mirred redirect filters, the RTM_NEWLINK fields a
carrier probe reads, and the socket filter that keeps a link subscriber's queue to the links it watches.
"""

from __future__ import annotations

import errno
import socket
import struct
from collections.abc import Collection
from dataclasses import dataclass

from labctl.linux.netlink import (
    BPF_ACCEPT,
    BPF_JEQ_K,
    BPF_LD_H_ABS,
    BPF_LD_W_ABS,
    BPF_MAXINSNS,
    BPF_RET_K,
    NLATTR,
    NLM_F_ACK,
    NLM_F_CREATE,
    NLM_F_DUMP,
    NLM_F_EXCL,
    NLM_F_REQUEST,
    NLMSG_DONE,
    NLMSG_ERROR,
    NLMSGERR,
    U32,
    Insn,
    NetlinkError,
    align,
    attr,
    be16,
    be32,
    cstr,
    iter_messages,
    message,
    nested,
    parse_attrs,
    u32,
)
from labctl.linux.readonly import check_write

NETLINK_ROUTE = 0
RTMGRP_LINK = 0x1

# rtnetlink message types
RTM_NEWLINK = 16
RTM_DELLINK = 17
RTM_GETLINK = 18
RTM_NEWROUTE = 24
RTM_GETROUTE = 26
RTM_NEWQDISC = 36
RTM_NEWTFILTER = 44
RTM_DELTFILTER = 45

# link attributes
IFLA_ADDRESS = 1
IFLA_IFNAME = 3
IFLA_OPERSTATE = 16
IFLA_LINKINFO = 18
IFLA_NET_NS_FD = 28
IFLA_EXT_MASK = 29
IFLA_CARRIER = 33
IFLA_CARRIER_UP_COUNT = 47
IFLA_CARRIER_DOWN_COUNT = 48
IFLA_INFO_KIND = 1
IFLA_INFO_DATA = 2
VETH_INFO_PEER = 1
RTEXT_FILTER_SKIP_STATS = 1 << 3
IFF_UP = 0x1
IFF_LOWER_UP = 0x10000

# route attributes (linux/rtnetlink.h)
RTA_DST = 1
RTA_OIF = 4
RTA_MULTIPATH = 9
RTA_TABLE = 15
RT_TABLE_MAIN = 254
RTN_UNICAST = 1
RTMSG = struct.Struct("=BBBBBBBBI")  # family, dst_len, src_len, tos, table, protocol, scope, type, flags
RTNEXTHOP = struct.Struct("=HBBi")  # len, flags, hops, ifindex

# RFC 2863 operational states, as IFLA_OPERSTATE numbers them
OPERSTATES = ("unknown", "notpresent", "down", "lowerlayerdown", "testing", "dormant", "up")

# tc
TCA_KIND = 1
TCA_OPTIONS = 2
TCA_U32_SEL = 5
TCA_U32_ACT = 7
TCA_ACT_KIND = 1
TCA_ACT_OPTIONS = 2
TCA_MIRRED_PARMS = 2
TC_U32_TERMINAL = 1
TC_ACT_STOLEN = 4
TCA_EGRESS_REDIR = 1
TC_H_INGRESS = 0xFFFFFFF1
INGRESS_HANDLE = 0xFFFF0000
ETH_P_ALL = 0x0003

IFINFOMSG = struct.Struct("=BxHiII")  # family, type, index, flags, change
TCMSG = struct.Struct("=BxxxiIII")  # family, ifindex, handle, parent, info
U32_SEL = struct.Struct("=BBBxHHhhI")  # flags, offshift, nkeys, offmask, off, offoff, hoff, hmask
U32_KEY = struct.Struct("=IIii")  # mask, val, off, offmask
TC_MIRRED = struct.Struct("=IIiiiiI")  # index, capab, action, refcnt, bindcnt, eaction, ifindex


@dataclass(slots=True)
class LinkState:
    """The fields of an RTM_NEWLINK a carrier probe needs; None where the message did not carry one."""

    ifindex: int
    flags: int
    carrier: int | None
    operstate: int | None
    up_count: int | None
    down_count: int | None


def parse_link(data: bytes | bytearray, start: int, end: int) -> LinkState:
    """Decode ifindex, flags, carrier, operstate and the carrier counters; skip every other attribute, and
    stop once the four are found (the kernel puts them before the statistics and the per-family blocks,
    which are most of a ~1.5 KiB notification: half the walk)."""
    _family, _type, ifindex, flags, _change = IFINFOMSG.unpack_from(data, start)
    carrier = operstate = up_count = down_count = None
    offset = start + IFINFOMSG.size
    header = NLATTR.unpack_from
    found = 0
    while offset + 4 <= end:
        length, kind = header(data, offset)
        if length < 4:
            break
        kind &= 0x3FFF
        if kind == IFLA_CARRIER:
            carrier = data[offset + 4]
            found |= 1
        elif kind == IFLA_OPERSTATE:
            operstate = data[offset + 4]
            found |= 2
        elif kind == IFLA_CARRIER_UP_COUNT:
            up_count = U32.unpack_from(data, offset + 4)[0]
            found |= 4
        elif kind == IFLA_CARRIER_DOWN_COUNT:
            down_count = U32.unpack_from(data, offset + 4)[0]
            found |= 8
        if found == 15:
            break
        offset += (length + 3) & ~3
    return LinkState(ifindex, flags, carrier, operstate, up_count, down_count)


# Where a link subscriber's filter reads: nlmsghdr (16 bytes: len, type, flags, seq, pid), then ifinfomsg.
_TYPE_AT, _PID_AT, _IFINDEX_AT = 4, 12, 16 + 4
LINK_FILTER_MAX = (BPF_MAXINSNS - 8) // 2
"""The most interfaces `link_filter` can name (two instructions each)."""


def link_filter(portid: int, ifindexes: Collection[int]) -> list[Insn]:
    """A classic-BPF socket filter (labctl.linux.netlink.attach_filter) for an RTMGRP_LINK subscriber bound
    to `portid`: it keeps every datagram addressed to that port (the replies to its own requests: dumps,
    which pack many links into one datagram; per-link RTM_GETLINK replies; errors) and the RTM_NEWLINK
    notifications of the links in `ifindexes`. Everything else (other links' notifications, RTM_DELLINK)
    the kernel drops before it is queued. A notification carries one message, so its first header is all
    the filter needs to read."""
    if not 0 < len(ifindexes) <= LINK_FILTER_MAX:
        raise ValueError(f"a link filter names 1 to {LINK_FILTER_MAX} interfaces, not {len(ifindexes)}")
    program: list[Insn] = [
        (BPF_LD_W_ABS, 0, 0, _PID_AT),
        (BPF_JEQ_K, 0, 1, be32(portid)),
        (BPF_RET_K, 0, 0, BPF_ACCEPT),  # a reply to this socket's own request
        (BPF_LD_H_ABS, 0, 0, _TYPE_AT),
        (BPF_JEQ_K, 1, 0, be16(RTM_NEWLINK)),
        (BPF_RET_K, 0, 0, 0),  # a notification of another kind
        (BPF_LD_W_ABS, 0, 0, _IFINDEX_AT),
    ]
    for index in sorted(set(ifindexes)):
        program += [(BPF_JEQ_K, 0, 1, be32(index)), (BPF_RET_K, 0, 0, BPF_ACCEPT)]
    program.append((BPF_RET_K, 0, 0, 0))  # a link nobody watches
    return program


def getlink_request(ifindex: int, seq: int) -> bytes:
    """RTM_GETLINK for one device, without statistics (a smaller reply). Forces a linkwatch flush (≥ 6.7)."""
    body = IFINFOMSG.pack(socket.AF_UNSPEC, 0, ifindex, 0, 0) + attr(
        IFLA_EXT_MASK, u32(RTEXT_FILTER_SKIP_STATS)
    )
    return message(RTM_GETLINK, NLM_F_REQUEST, seq, body)


def dump_links_request(seq: int) -> bytes:
    body = IFINFOMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0) + attr(IFLA_EXT_MASK, u32(RTEXT_FILTER_SKIP_STATS))
    return message(RTM_GETLINK, NLM_F_REQUEST | NLM_F_DUMP, seq, body)


def open_route_socket(groups: int = 0, *, blocking: bool = True, rcvbuf: int = 1 << 20) -> socket.socket:
    """A NETLINK_ROUTE socket in the calling thread's current network namespace."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_ROUTE)
    try:
        try:
            sock.setsockopt(socket.SOL_SOCKET, 33, rcvbuf)  # SO_RCVBUFFORCE (root): above rmem_max
        except OSError:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.bind((0, groups))
        sock.setblocking(blocking)
    except BaseException:
        sock.close()
        raise
    return sock


class Rtnl:
    """Blocking request/acknowledge over one NETLINK_ROUTE socket (opened inside the namespace it acts on)."""

    def __init__(self, sock: socket.socket, timeout_s: float = 2.0) -> None:
        self.sock = sock
        self.sock.settimeout(timeout_s)
        self._seq = 0

    @classmethod
    def here(cls) -> Rtnl:
        return cls(open_route_socket())

    def close(self) -> None:
        self.sock.close()

    def request(self, msg_type: int, flags: int, body: bytes, *, ok_errnos: tuple[int, ...] = ()) -> None:
        """Send one request with NLM_F_ACK and wait for its acknowledgement; raise NetlinkError on refusal.
        Every request sent here changes something, so each is refused under labctl.linux.readonly."""
        check_write(f"send rtnetlink request {msg_type} (a link, qdisc or filter change)")
        self._seq += 1
        seq = self._seq
        self.sock.send(message(msg_type, flags | NLM_F_REQUEST | NLM_F_ACK, seq, body))
        while True:
            data = self.sock.recv(65536)
            for kind, _flags, mseq, start, _end in iter_messages(data):
                if kind == NLMSG_ERROR and mseq == seq:
                    (code,) = NLMSGERR.unpack_from(data, start)
                    if code == 0 or -code in ok_errnos:
                        return
                    raise NetlinkError(-code, f"rtnetlink request {msg_type} refused")

    def dump(self, msg_type: int, body: bytes) -> list[tuple[int, bytes]]:
        """Send one dump request; every message of its answer as (type, payload), until NLMSG_DONE."""
        self._seq += 1
        seq = self._seq
        self.sock.send(message(msg_type, NLM_F_REQUEST | NLM_F_DUMP, seq, body))
        out: list[tuple[int, bytes]] = []
        while True:
            data = self.sock.recv(1 << 16)
            for kind, _flags, mseq, start, end in iter_messages(data):
                if mseq != seq:
                    continue
                if kind == NLMSG_DONE:
                    return out
                if kind == NLMSG_ERROR:
                    (code,) = NLMSGERR.unpack_from(data, start)
                    if code == 0:
                        return out
                    raise NetlinkError(-code, f"rtnetlink dump {msg_type} refused")
                out.append((kind, bytes(data[start:end])))

    # -- routes --------------------------------------------------------------------------------------------
    def default_route_ifindexes(self) -> set[int]:
        """The interfaces the main table's default routes (IPv4 and IPv6, every nexthop of a multipath
        one) leave through: the host's management path, where its default route is."""
        found: set[int] = set()
        for family in (socket.AF_INET, socket.AF_INET6):
            body = RTMSG.pack(family, 0, 0, 0, 0, 0, 0, 0, 0)
            try:
                replies = self.dump(RTM_GETROUTE, body)
            except NetlinkError as e:
                if e.errno == errno.EAFNOSUPPORT:  # no IPv6 in this kernel
                    continue
                raise
            for kind, payload in replies:
                if kind != RTM_NEWROUTE or len(payload) < RTMSG.size:
                    continue
                _fam, dst_len, _src, _tos, table, _proto, _scope, rtype, _flags = RTMSG.unpack_from(payload)
                attrs = parse_attrs(payload, RTMSG.size, len(payload))
                if RTA_TABLE in attrs:
                    table = U32.unpack_from(attrs[RTA_TABLE])[0]
                if dst_len != 0 or table != RT_TABLE_MAIN or rtype != RTN_UNICAST:
                    continue
                found |= _route_oifs(attrs)
        return found

    def route_ifindex(self, address: str) -> int | None:
        """The interface the kernel routes `address` (an IPv4 or IPv6 literal) through (RTM_GETROUTE with
        RTA_DST, as `ip route get`); None where it has no route to it."""
        import ipaddress

        ip = ipaddress.ip_address(address)
        family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
        body = RTMSG.pack(family, ip.max_prefixlen, 0, 0, 0, 0, 0, 0, 0) + attr(RTA_DST, ip.packed)
        self._seq += 1
        seq = self._seq
        self.sock.send(message(RTM_GETROUTE, NLM_F_REQUEST, seq, body))
        while True:
            data = self.sock.recv(1 << 16)
            for kind, _flags, mseq, start, end in iter_messages(data):
                if mseq != seq:
                    continue
                if kind == NLMSG_ERROR:
                    (code,) = NLMSGERR.unpack_from(data, start)
                    if code in (0, -errno.ENETUNREACH, -errno.EHOSTUNREACH):
                        return None
                    raise NetlinkError(-code, "rtnetlink route lookup refused")
                if kind == RTM_NEWROUTE:
                    oifs = _route_oifs(parse_attrs(data, start + RTMSG.size, end))
                    return min(oifs) if oifs else None

    # -- links ---------------------------------------------------------------------------------------------
    def set_up(self, ifindex: int, up: bool) -> None:
        body = IFINFOMSG.pack(socket.AF_UNSPEC, 0, ifindex, IFF_UP if up else 0, IFF_UP)
        self.request(RTM_NEWLINK, 0, body)

    def add_veth(
        self,
        name: str,
        index: int,
        mac: bytes,
        peer_name: str,
        peer_index: int,
        peer_mac: bytes,
        peer_netns_fd: int,
    ) -> None:
        """A veth pair: `name` here, `peer_name` created directly in the namespace behind `peer_netns_fd`."""
        peer = (
            IFINFOMSG.pack(socket.AF_UNSPEC, 0, peer_index, 0, 0)
            + attr(IFLA_IFNAME, cstr(peer_name))
            + attr(IFLA_ADDRESS, peer_mac)
            + attr(IFLA_NET_NS_FD, u32(peer_netns_fd))
        )
        body = (
            IFINFOMSG.pack(socket.AF_UNSPEC, 0, index, 0, 0)
            + attr(IFLA_IFNAME, cstr(name))
            + attr(IFLA_ADDRESS, mac)
            + nested(
                IFLA_LINKINFO,
                attr(IFLA_INFO_KIND, cstr("veth")),
                nested(IFLA_INFO_DATA, attr(VETH_INFO_PEER, peer)),
            )
        )
        self.request(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, body)

    # -- tc --------------------------------------------------------------------------------------------------
    def add_ingress_qdisc(self, ifindex: int) -> None:
        body = TCMSG.pack(socket.AF_UNSPEC, ifindex, INGRESS_HANDLE, TC_H_INGRESS, 0) + attr(
            TCA_KIND, cstr("ingress")
        )
        self.request(RTM_NEWQDISC, NLM_F_CREATE | NLM_F_EXCL, body, ok_errnos=(errno.EEXIST,))

    def add_redirect(self, ifindex: int, to_ifindex: int, prio: int) -> None:
        """Every frame arriving on `ifindex` leaves through `to_ifindex` (u32 match-all + mirred redirect)."""
        selector = U32_SEL.pack(TC_U32_TERMINAL, 0, 1, 0, 0, 0, 0, 0) + U32_KEY.pack(0, 0, 0, 0)
        mirred = TC_MIRRED.pack(0, 0, TC_ACT_STOLEN, 0, 0, TCA_EGRESS_REDIR, to_ifindex)
        action = nested(
            1,  # action order 1
            attr(TCA_ACT_KIND, cstr("mirred")),
            nested(TCA_ACT_OPTIONS, attr(TCA_MIRRED_PARMS, mirred)),
        )
        body = (
            TCMSG.pack(socket.AF_UNSPEC, ifindex, 0, INGRESS_HANDLE, (prio << 16) | socket.htons(ETH_P_ALL))
            + attr(TCA_KIND, cstr("u32"))
            + nested(TCA_OPTIONS, attr(TCA_U32_SEL, selector), nested(TCA_U32_ACT, action))
        )
        self.request(RTM_NEWTFILTER, NLM_F_CREATE | NLM_F_EXCL, body)

    def delete_filters(self, ifindex: int, prio: int) -> None:
        """Remove every ingress filter at `prio` on `ifindex`; absent filters are not an error."""
        body = TCMSG.pack(
            socket.AF_UNSPEC, ifindex, 0, INGRESS_HANDLE, (prio << 16) | socket.htons(ETH_P_ALL)
        )
        self.request(RTM_DELTFILTER, 0, body, ok_errnos=(errno.ENOENT, errno.EINVAL))


def _route_oifs(attrs: dict[int, memoryview]) -> set[int]:
    """RTA_OIF, or every nexthop's interface of an RTA_MULTIPATH route."""
    out: set[int] = set()
    if RTA_OIF in attrs:
        out.add(U32.unpack_from(attrs[RTA_OIF])[0])
    hops = attrs.get(RTA_MULTIPATH)
    at = 0
    while hops is not None and at + RTNEXTHOP.size <= len(hops):
        length, _flags, _hops, ifindex = RTNEXTHOP.unpack_from(hops, at)
        if length < RTNEXTHOP.size:
            break
        out.add(ifindex)
        at += align(length)
    return out
