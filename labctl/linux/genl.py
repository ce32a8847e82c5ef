"""Generic netlink: one blocking request/reply socket and family-name resolution (nlctrl).

Requests are pre-built by the caller and only their sequence number is stamped here, so one request is
one send/recv pair with no library in the hot path (the module-EEPROM poller sends ~1,000 a second).
"""

from __future__ import annotations

import errno
import socket
import struct

from labctl.linux.netlink import (
    NETLINK_CAP_ACK,
    NETLINK_EXT_ACK,
    NLM_F_ACK_TLVS,
    NLM_F_REQUEST,
    NLMSG_DONE,
    NLMSG_ERROR,
    NLMSGERR,
    NLMSGERR_ATTR_MSG,
    NLMSGHDR,
    SEQ_AT,
    SOL_NETLINK,
    U32,
    NetlinkError,
    align,
    attr,
    cstr,
    parse_attrs,
)

NETLINK_GENERIC = 16
GENL_ID_CTRL = 0x10
CTRL_CMD_GETFAMILY = 3
CTRL_ATTR_FAMILY_ID = 1
CTRL_ATTR_FAMILY_NAME = 2
GENLMSGHDR = struct.Struct("=BBH")  # cmd, version, reserved


class GenericNetlink:
    """A blocking generic netlink socket that sends one request and reads its single reply."""

    def __init__(self, sock: socket.socket, timeout_s: float) -> None:
        self.sock = sock
        sock.setsockopt(SOL_NETLINK, NETLINK_EXT_ACK, 1)
        sock.setsockopt(SOL_NETLINK, NETLINK_CAP_ACK, 1)  # errors don't echo our request back
        sock.settimeout(timeout_s)
        sock.bind((0, 0))
        self._seq = 0
        self._buf = bytearray(65536)

    @staticmethod
    def new_socket() -> socket.socket:
        return socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_GENERIC)

    @staticmethod
    def message(family: int, cmd: int, version: int, attrs: bytes) -> bytearray:
        body = GENLMSGHDR.pack(cmd, version, 0) + attrs
        return bytearray(NLMSGHDR.pack(NLMSGHDR.size + len(body), family, NLM_F_REQUEST, 0, 0) + body)

    def request(self, msg: bytearray) -> memoryview:
        """Send `msg` (its seq is stamped here) and return the payload after the genl header of the reply
        (empty for the ACK of a request sent with NLM_F_ACK: a SET)."""
        self._seq = (self._seq + 1) & 0xFFFFFFFF
        U32.pack_into(msg, SEQ_AT, self._seq)
        self.sock.send(msg)
        while True:
            n = self.sock.recv_into(self._buf)
            at = 0
            while at + NLMSGHDR.size <= n:
                length, kind, flags, seq, _pid = NLMSGHDR.unpack_from(self._buf, at)
                if length < NLMSGHDR.size:
                    break
                if seq == self._seq:
                    if kind == NLMSG_ERROR:
                        if NLMSGERR.unpack_from(self._buf, at + NLMSGHDR.size)[0] == 0:
                            return memoryview(self._buf)[0:0]  # the ACK a request with NLM_F_ACK asked for
                        raise self._error(at, length, flags)
                    if kind != NLMSG_DONE:
                        start = at + NLMSGHDR.size + GENLMSGHDR.size
                        return memoryview(self._buf)[start : at + length]
                at += align(length)  # a stale reply to a request that timed out: skip it

    def _error(self, at: int, length: int, flags: int) -> NetlinkError:
        code = -NLMSGERR.unpack_from(self._buf, at + NLMSGHDR.size)[0]
        message = None
        if flags & NLM_F_ACK_TLVS:
            tlv_at = at + NLMSGHDR.size + 4 + NLMSGHDR.size  # error code + our header (CAP_ACK)
            msg = parse_attrs(self._buf, tlv_at, at + length).get(NLMSGERR_ATTR_MSG)
            if msg is not None:
                message = bytes(msg).split(b"\0", 1)[0].decode(errors="replace")
        return NetlinkError(code, message)

    def resolve_family(self, name: str) -> int:
        msg = self.message(GENL_ID_CTRL, CTRL_CMD_GETFAMILY, 1, attr(CTRL_ATTR_FAMILY_NAME, cstr(name)))
        payload = self.request(msg)
        family = parse_attrs(payload, 0, len(payload)).get(CTRL_ATTR_FAMILY_ID)
        if family is None:
            raise NetlinkError(errno.EPROTO, f"no family id in the reply for {name!r}")
        return int(struct.unpack_from("=H", family)[0])

    def close(self) -> None:
        self.sock.close()
