"""Netlink framing shared by every family labctl speaks (rtnetlink, generic netlink): message and attribute
headers, flags, encoding helpers, a message iterator, an attribute parser, and the error type.

Hand-encoded on purpose: these messages sit on measured paths (see labctl/linux/rtnl.py), and a full
library parse costs more than the signal being timed. A classic-BPF socket filter (`attach_filter`) lets
the kernel drop a subscriber's unwanted notifications before they are queued: they then cost it no wakeup,
no recv and no parse (labctl/linux/rtnl.py builds the carrier probe's).
"""

from __future__ import annotations

import ctypes
import os
import socket
import struct
from collections.abc import Iterator, Sequence

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
U16 = struct.Struct("=H")
SEQ_AT = 8  # byte offset of nlmsg_seq in a message

# Classic BPF (linux/filter.h): the few opcodes a netlink socket filter needs. On a netlink socket an
# absolute load reads the datagram from the start of its first message header, and reads it big-endian
# whatever the host's order: compare a loaded header field with `be32(value)` / `be16(value)`.
SO_ATTACH_FILTER = 26
BPF_LD_W_ABS = 0x20  # A = u32 at [k]
BPF_LD_H_ABS = 0x28  # A = u16 at [k]
BPF_JEQ_K = 0x15  # if A == k: skip jt instructions, else skip jf
BPF_RET_K = 0x06  # keep k bytes of the datagram (0: drop it)
BPF_ACCEPT = 0xFFFFFFFF  # a BPF_RET_K that keeps the whole datagram
BPF_MAXINSNS = 4096
SOCK_FILTER = struct.Struct("=HBBI")  # code, jt, jf, k
Insn = tuple[int, int, int, int]
"""One classic-BPF instruction: (code, jt, jf, k)."""


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


def iter_messages(
    data: bytes | bytearray | memoryview, start: int = 0, end: int | None = None
) -> Iterator[tuple[int, int, int, int, int]]:
    """(type, flags, seq, offset of the payload, end of the message) for every message in a datagram: all of
    `data`, or the one that lies at `data[start:end]` (a datagram received into a larger buffer)."""
    offset, size = start, len(data) if end is None else end
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


def be32(value: int) -> int:
    """A host-order u32 header field (nlmsg_seq, ifi_index, ...) as a BPF absolute word load reads it."""
    return int.from_bytes(U32.pack(value & 0xFFFFFFFF), "big")


def be16(value: int) -> int:
    """A host-order u16 header field (nlmsg_type) as a BPF absolute half-word load reads it."""
    return int.from_bytes(U16.pack(value & 0xFFFF), "big")


def attach_filter(sock: socket.socket, program: Sequence[Insn]) -> None:
    """Attach a classic-BPF program (SO_ATTACH_FILTER) to `sock`: the kernel runs it on every datagram before
    queueing it and drops those it returns 0 for. The kernel copies the program during the call. Raises
    ValueError for a program of the wrong length and OSError (EINVAL) when the kernel's checker rejects it."""
    if not 0 < len(program) <= BPF_MAXINSNS:
        raise ValueError(f"a socket filter has 1 to {BPF_MAXINSNS} instructions, not {len(program)}")
    code = ctypes.create_string_buffer(b"".join(SOCK_FILTER.pack(*insn) for insn in program))
    fprog = struct.pack("@HP", len(program), ctypes.addressof(code))  # struct sock_fprog {len; *filter}
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
