"""The carrier probe's receive path on a socketpair standing in for its rtnetlink socket: a backlog is read
and stamped in full before anything is parsed, every datagram is parsed in order, and a backlog larger than
the receive buffer is read in rounds without losing any."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

import labctl.probes.carrier as carrier
from labctl.linux.netlink import attr, message
from labctl.linux.rtnl import (
    IFF_LOWER_UP,
    IFF_UP,
    IFINFOMSG,
    IFLA_CARRIER,
    RTM_NEWLINK,
    LinkState,
    parse_link,
)
from labctl.probes.carrier import RECV_SLOT, CarrierTarget, NetlinkCarrierProbe, _Namespace, _Watched


def notification(index: int, up: bool) -> bytes:
    flags = IFF_UP | (IFF_LOWER_UP if up else 0)
    body = IFINFOMSG.pack(socket.AF_UNSPEC, 1, index, flags, 0) + attr(IFLA_CARRIER, bytes([up]))
    return message(RTM_NEWLINK, 0, 0, body)


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    b.setblocking(False)
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
    b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def probe_on(
    sock: socket.socket, indexes: list[int], buffer: bytearray | None = None
) -> tuple[NetlinkCarrierProbe, _Namespace]:
    targets = [CarrierTarget(None, f"ma{i}", f"nic:h/ma{i}", "h") for i in indexes]
    probe = NetlinkCarrierProbe(targets)
    space = _Namespace(None, sock) if buffer is None else _Namespace(None, sock, buffer=buffer)
    for i, target in zip(indexes, targets, strict=True):
        space.watched[i] = _Watched(target, i, b"")
        space.watched[i].carrier = 1  # known up: the datagrams below are changes
    return probe, space


def test_a_backlog_is_stamped_on_receipt_before_any_of_it_is_parsed(
    pair: tuple[socket.socket, socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    tx, rx = pair
    indexes = list(range(10, 30))
    for i in indexes:
        tx.send(notification(i, up=False))
    clock = iter(range(1, 1000))
    parsed_at: list[int] = []
    real_parse = parse_link

    def now() -> int:
        return next(clock)

    def parse(data: bytes | bytearray, start: int, end: int) -> LinkState:
        parsed_at.append(next(clock))
        return real_parse(data, start, end)

    monkeypatch.setattr(carrier, "now_ns", now)
    monkeypatch.setattr(carrier, "parse_link", parse)
    probe, space = probe_on(rx, indexes)
    probe._readable(space)
    events = [e for e in probe.queue._items if e.kind == "carrier"]
    assert [e.source for e in events] == [f"nic:h/ma{i}" for i in indexes]  # all of them, in order
    assert [e.value for e in events] == [0] * len(indexes)
    stamps = [e.t_ns for e in events]
    assert stamps == sorted(stamps)
    assert max(stamps) < min(parsed_at)  # every datagram was stamped before the first parse


def test_a_backlog_larger_than_the_buffer_is_read_in_rounds(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    tx, rx = pair
    indexes = list(range(100, 160))
    for i in indexes:
        tx.send(notification(i, up=False))
    probe, space = probe_on(rx, indexes, buffer=bytearray(RECV_SLOT + 64))  # room for 1 datagram a round
    probe._readable(space)
    events = [e for e in probe.queue._items if e.kind == "carrier"]
    assert [e.source for e in events] == [f"nic:h/ma{i}" for i in indexes]
    assert probe.messages == len(indexes)
    with pytest.raises(BlockingIOError):  # the socket was left empty
        rx.recv(1)


def test_datagrams_for_links_it_does_not_watch_are_read_and_skipped(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    tx, rx = pair
    for i in (1, 2, 3, 2):
        tx.send(notification(i, up=False))
    probe, space = probe_on(rx, [2])
    probe._readable(space)
    assert [(e.source, e.value) for e in probe.queue._items if e.kind == "carrier"] == [("nic:h/ma2", 0)]
    assert probe.messages == 2
