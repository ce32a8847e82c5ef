"""Simulated probes: the same `Probe` interface as the real ones, reading the `SimFabric` model.

- `SimLinkProbe`: `link.firmware` and `carrier` transitions, stamped with the model's transition time
  (like a netlink subscriber stamping on receipt, without the receive latency), plus an initial dump.
- `SimRxPowerProbe`: samples every port's Rx power at `rx_power_hz` through an emulated QSFP28 module
  EEPROM per port (labctl.models.module_eeprom) and the DOM decoder (labctl.transceiver), the same read and
  decode path as a live module, and reports changes and heartbeats.
- `SimTrafficProbe`: one ping-pong per port to its expected peer every `interval_us`; `traffic.ok` with the
  RTT, `traffic.lost` stamped at the send time of the first unanswered ping.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Sequence

from labctl.clock import now_ns
from labctl.events import Event
from labctl.inventory import NicPort
from labctl.models.fabric import SimFabric
from labctl.models.module_eeprom import EmulatedQsfp28
from labctl.sampling import LightWindow, QueueProbe, ReportGate, power_moved, ticks
from labctl.transceiver import EepromRead, module_info, mw_to_dbm


class SimLinkProbe(QueueProbe):
    name = "sim-link"

    def __init__(self, fabric: SimFabric, ports: Sequence[NicPort]) -> None:
        super().__init__()
        self.fabric = fabric
        self.ports = set(ports)

    def _on_transition(self, port: NicPort, kind: str, value: int, t_ns: int) -> None:
        if port in self.ports and kind in ("carrier", "link.firmware"):
            self.queue.put(Event(t_ns=t_ns, kind=kind, source=port.source, host=port.host, value=value))

    async def _run(self) -> None:
        t = now_ns()
        for port in sorted(self.ports, key=lambda p: p.source):
            st = self.fabric.state(port)
            for kind, value in (("link.firmware", st.firmware), ("carrier", st.carrier)):
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


class SimRxPowerProbe(QueueProbe):
    name = "sim-rx-power"
    counters = ("samples",)  # port samples: per port, divide by the port count

    def stats(self) -> dict[str, float | int]:
        out = super().stats()
        if "samples_per_s" in out:
            out["samples_per_s_per_port"] = round(out["samples_per_s"] / len(self.ports), 1)
        return out

    def __init__(
        self,
        fabric: SimFabric,
        ports: Sequence[NicPort],
        *,
        hz: float = 1000.0,
        deadband_db: float = 0.5,
        report_interval_ns: int = 100_000_000,
    ) -> None:
        super().__init__()
        self.fabric = fabric
        self.ports = sorted(ports, key=lambda p: p.source)
        self.period_ns = round(1e9 / hz)
        self.deadband_db = deadband_db
        self.gate = ReportGate(report_interval_ns)
        self.window = LightWindow(max(2 * self.period_ns, 1_000_000))
        self.samples = 0
        # Every port carries an emulated QSFP28; the model's power goes into its EEPROM words (all lanes)
        # and comes back out through the module's read interface and the DOM decoder, so the simulated
        # lab sees what a live module would report (0.1 µW resolution, 0 → no light).
        self.modules = {port: EmulatedQsfp28() for port in self.ports}
        self.module_info = module_info(EmulatedQsfp28())
        self._reads: list[EepromRead] = list(self.module_info.rx_power_reads)

    def open_window(self, sources: Collection[str] | None = None) -> None:
        """A reconfiguration moves these ports' light: report them densely until it is seen back."""
        self.window.open((p.source for p in self.ports if sources is None or p.source in sources), now_ns())

    def close_window(self) -> None:
        self.window.close()

    async def _run(self) -> None:
        last: dict[NicPort, float | None] = {}
        decode = self.module_info.decode_rx_power_mw
        reads = [(r.i2c_address, r.page, r.bank, r.offset, r.length) for r in self._reads]
        async for t in ticks(self.period_ns):
            for port in self.ports:
                module = self.modules[port]
                module.set_rx_power_dbm(self.fabric.rx_power_dbm(port, t))
                mw = decode([module.read(*r) for r in reads])[0]  # lane 1
                dbm = mw_to_dbm(mw)
                self.samples += 1
                changed = port not in last or power_moved(last[port], dbm, self.deadband_db)
                interval = self.window.interval(port.source, dbm is not None, t)
                if self.gate.due(port.source, changed, t, interval):
                    last[port] = dbm
                    self.queue.put(
                        Event(
                            t_ns=t,
                            kind="rx_power",
                            source=port.source,
                            host=port.host,
                            value=None if dbm is None else round(dbm, 3),
                            meta={"lane": 1, "mw": round(mw, 6)},
                        )
                    )


class SimTrafficProbe(QueueProbe):
    name = "sim-traffic"
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
        was_ok: dict[NicPort, bool] = {}
        count: dict[NicPort, int] = {}
        async for t in ticks(self.period_ns):
            for port, peer in list(self.peers.items()):
                rtt = self.fabric.traffic_rtt_ns(port, peer)
                self.pings += 1
                ok = rtt is not None
                changed = was_ok.get(port) is not ok
                count[port] = 1 if changed else count.get(port, 0) + 1
                was_ok[port] = ok
                if not self.gate.due(port.source, changed, t):
                    continue
                meta = {"peer": peer.source, "n": count[port]}
                count[port] = 0
                if not ok:
                    meta["detected_ns"] = t + self.timeout_ns  # when a real probe would give up on it
                self.queue.put(
                    Event(
                        t_ns=t,
                        kind="traffic.ok" if ok else "traffic.lost",
                        source=port.source,
                        host=port.host,
                        value=rtt,
                        meta=meta,
                    )
                )


async def _forever() -> None:
    await asyncio.Event().wait()
