"""UDP ping-pong between the two ends of each circuit, from each port's own address and interface.

Every NIC port gets one UDP socket, opened inside its host's namespace, bound to its address and to its
interface (SO_BINDTODEVICE, so a frame that the OCS delivers to the wrong port is never answered by this
one). That socket is the port's echo responder and its pinger. Every `interval_us` (a timerfd tick, so
sub-millisecond intervals work) each port with a circuit sends a ping carrying a sequence number and the
circuit's generation to its peer; the peer's socket echoes it. A pong resolves the ping (`traffic.ok`, value
= RTT ns, stamped at the pong's receipt, `meta.sent_ns` = the ping's send time, `meta.prev_ns` = the send
time of the ping before it: the mark's bracket); a ping
unanswered after `timeout_us` (or overtaken by a later answered one) is lost (`traffic.lost`, stamped at
its send time, `meta.detected_ns` = when the loss was decided). Outcomes are reported on change plus a
heartbeat through `ReportGate`, with `meta.n` = the pings each event stands for, exactly as the simulated
probe does; the RDMA probe will have the same interface.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

from labctl.core.clock import now_ns
from labctl.core.errors import InputError
from labctl.core.events import Event, Kind
from labctl.linux import netns
from labctl.linux.timerfd import PeriodicTimer
from labctl.probes.base import PortSite, ProbeContext, ProbeKind
from labctl.probes.sampling import Probe, QueueProbe, ReportGate

UDP_PORT = 47_000
PING, PONG = 1, 2
_MSG = struct.Struct("!BxHI")  # kind, circuit generation, sequence


@dataclass(frozen=True, slots=True)
class TrafficEndpoint:
    """One NIC port's address: where its socket lives and what source its events carry."""

    source: str
    address: str
    ifname: str
    netns: str | None = None
    host: str = ""


@dataclass(slots=True)
class _Circuit:
    peer: TrafficEndpoint
    generation: int
    seq: int = 0
    outstanding: dict[int, int] = field(default_factory=dict)  # seq → send time, oldest first
    before: dict[int, int] = field(default_factory=dict)  # seq → send time of the ping before it
    last_sent: int = 0


def bind_port_socket(ep: TrafficEndpoint, port: int) -> socket.socket:
    """A non-blocking UDP socket in the port's namespace, bound to its address and to its interface
    (SO_BINDTODEVICE: a frame the OCS delivers to the wrong port is never answered by this one)."""
    sock = netns.socket_in(ep.netns, socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.setblocking(False)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, ep.ifname.encode())
        sock.bind((ep.address, port))
    except BaseException:
        sock.close()
        raise
    return sock


class PingOutcomes:
    """Ping outcomes as `traffic.ok` / `traffic.lost` events, on change and as a heartbeat (ReportGate),
    each with `meta.n`, the pings it stands for. A loss is stamped when traffic stopped (the first
    unanswered ping's send time, `meta.detected_ns` when that was decided); an answer when it was observed,
    so it never precedes the carrier event that made it possible (both are receipts), with the ping's send
    time and the one before it (`meta.prev_ns`: the mark's bracket)."""

    def __init__(self, probe: QueueProbe, hosts: dict[str, str], report_interval_ns: int, **meta: object):
        self.probe = probe
        self.hosts = hosts
        self.gate = ReportGate(report_interval_ns)
        self.meta = meta
        self._was_ok: dict[str, bool] = {}
        self._count: dict[str, int] = {}

    def forget(self, source: str) -> None:
        self.gate.forget([source])

    def report(
        self,
        source: str,
        peer: str,
        ok: bool,
        sent: int,
        detected: int,
        rtt: int | None,
        previous: int | None = None,
    ) -> None:
        changed = self._was_ok.get(source) is not ok
        self._count[source] = 1 if changed else self._count.get(source, 0) + 1
        self._was_ok[source] = ok
        t = detected if ok else sent
        if not self.gate.due(source, changed, t):
            return
        meta: dict[str, object] = {"peer": peer, "n": self._count[source], **self.meta}
        if ok:
            meta["sent_ns"] = sent
            if previous is not None:
                meta["prev_ns"] = previous
        else:
            meta["detected_ns"] = detected
        self._count[source] = 0
        self.probe.queue.put(
            Event(
                t_ns=t,
                kind=Kind.TRAFFIC_OK if ok else Kind.TRAFFIC_LOST,
                source=source,
                host=self.hosts[source],
                value=rtt,
                meta=meta,
            )
        )


class UdpTrafficProbe(QueueProbe):
    name = "traffic"
    counters = ("pings",)

    def __init__(
        self,
        endpoints: Sequence[TrafficEndpoint],
        *,
        peers: Sequence[TrafficEndpoint] = (),
        interval_us: int = 1000,
        timeout_us: int | None = None,
        report_interval_ns: int = 100_000_000,
        port: int = UDP_PORT,
    ) -> None:
        super().__init__()
        self.by_source = {e.source: e for e in endpoints}
        """The ports this probe pings from and answers on (a socket each, here)."""
        self.peer_book = {**{e.source: e for e in peers}, **self.by_source}
        """Every port a circuit may reach, local or on another host."""
        self.period_ns = interval_us * 1000
        self.timeout_ns = (timeout_us if timeout_us is not None else 2 * interval_us) * 1000
        self.outcomes = PingOutcomes(self, {e.source: e.host for e in endpoints}, report_interval_ns)
        self.udp_port = port
        self.circuits: dict[str, _Circuit] = {}
        self._socks: dict[str, socket.socket] = {}
        self._generation = 0
        self._timer: PeriodicTimer | None = None
        self.pings = 0
        self.pongs = 0
        self.lost = 0  # pings resolved as lost: timed out, or overtaken by a later answer
        self.late = 0
        self.send_errors = 0

    def set_circuits(self, peers: dict[str, str | None]) -> None:
        for source, peer in peers.items():
            if source not in self.by_source:
                continue
            self.outcomes.forget(source)
            # A new generation: answers to pings of the old circuit are ignored from now on.
            self.circuits.pop(source, None)
            if peer is not None:
                self._generation = (self._generation + 1) & 0xFFFF
                self.circuits[source] = _Circuit(self.peer_book[peer], self._generation)

    # -- lifecycle -----------------------------------------------------------------------------------------
    def _open(self) -> None:
        for source, ep in self.by_source.items():
            self._socks[source] = bind_port_socket(ep, self.udp_port)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            self._open()
            for source, sock in self._socks.items():
                loop.add_reader(sock.fileno(), self._readable, source, sock)
            self._timer = PeriodicTimer(self.period_ns, self._tick)
            await asyncio.Event().wait()
        finally:
            if self._timer is not None:
                self._timer.close()
                self._timer = None
            for sock in self._socks.values():
                loop.remove_reader(sock.fileno())
                sock.close()
            self._socks.clear()

    # -- ping --------------------------------------------------------------------------------------------
    def _tick(self, _expirations: int) -> None:
        t = now_ns()
        for source, circuit in list(self.circuits.items()):
            out = circuit.outstanding
            if out and t - next(iter(out.values())) >= self.timeout_ns:
                # Before calling a ping lost, read what has come: after a stall of this loop the timer may
                # run before the socket's reader, with the answers waiting in the buffer. A prober that ran
                # late is not a link that lost traffic (on a saturated host every circuit flapped lost/ok
                # at each stall, a flood that held the agents' streams back past the recovery timeout).
                self._readable(source, self._socks[source])
            while out:
                seq, sent = next(iter(out.items()))
                if t - sent < self.timeout_ns:
                    break
                del out[seq]
                circuit.before.pop(seq, None)
                self.lost += 1
                self._outcome(source, circuit, False, sent, t, None)
            circuit.seq = (circuit.seq + 1) & 0xFFFFFFFF
            sent = now_ns()
            out[circuit.seq] = sent
            if circuit.last_sent:
                circuit.before[circuit.seq] = circuit.last_sent
            circuit.last_sent = sent
            self.pings += 1
            try:
                self._socks[source].sendto(
                    _MSG.pack(PING, circuit.generation, circuit.seq), (circuit.peer.address, self.udp_port)
                )
            except OSError:
                self.send_errors += 1  # no carrier, no route: the ping is lost and will time out

    def _readable(self, source: str, sock: socket.socket) -> None:
        while True:
            try:
                data, addr = sock.recvfrom(64)
            except BlockingIOError:
                return
            except OSError:
                continue
            t = now_ns()
            if len(data) != _MSG.size:
                continue
            kind, generation, seq = _MSG.unpack(data)
            if kind == PING:
                try:
                    sock.sendto(_MSG.pack(PONG, generation, seq), addr)
                except OSError:
                    self.send_errors += 1
                continue
            circuit = self.circuits.get(source)
            if kind != PONG or circuit is None or circuit.generation != generation:
                continue
            sent = circuit.outstanding.pop(seq, None)
            previous = circuit.before.pop(seq, None)
            if sent is None:
                self.late += 1  # already declared lost
                continue
            self.pongs += 1
            # Frames on one path stay in order: older pings still outstanding were lost.
            for old_seq, old_sent in list(circuit.outstanding.items()):
                if old_sent >= sent:
                    break
                del circuit.outstanding[old_seq]
                circuit.before.pop(old_seq, None)
                self.lost += 1
                self._outcome(source, circuit, False, old_sent, t, None)
            self._outcome(source, circuit, True, sent, t, t - sent, previous)

    def _outcome(
        self,
        source: str,
        circuit: _Circuit,
        ok: bool,
        sent: int,
        detected: int,
        rtt: int | None,
        previous: int | None = None,
    ) -> None:
        self.outcomes.report(source, circuit.peer.source, ok, sent, detected, rtt, previous)


def _endpoint(site: PortSite) -> TrafficEndpoint:
    if site.ip is None:
        raise InputError(f"{site.port.label}: the traffic probe needs the port's address in the inventory")
    return TrafficEndpoint(site.port.source, site.ip, site.port.ifname, site.netns, site.port.host)


def _build(ctx: ProbeContext) -> Probe:
    """Sockets on the context's ports; its peers (default: the same ports) are the address book."""
    return UdpTrafficProbe(
        [_endpoint(site) for site in ctx.ports],
        peers=[_endpoint(site) for site in ctx.peers],
        interval_us=ctx.settings.traffic_interval_us,
        timeout_us=ctx.settings.traffic_timeout_us,
        report_interval_ns=ctx.report_interval_ns,
    )


PROBE = ProbeKind(
    "traffic",
    (Kind.TRAFFIC_OK, Kind.TRAFFIC_LOST),
    "UDP ping-pong between the two ends of each circuit, from each port's address",
    _build,
)
