"""Clock pings straight to an agent over UDP (labctl.agents.clockping, decision 0048): the four stamps,
the signature both ways, and what a lost, forged or unanswered ping does. Real sockets on 127.0.0.1."""

from __future__ import annotations

import asyncio
import socket

from labctl.agents.clock import HostClock, OffsetSample
from labctl.agents.clockping import ClockPinger, ClockResponder, local_address_towards, ping_topic
from labctl.agents.wire import Rejections, Signer
from labctl.core.clock import now_ns
from labctl.inventory.config import Secret

KEY = Signer(Secret("KEY", "k" * 32))


async def _pair(
    agent_clock: HostClock, *, agent_signer: Signer = KEY, host: str = "h1", pinger_host: str = "h1"
) -> tuple[ClockResponder, ClockPinger, Rejections]:
    rejections = Rejections()
    responder = await ClockResponder.start(
        "127.0.0.1", "lab", host, agent_signer, lambda: agent_clock.local(now_ns()), rejections
    )
    assert responder.address is not None
    pinger = await ClockPinger.connect(responder.address, "lab", pinger_host, KEY, now_ns)
    return responder, pinger, rejections


async def test_a_pong_carries_the_four_stamps_and_bounds_the_offset_of_a_shifted_clock() -> None:
    agent_clock = HostClock(offset_ns=2_500_000_000, drift_ppb=0)
    responder, pinger, rejections = await _pair(agent_clock)
    try:
        pongs = [await pinger.ping(1.0) for _ in range(8)]
    finally:
        responder.close()
        pinger.close()
    assert all(p is not None for p in pongs)
    samples = [OffsetSample(p.t1, p.t2, p.t3, p.t4) for p in pongs if p is not None]
    for s in samples:
        assert s.t1 <= s.t4 and s.t2 <= s.t3 and s.rtt_ns >= 0
        # The truth is within half the round trip of each sample (both legs took >= 0).
        assert abs(s.offset_ns - 2_500_000_000) <= s.rtt_ns // 2 + 1
    assert responder.answered == 8 and rejections.malformed == rejections.unauthorised == 0
    assert pinger.bad == 0


async def test_a_ping_signed_with_another_key_is_refused_and_counted() -> None:
    responder, pinger, rejections = await _pair(HostClock(), agent_signer=Signer(Secret("OTHER", "x" * 32)))
    try:
        assert await pinger.ping(0.2) is None
    finally:
        responder.close()
        pinger.close()
    assert rejections.unauthorised == 1 and responder.answered == 0


async def test_a_pong_from_another_hosts_responder_is_not_taken() -> None:
    """The MAC binds the host: h1's pong, got by a pinger that asked for h2, is counted bad, not used."""
    responder, pinger, rejections = await _pair(HostClock(), host="h1", pinger_host="h2")
    try:
        assert await pinger.ping(0.2) is None
    finally:
        responder.close()
        pinger.close()
    assert rejections.unauthorised == 1  # the h2 ping's MAC does not open as h1's


async def test_garbage_and_a_stale_pong_are_dropped() -> None:
    responder, pinger, rejections = await _pair(HostClock())
    assert responder.address is not None
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.sendto(b"not a ping", responder.address)
            s.sendto(KEY.seal(ping_topic("lab", "h1"), b"short"), responder.address)
        assert await pinger.ping(1.0) is not None  # still answering
    finally:
        responder.close()
        pinger.close()
    # "not a ping" has no valid MAC field (unauthorised); the short one is signed but no ping (malformed).
    assert (rejections.unauthorised, rejections.malformed, responder.answered) == (1, 1, 1)


async def test_nobody_listening_is_known_before_the_timeout() -> None:
    """A port nobody listens on answers with ICMP port unreachable: the ping fails then, not at its
    timeout (a restarted agent listens on another port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        address = s.getsockname()
    pinger = await ClockPinger.connect(address, "lab", "h1", KEY, now_ns)
    try:
        t = now_ns()
        assert await pinger.ping(30.0) is None
        assert now_ns() - t < 20_000_000_000
    finally:
        pinger.close()
    await asyncio.sleep(0)


def test_the_responder_binds_where_traffic_to_the_broker_leaves_from() -> None:
    assert local_address_towards("127.0.0.1", 1883) == "127.0.0.1"
