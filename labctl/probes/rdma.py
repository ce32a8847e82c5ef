"""RDMA recovery on labs without RDMA hardware: an RC ping-pong whose queue pairs follow the InfiniBand RC
reliability rules (labctl.rdma.rc), carried as real UDP datagrams over each circuit.

Each NIC port gets one UDP socket in its host's namespace, bound to its address and interface (like the
UDP traffic probe). Each port keeps one requester queue pair per peer it has had a circuit to, as a
training job keeps its connections; it posts a SEND on the QP to its current peer every `interval_us`, the
next once the last completed (ping-pong). The peer's socket holds the responder (created by the
connection's first packet: the QP number and starting PSN verbs exchange out of band travel in it) and
ACKs in PSN order. A SEND is complete when its ACK arrives: `traffic.ok` (value: post to completion, ns;
`meta.transport = "rc"`, `meta.prev_ns` the previous SEND's post: the bracket).

A reconfiguration starts (`open_window`): the moved ports stop posting, as a job does at a step boundary;
an idle QP has no timer and survives a dark gap of any length. Once the switch acknowledged, the port
posts to its new peer; that SEND is lost in the dark and sent again after each local ACK timeout
(4.096 µs × 2^timeout), so traffic comes back up to one retransmission period after the link does — the
RDMA phase Opus measured. The first timeout is `traffic.lost` (stamped at the post). With `retry_cnt`
spent before the link is back, the QP errors: `rdma.wc_error` IBV_WC_RETRY_EXC_ERR, `rdma.qp_state` ERR;
under the `reconnect` policy it is reset with fresh PSNs (`rdma.reconnect`, value: how long it was in
error) and pinging goes on; under `survive` the port stays down (its recovery times out, and run.json's
probe stats count the errors). Responders here always have receives posted, so RNR never happens:
`rnr_retry` and `min_rnr_timer` are recorded and shape only a real QP (labctl.rdma.verbs).
"""

from __future__ import annotations

import asyncio
import itertools
import random
import socket
import struct
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from labctl.core.clock import now_ns
from labctl.core.events import Event, Kind
from labctl.linux.timerfd import PeriodicTimer
from labctl.probes.base import ProbeContext, ProbeKind
from labctl.probes.sampling import Probe, QueueProbe, RdmaSettings
from labctl.probes.traffic import PingOutcomes, TrafficEndpoint, _endpoint, bind_port_socket
from labctl.rdma.rc import Completion, Op, Packet, QpAttrs, QpState, Requester, Responder, WcStatus

UDP_PORT = 47_001
_WIRE = struct.Struct("!BBxxII")  # op, rnr timer code, destination QP number, PSN
_OPS = list(Op)


def encode(packet: Packet) -> bytes:
    return _WIRE.pack(_OPS.index(packet.op), packet.rnr_timer, packet.qpn, packet.psn) + packet.payload


def decode(data: bytes) -> Packet | None:
    if len(data) < _WIRE.size:
        return None
    op, rnr, qpn, psn = _WIRE.unpack_from(data)
    if op >= len(_OPS):
        return None
    return Packet(_OPS[op], psn, qpn, data[_WIRE.size :], rnr)


Deliver = Callable[[str, str, Packet, int], None]
"""(local port source, remote port source, packet, receipt time): a packet reached a port."""


class PacketCarrier(Protocol):
    """What carries the RC packets between two ports: real UDP datagrams, or a behaviour model."""

    async def open(self, deliver: Deliver) -> None: ...

    def close(self) -> None: ...

    def send(self, source: str, peer: str, packets: list[Packet]) -> None: ...


class UdpCarrier:
    """One UDP socket per port, in its host's namespace, bound to its address and interface (a frame the
    OCS delivers to the wrong port is never answered by this one)."""

    def __init__(
        self, endpoints: Sequence[TrafficEndpoint], peers: Sequence[TrafficEndpoint], port: int
    ) -> None:
        self.by_source = {e.source: e for e in endpoints}
        self.peer_book = {**{e.source: e for e in peers}, **self.by_source}
        self.source_of_address = {e.address: e.source for e in self.peer_book.values()}
        self.port = port
        self._socks: dict[str, socket.socket] = {}

    async def open(self, deliver: Deliver) -> None:
        loop = asyncio.get_running_loop()
        for source, ep in self.by_source.items():
            sock = self._socks[source] = bind_port_socket(ep, self.port)
            loop.add_reader(sock.fileno(), self._readable, source, sock, deliver)

    def close(self) -> None:
        loop = asyncio.get_running_loop()
        for sock in self._socks.values():
            loop.remove_reader(sock.fileno())
            sock.close()
        self._socks.clear()

    def send(self, source: str, peer: str, packets: list[Packet]) -> None:
        sock = self._socks.get(source)
        address = self.peer_book[peer].address
        for packet in packets:
            try:
                if sock is not None:
                    sock.sendto(encode(packet), (address, self.port))
            except OSError:
                pass  # no carrier, no route: the packet is lost and the RC rules deal with it

    def _readable(self, source: str, sock: socket.socket, deliver: Deliver) -> None:
        while True:
            try:
                data, addr = sock.recvfrom(2048)
            except BlockingIOError:
                return
            except OSError:
                continue
            t = now_ns()
            packet = decode(data)
            remote = self.source_of_address.get(addr[0])
            if packet is not None and remote is not None:
                deliver(source, remote, packet, t)


@dataclass
class _Connection:
    """One circuit end's requester QP toward its peer."""

    peer: TrafficEndpoint
    requester: Requester
    posted: dict[int, int] = field(default_factory=dict)  # wr_id → post time
    before: dict[int, int] = field(default_factory=dict)
    """wr_id → when the transmission before this SEND's latest one went out (its previous try, or the
    previous SEND): the completion's bracket starts there."""
    sent: dict[int, int] = field(default_factory=dict)  # wr_id → its latest transmission
    last_post: int = 0
    stalled: bool = False  # an ACK timeout since the last completion (traffic.lost reported)
    errored_at: int | None = None


class RcTrafficProbe(QueueProbe):
    name = "rc-traffic"
    counters = ("posts", "completions", "retransmissions")

    def __init__(
        self,
        endpoints: Sequence[TrafficEndpoint],
        *,
        peers: Sequence[TrafficEndpoint] = (),
        interval_us: int = 1000,
        settings: RdmaSettings | None = None,
        report_interval_ns: int = 100_000_000,
        port: int = UDP_PORT,
        seed: int | None = None,
        carrier: PacketCarrier | None = None,
        name: str = "rc-traffic",
    ) -> None:
        super().__init__()
        self.name = name
        self.carrier: PacketCarrier = carrier or UdpCarrier(endpoints, peers, port)
        self.by_source = {e.source: e for e in endpoints}
        self.peer_book = {**{e.source: e for e in peers}, **self.by_source}
        self.period_ns = interval_us * 1000
        self.settings = settings or RdmaSettings()
        s = self.settings
        self.attrs = QpAttrs(
            timeout=s.timeout, retry_cnt=s.retry_cnt, rnr_retry=s.rnr_retry, min_rnr_timer=s.min_rnr_timer
        )
        self.outcomes = PingOutcomes(
            self, {e.source: e.host for e in endpoints}, report_interval_ns, transport="rc"
        )
        self.rng = random.Random(seed)
        self.qps: dict[tuple[str, str], _Connection] = {}
        """One requester QP per (port, peer), kept across circuits."""
        self.active: dict[str, str] = {}
        """Port → the peer it posts to now."""
        self.responders: dict[tuple[str, str, int], Responder] = {}  # (local source, remote source, QPN)
        self._qpns = itertools.count(self.rng.randrange(1, 1 << 20))
        self._wr_ids = itertools.count(1)
        self._timer: PeriodicTimer | None = None
        self.posts = 0
        self.completions = 0
        self.retransmissions = 0
        self.errors = 0
        self.reconnects = 0

    def stats(self) -> dict[str, float | int]:
        out = super().stats()
        out.update(
            errors=self.errors,
            reconnects=self.reconnects,
            **{f"qp_{k}": v for k, v in vars(self.attrs).items()},
        )
        return out

    def set_circuits(self, peers: dict[str, str | None]) -> None:
        """Post on the queue pair to each port's new peer (one per port and peer, kept across circuits, as a
        training job keeps its connections)."""
        for source, peer in peers.items():
            if source not in self.by_source:
                continue
            self.outcomes.forget(source)
            if peer is None:
                self.active.pop(source, None)
                continue
            self.active[source] = peer
            if (source, peer) not in self.qps:
                self.qps[(source, peer)] = self._connect(self.peer_book[peer])

    def open_window(self, sources: Collection[str] | None = None) -> None:
        """A reconfiguration starts: these ports stop posting, as a job does at a step boundary (a QP with
        nothing outstanding has no timer, so it survives a dark gap of any length)."""
        for source in list(self.active) if sources is None else sources:
            self.active.pop(source, None)

    def close_window(self) -> None:
        pass

    def _connect(self, peer: TrafficEndpoint) -> _Connection:
        qpn = next(self._qpns) & 0xFFFFFF
        requester = Requester(qpn=qpn, dest_qpn=qpn, attrs=self.attrs, psn=self.rng.randrange(1 << 24))
        return _Connection(peer, requester)

    # -- lifecycle -----------------------------------------------------------------------------------------
    async def _run(self) -> None:
        try:
            await self.carrier.open(self._deliver)
            self._timer = PeriodicTimer(self.period_ns, self._tick)
            await asyncio.Event().wait()
        finally:
            if self._timer is not None:
                self._timer.close()
                self._timer = None
            self.carrier.close()

    def _send(self, source: str, peer: str, packets: list[Packet]) -> None:
        if packets:
            self.carrier.send(source, peer, packets)

    # -- requester -----------------------------------------------------------------------------------------
    def _tick(self, _expirations: int) -> None:
        t = now_ns()
        for (source, peer), conn in list(self.qps.items()):
            req = conn.requester
            active = self.active.get(source) == peer
            deadline = req.next_deadline()
            if deadline is not None and t >= deadline:
                before = req.retransmissions
                packets, done = req.poll_timers(t)
                self.retransmissions += req.retransmissions - before
                resent = {p.psn for p in packets}
                for item in req.outstanding:  # a retransmission: the try before it did not get through
                    if item.psn in resent and item.wr_id in conn.sent:
                        conn.before[item.wr_id] = conn.sent[item.wr_id]
                        conn.sent[item.wr_id] = t
                if packets and active and not req.rnr_waiting and not conn.stalled and conn.posted:
                    conn.stalled = True  # the first ACK timeout: traffic stopped at the oldest post
                    self._outcome(source, conn, False, min(conn.posted.values()), t, None)
                self._send(source, conn.peer.source, packets)
                self._complete(source, conn, done, t, active)
            if req.state is QpState.ERR:
                if active and self.settings.policy == "reconnect":
                    self._reconnect(source, peer, conn, t)
                continue
            if not active or conn.posted:
                continue  # ping-pong: the next SEND once the last one completed
            wr_id = next(self._wr_ids)
            packets, done = req.send(wr_id, b"", t)
            conn.posted[wr_id] = t
            if conn.last_post:
                conn.before[wr_id] = conn.last_post
            conn.sent[wr_id] = t
            conn.last_post = t
            self.posts += 1
            self._send(source, conn.peer.source, packets)
            self._complete(source, conn, done, t, active)

    def _reconnect(self, source: str, peer: str, conn: _Connection, t: int) -> None:
        """RESET → INIT → RTR → RTS with fresh PSNs: a new requester (the responder side learns the new
        QP from its first packet, as it would learn it out of band)."""
        fresh = self._connect(conn.peer)
        self.qps[(source, peer)] = fresh
        self.reconnects += 1
        took = t - (conn.errored_at or t)
        self.queue.put(
            Event(
                t_ns=t,
                kind=Kind.RDMA_RECONNECT,
                source=source,
                host=self.by_source[source].host,
                value=took,
                meta={"peer": peer, "qpn": fresh.requester.qpn, "psn": fresh.requester.psn},
            )
        )
        self._qp_state(source, QpState.RTS, t, fresh)

    def _complete(self, source: str, conn: _Connection, done: list[Completion], t: int, active: bool) -> None:
        ep = self.by_source[source]
        newest: tuple[int, int | None] | None = None  # (post time, the post before it) of the newest success
        for c in done:
            posted = conn.posted.pop(c.wr_id, None)
            before = conn.before.pop(c.wr_id, None)
            conn.sent.pop(c.wr_id, None)
            if c.status is WcStatus.SUCCESS:
                self.completions += 1
                if posted is not None:
                    newest = (posted, before)
                continue
            self.errors += 1
            self.queue.put(
                Event(
                    t_ns=t,
                    kind=Kind.RDMA_WC_ERROR,
                    source=source,
                    host=ep.host,
                    value=c.status.value,
                    meta={
                        "peer": conn.peer.source,
                        "wr_id": c.wr_id,
                        "psn": c.psn,
                        "qpn": conn.requester.qpn,
                    },
                )
            )
            if conn.requester.state is QpState.ERR and conn.errored_at is None:
                conn.errored_at = t
                self._qp_state(source, QpState.ERR, t, conn)
        if newest is not None and active:  # one report per batch of completions: the newest
            conn.stalled = False
            posted, before = newest
            self._outcome(source, conn, True, posted, t, t - posted, before)

    def _qp_state(self, source: str, state: QpState, t: int, conn: _Connection) -> None:
        self.queue.put(
            Event(
                t_ns=t,
                kind=Kind.RDMA_QP_STATE,
                source=source,
                host=self.by_source[source].host,
                value=state.value,
                meta={"peer": conn.peer.source, "qpn": conn.requester.qpn, "policy": self.settings.policy},
            )
        )

    # -- responder and ACKs --------------------------------------------------------------------------------
    def _deliver(self, source: str, remote: str, packet: Packet, t: int) -> None:
        """A packet from `remote` reached port `source`: a SEND for a responder here, or an ACK/NAK for one
        of this port's requesters."""
        if packet.op is Op.SEND:
            key = (source, remote, packet.qpn)
            responder = self.responders.get(key)
            if responder is None:  # the connection's first packet carries what verbs exchange out of band
                responder = self.responders[key] = Responder(packet.qpn, packet.qpn, self.attrs, packet.psn)
                responder.post_recv(1 << 30)
            replies, _delivered = responder.receive(packet)
            self._send(source, remote, replies)
            return
        conn = self.qps.get((source, remote))
        if conn is None:
            return
        packets, done = conn.requester.receive(packet, t)
        self._send(source, remote, packets)
        self._complete(source, conn, done, t, self.active.get(source) == remote)

    def _outcome(
        self,
        source: str,
        conn: _Connection,
        ok: bool,
        posted: int,
        t: int,
        rtt: int | None,
        previous: int | None = None,
    ) -> None:
        self.outcomes.report(source, conn.peer.source, ok, posted, t, rtt, previous)


def _build(ctx: ProbeContext) -> Probe:
    return RcTrafficProbe(
        [_endpoint(site) for site in ctx.ports],
        peers=[_endpoint(site) for site in ctx.peers],
        interval_us=ctx.settings.traffic_interval_us,
        settings=ctx.settings.rdma,
        report_interval_ns=ctx.report_interval_ns,
    )


PROBE = ProbeKind(
    "rc-traffic",
    (Kind.TRAFFIC_OK, Kind.TRAFFIC_LOST, Kind.RDMA_WC_ERROR, Kind.RDMA_QP_STATE, Kind.RDMA_RECONNECT),
    "RC queue pairs (IB reliability rules: PSNs, ACK timeout retries, RNR) ping-ponging over UDP per circuit",
    _build,
)
