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
import contextlib
import functools
from collections.abc import Sequence

from labctl.clock import now_ns
from labctl.events import Event, Kind
from labctl.inventory import NicPort
from labctl.models.fabric import SimFabric
from labctl.models.module_eeprom import ModelDrivenQsfp28
from labctl.probes import PortSite, ProbeContext, ProbeKind
from labctl.sampling import Probe, QueueProbe, ReportGate, ticks


class SimLinkProbe(QueueProbe):
    name = "model-link"

    def __init__(self, fabric: SimFabric, ports: Sequence[NicPort]) -> None:
        super().__init__()
        self.fabric = fabric
        self.ports = set(ports)

    def _on_transition(self, port: NicPort, kind: str, value: int, t_ns: int) -> None:
        if port in self.ports and kind in (Kind.CARRIER, Kind.LINK_FIRMWARE):
            self.queue.put(Event(t_ns=t_ns, kind=kind, source=port.source, host=port.host, value=value))

    async def _run(self) -> None:
        t = now_ns()
        for port in sorted(self.ports, key=lambda p: p.source):
            st = self.fabric.state(port)
            for kind, value in ((Kind.LINK_FIRMWARE, st.firmware), (Kind.CARRIER, st.carrier)):
                self.queue.put(
                    Event(
                        t_ns=t,
                        kind=kind,
                        source=port.source,
                        host=port.host,
                        value=value,
                        meta={"initial": True},
                    )
                )
        self.fabric.add_listener(self._on_transition)
        try:
            await _forever()
        finally:
            self.fabric.listeners.remove(self._on_transition)


class SimTrafficProbe(QueueProbe):
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
    ) -> None:
        super().__init__()
        self.fabric = fabric
        self.by_source = {p.source: p for p in ports}
        self.period_ns = interval_us * 1000
        self.timeout_ns = (timeout_us if timeout_us is not None else 2 * interval_us) * 1000
        self.gate = ReportGate(report_interval_ns)
        self.peers: dict[NicPort, NicPort] = {}
        self.pings = 0
        self._was_ok: dict[NicPort, bool] = {}  # the last outcome per port, and pings since it was reported
        self._count: dict[NicPort, int] = {}

    def set_circuits(self, peers: dict[str, str | None]) -> None:
        for source, peer in peers.items():
            port = self.by_source.get(source)
            if port is None:
                continue
            self.gate.forget([source])
            if peer is None:
                self.peers.pop(port, None)
            else:
                self.peers[port] = self.by_source[peer]

    async def _run(self) -> None:
        async with contextlib.aclosing(ticks(self.period_ns)) as schedule:
            async for t in schedule:
                self._ping_all(t)

    def _ping_all(self, t: int) -> None:
        for port, peer in list(self.peers.items()):
            rtt = self.fabric.traffic_rtt_ns(port, peer)
            self.pings += 1
            ok = rtt is not None
            changed = self._was_ok.get(port) is not ok
            self._count[port] = 1 if changed else self._count.get(port, 0) + 1
            self._was_ok[port] = ok
            if not self.gate.due(port.source, changed, t):
                continue
            meta = {"peer": peer.source, "n": self._count[port]}
            self._count[port] = 0
            if not ok:
                meta["detected_ns"] = t + self.timeout_ns  # when a real probe would give up on it
            self.queue.put(
                Event(
                    t_ns=t,
                    kind=Kind.TRAFFIC_OK if ok else Kind.TRAFFIC_LOST,
                    source=port.source,
                    host=port.host,
                    value=rtt,
                    meta=meta,
                )
            )


async def _forever() -> None:
    await asyncio.Event().wait()


def _module(fabric: SimFabric, port: NicPort) -> ModelDrivenQsfp28:
    return ModelDrivenQsfp28(functools.partial(fabric.rx_power_dbm, port))


def model_sites(fabric: SimFabric, ports: Sequence[NicPort]) -> list[PortSite]:
    """Ports whose transceiver is an emulated QSFP28 lit by the model (every lane alike: report lane 1)."""
    return [
        PortSite(port, open_eeprom=functools.partial(_module, fabric, port), rx_lanes=(1,)) for port in ports
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
