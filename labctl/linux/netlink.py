"""Netlink framing shared by every family labctl speaks (rtnetlink, generic netlink): message and attribute
headers, flags, encoding helpers, a message iterator, an attribute parser, and the error type.

Hand-encoded on purpose: these messages sit on measured paths (see labctl/linux/rtnl.py), and a full
library parse costs more than the signal being timed.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator

# Message types every family shares, and header flags.
NLMSG_ERROR = 2
NLMSG_DONE = 3
NLM_F_REQUEST = 0x1
NLM_F_MULTI = 0x2
NLM_F_ACK = 0x4
NLM_F_ROOT = 0x100
NLM_F_MATCH = 0x200
NLM_F_DUMP = NLM_F_ROOT | NLM_F_MATCH
NLM_F_EXCL = 0x200
NLM_F_CREATE = 0x400
NLM_F_ACK_TLVS = 0x200  # on an NLMSG_ERROR: extended-ack attributes follow
NLA_F_NESTED = 0x8000
NLA_TYPE_MASK = 0x3FFF
NLMSGERR_ATTR_MSG = 1

# Socket options (SOL_NETLINK).
SOL_NETLINK = 270
NETLINK_CAP_ACK = 10
NETLINK_EXT_ACK = 11

NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid (host byte order)
NLATTR = struct.Struct("=HH")  # len, type
NLMSGERR = struct.Struct("=i")
U32 = struct.Struct("=I")
SEQ_AT = 8  # byte offset of nlmsg_seq in a message


class NetlinkError(OSError):
    """The kernel refused a request: errno, plus its extended-ack message when it sent one."""

    def __init__(self, code: int, message: str | None = None) -> None:
        super().__init__(code, os.strerror(code) + (f": {message}" if message else ""))
        self.kernel_message = message


def align(n: int) -> int:
    return (n + 3) & ~3


def attr(kind: int, payload: bytes) -> bytes:
    length = NLATTR.size + len(payload)
    return NLATTR.pack(length, kind) + payload + b"\0" * (align(length) - length)


def nested(kind: int, *children: bytes) -> bytes:
    return attr(kind | NLA_F_NESTED, b"".join(children))


def cstr(text: str) -> bytes:
    return text.encode() + b"\0"


def u32(value: int) -> bytes:
    return U32.pack(value)


def message(msg_type: int, flags: int, seq: int, body: bytes) -> bytes:
    return NLMSGHDR.pack(NLMSGHDR.size + len(body), msg_type, flags, seq, 0) + body


def iter_messages(data: bytes) -> Iterator[tuple[int, int, int, int, int]]:
    """(type, flags, seq, offset of the payload, end of the message) for every message in a datagram."""
    offset, size = 0, len(data)
    while offset + NLMSGHDR.size <= size:
        length, msg_type, flags, seq, _pid = NLMSGHDR.unpack_from(data, offset)
        if length < NLMSGHDR.size:
            return
        yield msg_type, flags, seq, offset + NLMSGHDR.size, offset + length
        offset += align(length)


def parse_attrs(data: bytes | bytearray | memoryview, start: int, end: int) -> dict[int, memoryview]:
    """Attribute type (flags masked off) → payload, for the attributes between `start` and `end`."""
    out: dict[int, memoryview] = {}
    view = memoryview(data)
    at = start
    while at + NLATTR.size <= end:
        length, kind = NLATTR.unpack_from(view, at)
        if length < NLATTR.size:
            break
        out[kind & NLA_TYPE_MASK] = view[at + NLATTR.size : at + length]
        at += align(length)
    return out
