"""The carrier probe's socket filter in the kernel: it accepts the program, queues a watched link's
notifications and the replies to the socket's own requests (a dump of every link included), and drops the
notifications of the links nobody watches; the probe on a namespace with unwatched veth ends reports only
the watched ones. The program's logic, without a kernel: tests/unit/test_carrier_filter.py."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
from collections.abc import Callable

import pytest

from labctl.core.clock import now_ns
from labctl.core.events import Event
from labctl.linux import netns as linux_netns
from labctl.linux.netlink import NLMSG_DONE, attach_filter, iter_messages
from labctl.linux.rtnl import (
    RTM_NEWLINK,
    RTMGRP_LINK,
    Rtnl,
    dump_links_request,
    link_filter,
    open_route_socket,
)
from labctl.probes.carrier import CarrierTarget, NetlinkCarrierProbe
from tests.emulated.conftest import NetnsFactory

pytestmark = pytest.mark.emulated
PAIRS = 3


def veth_pairs(ns: str) -> tuple[dict[str, int], dict[str, int]]:
    """PAIRS veth pairs fa<i>/fb<i>, all up: the ifindexes of the a ends and of the b ends."""
    lines = "".join(f"link add fa{i} type veth peer name fb{i}\n" for i in range(PAIRS))
    lines += "".join(f"link set fa{i} up\nlink set fb{i} up\n" for i in range(PAIRS))
    subprocess.run(["ip", "-n", ns, "-batch", "-"], input=lines, text=True, check=True, capture_output=True)
    with linux_netns.entered(ns):
        a = {f"fa{i}": socket.if_nametoindex(f"fa{i}") for i in range(PAIRS)}
        b = {f"fb{i}": socket.if_nametoindex(f"fb{i}") for i in range(PAIRS)}
    return a, b


def links_in(datagrams: list[bytes]) -> list[int]:
    """The ifindex of every RTM_NEWLINK in these datagrams, in order."""
    out = []
    for data in datagrams:
        for kind, _flags, _seq, start, _end in iter_messages(data):
            if kind == RTM_NEWLINK:
                out.append(int.from_bytes(data[start + 4 : start + 8], "little", signed=True))
    return out


def drain(sock: socket.socket) -> list[bytes]:
    got = []
    while True:
        try:
            got.append(sock.recv(65536, socket.MSG_DONTWAIT))
        except BlockingIOError:
            return got


def test_the_kernel_queues_only_what_the_filter_keeps(netns: NetnsFactory) -> None:
    ns = netns("cf")
    a, b = veth_pairs(ns)
    watched = a["fa1"]
    with linux_netns.entered(ns):
        plain = open_route_socket(RTMGRP_LINK)
        filtered = open_route_socket(RTMGRP_LINK)
        rt = Rtnl(open_route_socket())
    try:
        attach_filter(filtered, link_filter(filtered.getsockname()[0], {watched}))
        for index in b.values():  # every peer down: each a end loses its carrier
            rt.set_up(index, False)
        # The unfiltered socket sees the a ends' notifications (from linkwatch, after the acks); a
        # broadcast queues a datagram on every listener at once, so the filtered socket has had its share.
        plain.settimeout(5.0)
        seen: list[bytes] = []
        deadline = time.monotonic() + 5.0
        while not set(a.values()) <= set(links_in(seen)) and time.monotonic() < deadline:
            seen.append(plain.recv(65536))
        assert set(a.values()) <= set(links_in(seen)), "every a end's notification on the plain socket"
        assert set(b.values()) <= set(links_in(seen))
        kept = links_in(drain(filtered))
        assert kept and set(kept) == {watched}
        # A dump is a reply to the socket's own request: it comes whole, unwatched links included.
        filtered.send(dump_links_request(1))
        filtered.settimeout(5.0)
        dumped: list[bytes] = []
        while not any(
            kind == NLMSG_DONE for data in dumped for kind, *_ in iter_messages(data)
        ):  # NLMSG_DONE ends the dump
            dumped.append(filtered.recv(65536))
        assert set(a.values()) | set(b.values()) <= set(links_in(dumped))
    finally:
        plain.close()
        filtered.close()
        rt.close()


async def _eventually(condition: Callable[[], bool], what: str, timeout_s: float = 5.0) -> None:
    """Wait for a condition the test cannot await directly; the deadline only turns a hang into a failure."""
    deadline = now_ns() + round(timeout_s * 1e9)
    while not condition():
        assert now_ns() < deadline, f"never happened: {what}"
        await asyncio.sleep(0.005)


async def test_the_probe_filters_its_namespace_and_reports_the_watched_ends(netns: NetnsFactory) -> None:
    ns = netns("cp")
    _a, b = veth_pairs(ns)
    probe = NetlinkCarrierProbe([CarrierTarget(ns, "fa0", "nic:h/fa0", "h")])
    with linux_netns.entered(ns):
        rt = Rtnl(open_route_socket())
    events: list[Event] = []

    async def pump() -> None:
        async for e in probe.events():
            events.append(e)

    try:
        async with probe:
            task = asyncio.create_task(pump())
            try:
                await _eventually(lambda: any(e.meta.get("initial") for e in events), "the initial state")
                assert probe._spaces[0].filtered
                for index in b.values():  # every peer down: fa1 and fa2, which it does not watch, too
                    await asyncio.to_thread(rt.set_up, index, False)
                await _eventually(
                    lambda: any(e.kind == "carrier" and e.value == 0 for e in events), "fa0's carrier down"
                )
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
    finally:
        rt.close()
    assert {e.source for e in events} == {"nic:h/fa0"}
    assert [e.value for e in events if e.kind == "carrier"] == [1, 0]
