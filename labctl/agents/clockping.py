"""Clock pings straight between the controller and an agent, over UDP, beside the broker (decision 0048).

A ping through the broker crosses two Python MQTT clients and mosquitto each way: its fastest round trip on
one idle machine is ~0.5 ms, ~1.6 ms with the agents busy, and an exchange's bound is half of that. A
datagram to the agent and back crosses only the two event loops, as NTP's does: the bound follows the
loopback or LAN round trip (tens of µs), not the broker's queues.

- The agent binds a UDP socket on the address its own traffic to the broker leaves from (the management
  network; 127.0.0.1 when the broker is local) and says where in its broker pongs.
- The controller sends `t1`, the agent answers with `t2` (stamped as the datagram reached its loop) and
  `t3` (as its answer leaves), the controller stamps `t4`: the four stamps of `OffsetSample`, the agent's
  own turnaround taken out of the round trip.
- Both ways are signed with the broker's HMAC key (when the inventory has one), bound to the host and the
  direction: a pong cannot be forged, or replayed as another host's. The nonce matches a pong to its ping.
- Where the datagrams do not get through (a firewall between the controller and a host), the controller
  says so once and measures that host through the broker, as before; run.json says which way each host's
  clock was measured.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from labctl.agents.wire import Rejected, Rejections, Signer, topic

log = logging.getLogger("labctl.agents")

_PING = struct.Struct("!4sQq")  # magic, nonce, t1
_PONG = struct.Struct("!4sQqqqq")  # magic, nonce, t1, t2, t3, CLOCK_REALTIME read with t3
_PING_MAGIC, _PONG_MAGIC = b"LCK1", b"LCR1"


def ping_topic(lab: str, host: str) -> str:
    """What a ping's MAC is bound to (never published; a topic name keeps the MACs of each use apart)."""
    return topic(lab, host, "clock-ping")


def pong_topic(lab: str, host: str) -> str:
    return topic(lab, host, "clock-pong")


def local_address_towards(hostname: str, port: int) -> str:
    """The address this host's traffic to (hostname, port) leaves from: a UDP connect sends nothing, the
    kernel only picks the route and the source address."""
    family = socket.AF_INET6 if ":" in hostname else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect((hostname, port))
        return str(s.getsockname()[0])


class ClockResponder(asyncio.DatagramProtocol):
    """The agent's side: answers each signed ping with its receipt and send stamps on the agent's clock."""

    def __init__(
        self, lab: str, host: str, signer: Signer, now: Callable[[], int], rejections: Rejections
    ) -> None:
        self._ping_topic = ping_topic(lab, host)
        self._pong_topic = pong_topic(lab, host)
        self._signer = signer
        self._now = now
        self._rejections = rejections
        self._transport: asyncio.DatagramTransport | None = None
        self.answered = 0
        self.address: tuple[str, int] | None = None

    @classmethod
    async def start(
        cls,
        bind: str,
        lab: str,
        host: str,
        signer: Signer,
        now: Callable[[], int],
        rejections: Rejections,
        port: int = 0,
    ) -> ClockResponder:
        loop = asyncio.get_running_loop()
        transport, proto = await loop.create_datagram_endpoint(
            lambda: cls(lab, host, signer, now, rejections), local_addr=(bind, port)
        )
        sockname = transport.get_extra_info("sockname")
        proto.address = (str(sockname[0]), int(sockname[1]))
        return proto

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        t2 = self._now()  # first: the stamp belongs to the datagram's arrival, not to its checking
        try:
            body = self._signer.open(self._ping_topic, data)
            if len(body) != _PING.size:
                raise Rejected("malformed", "clock ping of the wrong size")
            magic, nonce, t1 = _PING.unpack(body)
            if magic != _PING_MAGIC:
                raise Rejected("malformed", "not a clock ping")
        except Rejected as r:
            self._rejections.add(r.kind, f"clock ping from {addr[0]}: {r.reason}", self._ping_topic)
            return
        real = time.time_ns()
        t3 = self._now()
        pong = self._signer.seal(self._pong_topic, _PONG.pack(_PONG_MAGIC, nonce, t1, t2, t3, real))
        if self._transport is not None:
            self._transport.sendto(pong, addr)
            self.answered += 1

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
            self._transport = None


@dataclass(frozen=True, slots=True)
class Pong:
    """t1 and t4 on the controller's clock, t2 and t3 on the agent's; real_ns: the agent's CLOCK_REALTIME."""

    t1: int
    t2: int
    t3: int
    t4: int
    real_ns: int


class ClockPinger(asyncio.DatagramProtocol):
    """The controller's side, one per agent: a UDP socket connected to the agent's responder (the kernel
    drops datagrams from anywhere else), one ping in flight at a time."""

    def __init__(self, lab: str, host: str, signer: Signer, now: Callable[[], int]) -> None:
        self._ping_topic = ping_topic(lab, host)
        self._pong_topic = pong_topic(lab, host)
        self._signer = signer
        self._now = now
        self._transport: asyncio.DatagramTransport | None = None
        self._waiting: tuple[int, asyncio.Future[Pong]] | None = None
        self.bad = 0  # datagrams that were not a pong to our ping (late, forged, malformed)
        self.address: tuple[str, int] | None = None

    @classmethod
    async def connect(
        cls, address: tuple[str, int], lab: str, host: str, signer: Signer, now: Callable[[], int]
    ) -> ClockPinger:
        loop = asyncio.get_running_loop()
        _, proto = await loop.create_datagram_endpoint(
            lambda: cls(lab, host, signer, now), remote_addr=address
        )
        proto.address = address
        return proto

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        t4 = self._now()
        try:
            body = self._signer.open(self._pong_topic, data)
        except Rejected:
            self.bad += 1
            return
        if len(body) != _PONG.size:
            self.bad += 1
            return
        magic, nonce, t1, t2, t3, real = _PONG.unpack(body)
        waiting = self._waiting
        if magic != _PONG_MAGIC or waiting is None or waiting[0] != nonce or waiting[1].done():
            self.bad += 1  # a pong for a ping already given up on counts here too
            return
        waiting[1].set_result(Pong(t1, t2, t3, t4, real))

    def error_received(self, exc: Exception) -> None:
        # ICMP port unreachable (the agent restarted on another port, or stopped): the ping fails now,
        # rather than at its timeout.
        if self._waiting is not None and not self._waiting[1].done():
            self._waiting[1].set_exception(exc)

    async def ping(self, timeout_s: float) -> Pong | None:
        """One round trip: None if no pong came within timeout_s (lost, refused, or nobody there)."""
        if self._transport is None:
            return None
        nonce = secrets.randbits(63)
        fut: asyncio.Future[Pong] = asyncio.get_running_loop().create_future()
        self._waiting = (nonce, fut)
        try:
            t1 = self._now()
            self._transport.sendto(self._signer.seal(self._ping_topic, _PING.pack(_PING_MAGIC, nonce, t1)))
            async with asyncio.timeout(timeout_s):
                return await fut
        except (TimeoutError, OSError):
            return None
        finally:
            self._waiting = None
            if not fut.done():
                fut.cancel()
            else:
                with contextlib.suppress(BaseException):
                    fut.exception()  # retrieved: no "exception was never retrieved" at collection

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
            self._transport = None
