"""Probes that read the behaviour model (`SimFabric`) directly, behind the same `Probe` interface as the
real ones.

- `SimLinkProbe`: `link.firmware` and `carrier` transitions, stamped with the model's transition time
  (like a netlink subscriber stamping on receipt, without the receive latency), plus an initial dump.
- `SimTrafficProbe`: one ping-pong per port to its expected peer every `interval_us`; `traffic.ok` with the
  RTT, `traffic.lost` stamped at the send time of the first unanswered ping.

Rx power has no model probe: the model drives an emulated module EEPROM per port
(labctl.models.module_eeprom.ModelDrivenQsfp28) and the real poller (labctl.probes.rxpower) reads it
through the same read and decode path as a live module.
"""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from itertools import repeat
from typing import Any

import numpy as np

from labctl.core.clock import now_ns
from labctl.core.events import Event, Kind
from labctl.inventory.schema import NicPort
from labctl.models.fabric import PortState, SimFabric
from labctl.models.fabric_reads import SCALAR_SLOTS
from labctl.models.module_eeprom import ModelDrivenQsfp28
from labctl.probes.base import PortSite, ProbeContext, ProbeKind
from labctl.probes.rdma import Deliver, RcTrafficProbe
from labctl.probes.sampling import (
    ModelSchedule,
    Probe,
    QueueProbe,
    TickCount,
    run_ticks,
    staggered_heartbeats,
)
from labctl.probes.traffic import TrafficEndpoint
from labctl.rdma.rc import Packet

__all__ = [  # the public surface (docs/architecture.md, "Public surface"); the rest is internal
    "model_sites",
]


class SimLinkProbe(QueueProbe):
    name = "model-link"

    def __init__(self, fabric: SimFabric, ports: Sequence[NicPort]) -> None:
        super().__init__()
        self.fabric = fabric
        self.ports = set(ports)
        self._every = self.ports.issuperset(fabric.port_at)
        """Watching every port of the model (the usual case): no port looked up per transition."""

    @staticmethod
    def _link_of(st: PortState) -> tuple[tuple[str, int], tuple[str, int]]:
        return ((Kind.LINK_FIRMWARE, st.firmware), (Kind.CARRIER, st.carrier))

    def _on_transition(self, port: NicPort, kind: str, value: int, t_ns: int) -> None:
        if (kind == Kind.CARRIER or kind == Kind.LINK_FIRMWARE) and (self._every or port in self.ports):
            event = Event(t_ns=t_ns, kind=kind, source=port.source, host=port.host, value=value)
            if self._backlog:  # behind what is still being put (the initial state): in order
                self.report(iter((event,)), 1)
            else:
                self.queue.put(event)

    async def _run(self) -> None:
        # The initial state as observed now, put a time slice per loop turn (`report`): at hundreds of
        # ports the dump is a millisecond or two, and the other samplers are already ticking.
        t = now_ns()
        ports = sorted(self.ports, key=lambda p: p.source)
        state = [(p, self.fabric.state(p)) for p in ports]
        initial = [(p, kind, value) for p, st in state for kind, value in self._link_of(st)]

        def events() -> Iterator[Event]:
            for port, kind, value in initial:
                meta = {"initial": True}
                yield Event(t_ns=t, kind=kind, source=port.source, host=port.host, value=value, meta=meta)

        self.report(events(), len(initial))
        self.fabric.add_listener(self._on_transition)
        try:
            await _forever()
        finally:
            self.fabric.listeners.remove(self._on_transition)


class SimTrafficProbe(QueueProbe):
    """A ping-pong per port with a circuit, every `interval_us`, through the model: one vectorized check of
    every circuit per tick (`SimFabric.traffic_ok`), so hundreds of ports cost one tick, not one task or
    one Python call each. Events as a real traffic probe writes them: on change and as a heartbeat, each
    with the time of the port's previous ping (`meta.prev_ns`: the mark's bracket)."""

    name = "model-traffic"
    counters = ("pings",)

    def __init__(
        self,
        fabric: SimFabric,
        ports: Sequence[NicPort],
        *,
        interval_us: int = 1000,
        timeout_us: int | None = None,
        report_interval_ns: int = 100_000_000,
        schedule: ModelSchedule | None = None,
    ) -> None:
        super().__init__()
        self.fabric = fabric
        self.schedule = schedule
        self.tick_count = TickCount()
        self.period_ns = interval_us * 1000
        self.timeout_ns = (timeout_us if timeout_us is not None else 2 * interval_us) * 1000
        self.report_interval_ns = report_interval_ns
        self._slot_of = {p.source: fabric.slot[p] for p in ports}
        self._slot_or_none: dict[str | None, int] = {None: -1}  # a peer's slot, -1 for none
        self._slot_or_none.update(self._slot_of)
        self.pings = 0
        n = len(fabric.port_at)
        # Per fabric slot: the last outcome (-1: none yet), pings since it was reported, last report and ping.
        self._was_ok = np.full(n, -1, np.int8)
        self._count = np.zeros(n, np.int64)
        self._reported_t = np.full(n, np.iinfo(np.int64).min // 2, np.int64)
        self._pinged_t = np.full(n, -1, np.int64)
        self._src = self._dst = np.zeros(0, np.int64)
        self._pairs: list[tuple[int, int]] = []
        self._peer_of = np.full(n, -1, np.int64)  # per fabric slot: its peer's slot (-1: not pinging)
        self._heartbeat_ns = staggered_heartbeats(report_interval_ns, n)
        self._lists: tuple[list[int], list[int], list[int], list[int]] | None = None
        """While `_ping_each` runs tick after tick: the four per-slot arrays above (outcome, count, pinged,
        reported) as lists, the current copy (a numpy element read or write per circuit per tick costs
        more than the rest of the ping); written back (`_arrays`) before anything else reads them."""
        self._heartbeat_list: list[int] = self._heartbeat_ns.tolist()

    def set_circuits(self, peers: dict[str, str | None]) -> None:
        """Looked up a column at a time (every port of a rail at once: hundreds of ports, at the moment a
        switch acknowledged, beside the samplers)."""
        self._arrays()
        n = len(peers)
        slots = np.fromiter(map(self._slot_of.get, peers.keys(), repeat(-1)), np.int64, n)
        peer_slots = np.fromiter(map(self._slot_or_none.get, peers.values(), repeat(-2)), np.int64, n)
        known = slots >= 0  # a source this probe does not ping: left alone
        if (peer_slots[known] == -2).any():
            unknown = [p for p, k, q in zip(peers.values(), known, peer_slots, strict=True) if k and q == -2]
            raise KeyError(unknown[0])
        slots = slots[known]
        new_peers = peer_slots[known]
        # A new circuit's first ping has no ping before it: the old circuit's is not its mark's bracket (a
        # first ping that gets through says traffic flows, not since when), as a UDP probe's new circuit.
        self._pinged_t[slots[self._peer_of[slots] != new_peers]] = -1
        self._peer_of[slots] = new_peers
        self._reported_t[slots] = np.iinfo(np.int64).min // 2  # report each one's next ping
        self._src = np.flatnonzero(self._peer_of >= 0)
        self._dst = self._peer_of[self._src]
        self._pairs = list(zip(self._src.tolist(), self._dst.tolist(), strict=True))

    def stats(self) -> dict[str, float | int]:
        out = super().stats()
        if self.pings:  # pings the schedule gave up after a stall of the loop, and whose stall it was
            out.update(self.tick_count.stats())
        return out

    async def _run(self) -> None:
        if self.schedule is not None:  # pings at the schedule's instants, in step with the other samplers
            await self.schedule.run(self.period_ns, self._ping_all, self.tick_count)
        else:
            await run_ticks(self.period_ns, self._ping_all, count=self.tick_count)

    def _ping_all(self, t: int) -> None:
        src, dst = self._src, self._dst
        if not src.size:
            return
        if src.size <= SCALAR_SLOTS:
            self._ping_each(t)
            return
        self._arrays()
        ok = self.fabric.traffic_ok(src, dst, t)
        self.pings += int(src.size)
        changed = self._was_ok[src] != ok
        self._count[src] = np.where(changed, 1, self._count[src] + 1)
        self._was_ok[src] = ok
        prev = self._pinged_t[src]
        self._pinged_t[src] = t
        due = np.flatnonzero(changed | (t - self._reported_t[src] >= self._heartbeat_ns[src]))
        if not due.size:
            return
        s, d = src[due], dst[due]
        good = ok[due]
        counts = self._count[s].copy()
        self._count[s] = 0
        self._reported_t[s] = t
        rtts = self.fabric.rtt_ns_many(int(good.sum()))
        # Rows made when the events are (`report`: a burst of hundreds in time slices), from arrays fixed now.
        self.report(self._events(t, _rows(s, d, good, counts, prev[due]), rtts), due.size)

    def _arrays(self) -> None:
        """The per-slot arrays current again: `_ping_each`'s lists written back, if it has them."""
        if self._lists is not None:
            self._was_ok[:], self._count[:], self._pinged_t[:], self._reported_t[:] = self._lists
            self._lists = None

    def _ping_each(self, t: int) -> None:
        """`_ping_all` one circuit at a time, for a few (an agent's host): the same decisions without a
        numpy call per step (tests/unit/test_rxpower_lanes.py holds the two equal), on the per-slot
        state as lists (`_lists`)."""
        if self._lists is None:
            self._lists = (
                self._was_ok.tolist(),
                self._count.tolist(),
                self._pinged_t.tolist(),
                self._reported_t.tolist(),
            )
        was_ok, count, pinged, reported = self._lists
        heartbeat = self._heartbeat_list
        fabric = self.fabric
        rows = []
        good = 0
        pairs = self._pairs
        for (s, d), ok in zip(pairs, fabric.passes_each(pairs, t), strict=True):
            changed = was_ok[s] != ok
            n = 1 if changed else count[s] + 1
            was_ok[s] = ok
            prev = pinged[s]
            pinged[s] = t
            if changed or t - reported[s] >= heartbeat[s]:
                rows.append((s, d, ok, n, prev))
                good += ok
                count[s] = 0
                reported[s] = t
            else:
                count[s] = n
        self.pings += len(self._src)
        if rows:
            self.report(self._events(t, rows, fabric.rtt_ns_many(good)), len(rows))

    def _events(
        self,
        t: int,
        rows: Iterable[tuple[int, int, bool, int, int]],
        rtts: list[int],
    ) -> Iterator[Event]:
        """The tick's reports, a (slot, peer slot, ok, pings, previous ping) row each (built when put:
        `report`); each good ping with its drawn round trip."""
        port_at, rtt = self.fabric.port_at, iter(rtts)
        for s, d, ok, n, prev_t in rows:
            port, peer = port_at[s], port_at[d]
            meta: dict[str, object] = {"peer": peer.source, "n": n}
            if prev_t >= 0:
                meta["prev_ns"] = prev_t
            if not ok:
                meta["detected_ns"] = t + self.timeout_ns  # when a real probe would give up on it
            yield Event(
                t_ns=t,
                kind=Kind.TRAFFIC_OK if ok else Kind.TRAFFIC_LOST,
                source=port.source,
                host=port.host,
                value=next(rtt) if ok else None,
                meta=meta,
            )


def _rows(*columns: np.ndarray) -> Iterator[tuple[Any, ...]]:
    """The columns' rows, as Python values, once iterated."""
    yield from zip(*(c.tolist() for c in columns), strict=True)


class ModelCarrier:
    """RC packets through the NIC model: a packet gets through when the model would pass a ping between the
    two ports at the moment it is sent (`SimFabric.traffic_ok`), and arrives half a round trip later;
    otherwise it is lost. Each direction is a wire: packets arrive in the order they were sent, however the
    delays drawn for them differ (a reordered go-back-N burst would read as sequence errors, each spending
    one of the requester's retries, which no RC link shows). The RC rules on top are the same code the
    kernel lab runs over UDP."""

    def __init__(self, fabric: SimFabric) -> None:
        self.fabric = fabric
        self.slot_of = {p.source: fabric.slot[p] for p in fabric.port_at}
        self._deliver: Deliver | None = None
        self._wires: dict[tuple[str, str], deque[tuple[float, Packet]]] = {}
        """(source, peer) → packets on the wire, each with its arrival on the loop's clock, in order."""
        self._arrivals: dict[tuple[str, str], asyncio.TimerHandle] = {}

    async def open(self, deliver: Deliver) -> None:
        self._deliver = deliver

    def close(self) -> None:
        for handle in self._arrivals.values():
            handle.cancel()
        self._arrivals.clear()
        self._wires.clear()

    def send(self, source: str, peer: str, packets: list[Packet]) -> None:
        if not self.fabric.passes(self.slot_of[source], self.slot_of[peer], now_ns()):
            return  # lost: no light, no link, or not this circuit
        loop = asyncio.get_running_loop()
        wire = self._wires.setdefault((source, peer), deque())
        now = loop.time()
        last = wire[-1][0] if wire else now
        for packet in packets:
            last = max(now + self.fabric.rtt_ns() / 2e9, last)  # never ahead of a packet sent before it
            wire.append((last, packet))
        if (source, peer) not in self._arrivals:
            self._arrivals[(source, peer)] = loop.call_at(wire[0][0], self._arrive, source, peer)

    def _arrive(self, source: str, peer: str) -> None:
        del self._arrivals[(source, peer)]
        wire = self._wires[(source, peer)]
        loop = asyncio.get_running_loop()
        while wire and wire[0][0] <= loop.time():
            _, packet = wire.popleft()
            if self._deliver is not None:
                self._deliver(peer, source, packet, now_ns())
        if wire and (source, peer) not in self._arrivals:
            self._arrivals[(source, peer)] = loop.call_at(wire[0][0], self._arrive, source, peer)


async def _forever() -> None:
    await asyncio.Event().wait()


def _module(fabric: SimFabric, port: NicPort) -> ModelDrivenQsfp28:
    return ModelDrivenQsfp28(functools.partial(fabric.rx_power_dbm, port))


def model_sites(fabric: SimFabric, ports: Sequence[NicPort]) -> list[PortSite]:
    """Ports whose transceiver is an emulated QSFP28 lit by the model (every lane alike: report lane 1).
    The poller identifies each module through its EEPROM, then reads the power of all of them at once
    from the model (`rx_batch`)."""
    return [
        PortSite(
            port,
            open_eeprom=functools.partial(_module, fabric, port),
            rx_lanes=(1,),
            rx_batch=(fabric, fabric.slot[port]),
        )
        for port in ports
    ]


def _link(ctx: ProbeContext) -> Probe:
    return SimLinkProbe(ctx.require_world("model-link"), [site.port for site in ctx.ports])


def _traffic(ctx: ProbeContext) -> Probe:
    return SimTrafficProbe(
        ctx.require_world("model-traffic"),
        [site.port for site in ctx.peers or ctx.ports],
        interval_us=ctx.settings.traffic_interval_us,
        timeout_us=ctx.settings.traffic_timeout_us,
        report_interval_ns=ctx.report_interval_ns,
        schedule=ctx.schedule,
    )


def _rc_traffic(ctx: ProbeContext) -> Probe:
    fabric = ctx.require_world("model-rc-traffic")
    endpoints = [
        TrafficEndpoint(site.port.source, "", site.port.ifname, None, site.port.host) for site in ctx.ports
    ]
    peers = [
        TrafficEndpoint(site.port.source, "", site.port.ifname, None, site.port.host) for site in ctx.peers
    ]
    return RcTrafficProbe(
        endpoints,
        peers=peers,
        interval_us=ctx.settings.traffic_interval_us,
        settings=ctx.settings.rdma,
        report_interval_ns=ctx.report_interval_ns,
        carrier=ModelCarrier(fabric),
        name="model-rc-traffic",
    )


LINK = ProbeKind(
    "model-link",
    (Kind.LINK_FIRMWARE, Kind.CARRIER),
    "firmware link and carrier transitions of the NIC model, at their model times",
    _link,
)
TRAFFIC = ProbeKind(
    "model-traffic",
    (Kind.TRAFFIC_OK, Kind.TRAFFIC_LOST),
    "a ping-pong per port to its circuit's peer through the NIC model, every traffic_interval_us",
    _traffic,
)
RC_TRAFFIC = ProbeKind(
    "model-rc-traffic",
    (Kind.TRAFFIC_OK, Kind.TRAFFIC_LOST, Kind.RDMA_WC_ERROR, Kind.RDMA_QP_STATE, Kind.RDMA_RECONNECT),
    "RC queue pairs (labctl.rdma.rc) whose packets travel through the NIC model",
    _rc_traffic,
)
