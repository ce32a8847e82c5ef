"""The carrier probe's socket filter (labctl.linux.rtnl.link_filter), run through a small classic-BPF
interpreter that loads as the kernel does on a netlink socket (from the first message header, big-endian,
out of bounds = drop); and the codec pieces the probe's receive path uses on a shared buffer. Whether the
kernel accepts the program and filters with it: tests/emulated/test_carrier_filter_kernel.py."""

from __future__ import annotations

import socket
import struct

import pytest

from labctl.linux.netlink import (
    BPF_ACCEPT,
    BPF_JEQ_K,
    BPF_LD_H_ABS,
    BPF_LD_W_ABS,
    BPF_MAXINSNS,
    BPF_RET_K,
    NLM_F_MULTI,
    NLMSG_DONE,
    NLMSG_ERROR,
    Insn,
    attach_filter,
    attr,
    be16,
    be32,
    cstr,
    iter_messages,
    message,
    u32,
)
from labctl.linux.rtnl import (
    IFINFOMSG,
    IFLA_CARRIER,
    IFLA_CARRIER_DOWN_COUNT,
    IFLA_CARRIER_UP_COUNT,
    IFLA_IFNAME,
    IFLA_OPERSTATE,
    LINK_FILTER_MAX,
    RTM_DELLINK,
    RTM_NEWLINK,
    link_filter,
    parse_link,
)

PORTID = 0x1234_5678


def run_bpf(program: list[Insn], packet: bytes) -> int:
    """Classic BPF as the kernel runs it on a netlink datagram, for the opcodes link_filter uses: the
    bytes kept (0: dropped)."""
    acc, pc = 0, 0
    while True:
        assert 0 <= pc < len(program), f"ran off the program at {pc}"
        code, jt, jf, k = program[pc]
        if code in (BPF_LD_W_ABS, BPF_LD_H_ABS):
            size = 4 if code == BPF_LD_W_ABS else 2
            if k + size > len(packet):
                return 0  # the kernel aborts a load past the end: the datagram is dropped
            acc = int.from_bytes(packet[k : k + size], "big")
            pc += 1
        elif code == BPF_JEQ_K:
            pc += 1 + (jt if acc == k else jf)
        elif code == BPF_RET_K:
            return k
        else:
            raise AssertionError(f"opcode {code:#x} is not one link_filter should use")


def link(index: int, *, kind: int = RTM_NEWLINK, seq: int = 0, pid: int = 0, flags: int = 0) -> bytes:
    body = IFINFOMSG.pack(socket.AF_UNSPEC, 1, index, 0, 0) + attr(IFLA_IFNAME, cstr(f"ma{index}"))
    msg = bytearray(message(kind, flags, seq, body))
    struct.pack_into("=I", msg, 12, pid)  # nlmsg_pid: the port a reply is addressed to
    return bytes(msg)


def test_be32_and_be16_are_what_a_big_endian_load_reads_of_a_host_order_field() -> None:
    field = struct.pack("=IH", 0x0102_0304, 16)
    assert be32(0x0102_0304) == int.from_bytes(field[:4], "big")
    assert be16(16) == int.from_bytes(field[4:], "big")


def test_the_filter_keeps_watched_links_notifications_and_drops_the_others() -> None:
    program = link_filter(PORTID, {7, 9, 3})
    assert run_bpf(program, link(7)) == BPF_ACCEPT
    assert run_bpf(program, link(3)) == BPF_ACCEPT
    assert run_bpf(program, link(8)) == 0  # a peer nobody watches
    assert run_bpf(program, link(7, kind=RTM_DELLINK)) == 0  # the probe reads only RTM_NEWLINK
    # A change someone asked to be echoed carries that requester's port and seq: still a notification.
    assert run_bpf(program, link(8, seq=5, pid=4242)) == 0
    assert run_bpf(program, link(9, seq=5, pid=4242)) == BPF_ACCEPT


def test_the_filter_keeps_every_reply_to_the_probe_own_requests() -> None:
    program = link_filter(PORTID, {7})
    # A dump packs many links in one datagram; the filter reads only the first, which may be unwatched.
    dump = link(8, seq=1, pid=PORTID, flags=NLM_F_MULTI) + link(7, seq=1, pid=PORTID, flags=NLM_F_MULTI)
    assert run_bpf(program, dump) == BPF_ACCEPT
    assert run_bpf(program, link(8, seq=2, pid=PORTID)) == BPF_ACCEPT
    error = bytearray(message(NLMSG_ERROR, 0, 2, struct.pack("=i", -19) + link(7, seq=2)[:16]))
    struct.pack_into("=I", error, 12, PORTID)
    assert run_bpf(program, bytes(error)) == BPF_ACCEPT
    done = bytearray(message(NLMSG_DONE, NLM_F_MULTI, 1, struct.pack("=i", 0)))
    struct.pack_into("=I", done, 12, PORTID)
    assert run_bpf(program, bytes(done)) == BPF_ACCEPT


def test_a_datagram_too_short_to_hold_an_ifindex_is_dropped() -> None:
    assert run_bpf(link_filter(PORTID, {7}), link(7)[:20]) == 0


def test_the_filter_names_up_to_its_limit_and_no_more() -> None:
    program = link_filter(PORTID, range(1, LINK_FILTER_MAX + 1))
    assert len(program) <= BPF_MAXINSNS
    assert run_bpf(program, link(LINK_FILTER_MAX)) == BPF_ACCEPT
    assert run_bpf(program, link(LINK_FILTER_MAX + 1)) == 0
    with pytest.raises(ValueError, match=f"1 to {LINK_FILTER_MAX} interfaces, not {LINK_FILTER_MAX + 1}"):
        link_filter(PORTID, range(LINK_FILTER_MAX + 1))
    with pytest.raises(ValueError, match="not 0"):
        link_filter(PORTID, ())


def test_attach_filter_refuses_a_program_of_the_wrong_length_before_the_kernel_sees_it() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        with pytest.raises(ValueError, match="not 0"):
            attach_filter(a, [])
        with pytest.raises(ValueError, match=f"not {BPF_MAXINSNS + 1}"):
            attach_filter(a, [(BPF_RET_K, 0, 0, 0)] * (BPF_MAXINSNS + 1))
    finally:
        a.close()
        b.close()


def test_messages_are_iterated_within_one_datagram_of_a_shared_buffer() -> None:
    first, second = link(1), link(2) + link(3)
    buffer = bytearray(first + second + b"\xff" * 64)  # the rest of the buffer holds stale bytes
    got = list(iter_messages(buffer, len(first), len(first) + len(second)))
    assert [struct.unpack_from("=i", buffer, start + 4)[0] for _k, _f, _s, start, _e in got] == [2, 3]
    assert [kind for kind, *_ in iter_messages(buffer, 0, len(first))] == [RTM_NEWLINK]


def test_parse_link_stops_once_it_has_the_four_fields_and_walks_on_while_one_is_missing() -> None:
    head = IFINFOMSG.pack(socket.AF_UNSPEC, 1, 5, 0, 0)
    wanted = (
        attr(IFLA_OPERSTATE, b"\x06")
        + attr(IFLA_CARRIER_DOWN_COUNT, u32(4))
        + attr(IFLA_CARRIER, b"\x01")
        + attr(IFLA_CARRIER_UP_COUNT, u32(5))
    )
    # What follows the four is not read: here a second IFLA_CARRIER, which a full walk would take.
    data = head + wanted + attr(IFLA_CARRIER, b"\x00")
    st = parse_link(data, 0, len(data))
    assert (st.ifindex, st.carrier, st.operstate, st.up_count, st.down_count) == (5, 1, 6, 5, 4)
    late = head + attr(IFLA_OPERSTATE, b"\x02") + attr(IFLA_IFNAME, cstr("x")) + attr(IFLA_CARRIER, b"\x00")
    st = parse_link(late, 0, len(late))
    assert (st.carrier, st.operstate, st.up_count, st.down_count) == (0, 2, None, None)
