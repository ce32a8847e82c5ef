"""A behavioural model of the NIC side of a lab: what each NIC port sees as the OCS moves light.

Each port reacts to whether light reaches its receiver through the current patches:
- light lost → firmware link down, carrier down after loss-of-signal detection, traffic stops;
- light back on both directions of a link → Rx power restored (after the optics settle), NIC firmware
  link-up after the profile's delay (one draw per link: training is a two-sided negotiation), carrier
  70-80 µs later on each end, traffic once both ends have carrier plus the transport delay.
Transitions carry exact model times (integer ns) and are delivered at that time through the event loop.
A newer change of the link invalidates transitions still pending for the old one.
"""

from __future__ import annotations

import asyncio
import functools
import random
from collections.abc import Callable
from dataclasses import dataclass

from labctl.events import Kind
from labctl.inventory import Inventory, NicPort
from labctl.models.switch import INSERTION_LOSS_DB, SwitchModel
from labctl.profiles import Profile

TRANSPORT = "transport"
"""A transition of the model only (no event kind): the link carries traffic end to end."""

# port, kind (Kind.LINK_FIRMWARE | Kind.CARRIER | TRANSPORT), value 0/1, model time
TransitionListener = Callable[[NicPort, str, int, int], None]

DARK_RAMP_DB = 30.0  # Rx power rises from ~30 dB below its level while the optics settle


@dataclass
class PortState:
    port: NicPort
    rx_level_dbm: float
    light_from: NicPort | None = None
    light_t_ns: int = 0
    settle_ns: int = 0
    firmware: int = 0
    carrier: int = 0
    transport: int = 0
    generation: int = 0


@dataclass
class _Pending:
    """A transition scheduled at model time `t_ns`, valid while the port's link generation is unchanged."""

    t_ns: int
    generation: int
    kind: str
    value: int
    handle: asyncio.TimerHandle | None = None


class SimFabric:
    """NIC ports of every host, wired to the switch models through their fibers."""

    def __init__(
        self, inventory: Inventory, switches: dict[str, SwitchModel], profile: Profile, rng: random.Random
    ) -> None:
        self.profile = profile
        self.rng = rng
        self.listeners: list[TransitionListener] = []
        self.ports: dict[NicPort, PortState] = {}
        self._by_rx: dict[tuple[str, int], NicPort] = {}
        self._by_tx: dict[tuple[str, int], NicPort] = {}
        self._pending: dict[NicPort, list[_Pending]] = {}
        for port in inventory.ports:
            # Per-port spread of received power, as fibers and connectors differ.
            level = profile.rx_power_dbm + rng.uniform(-0.8, 0.8)
            self.ports[port] = PortState(port, rx_level_dbm=level)
            self._by_rx[(port.switch, port.rx)] = port
            self._by_tx[(port.switch, port.tx)] = port
            switches[port.switch].transmitting[port.tx] = level + INSERTION_LOSS_DB
        for name, model in switches.items():
            model.add_listener(functools.partial(self._on_light, name))

    def add_listener(self, listener: TransitionListener) -> None:
        self.listeners.append(listener)

    def state(self, port: NicPort) -> PortState:
        return self.ports[port]

    # -- light in, transitions out -------------------------------------------------------------------------
    def _on_light(self, switch: str, egress: int, ingress: int | None, t_ns: int) -> None:
        port = self._by_rx.get((switch, egress))
        if port is None:
            return
        source = self._by_tx.get((switch, ingress)) if ingress is not None else None
        st = self.ports[port]
        if st.light_from == source:
            return
        old = st.light_from
        # A late event loop may deliver this change before transitions that happened earlier in model time
        # (e.g. a carrier-down still queued when the new light arrives): apply those first, in time order.
        self._catch_up([p for p in (port, old, source) if p is not None], t_ns)
        st.light_from = source
        st.light_t_ns = t_ns
        st.settle_ns = self.profile.draw_ns(self.rng, "optical_settle_ms") if source is not None else 0
        if old is not None:
            self._link_down(port, old, t_ns)
        if source is not None and self.ports[source].light_from == port:
            self._link_lit(port, source, t_ns)

    def _link_down(self, a: NicPort, b: NicPort, t_ns: int) -> None:
        """Light from b no longer reaches a: the a-b link drops at both ends."""
        for port in (a, b):
            st = self.ports[port]
            st.generation += 1
            if st.transport:
                self._transition(port, TRANSPORT, 0, t_ns)
            if st.firmware:
                self._transition(port, Kind.LINK_FIRMWARE, 0, t_ns)
            if st.carrier:
                self._schedule(
                    port,
                    st.generation,
                    Kind.CARRIER,
                    0,
                    t_ns + self.profile.draw_ns(self.rng, "carrier_down_after_loss_ms"),
                )

    def _link_lit(self, a: NicPort, b: NicPort, t_ns: int) -> None:
        """Both directions of the a-b link carry light from t_ns: schedule the link-up sequence."""
        t_fw = t_ns + self.profile.draw_ns(self.rng, "firmware_up_ms")
        carrier_t = {}
        for port in (a, b):
            st = self.ports[port]
            st.generation += 1
            self._schedule(port, st.generation, Kind.LINK_FIRMWARE, 1, t_fw)
            carrier_t[port] = t_fw + self.profile.draw_ns(self.rng, "carrier_after_firmware_us")
            self._schedule(port, st.generation, Kind.CARRIER, 1, carrier_t[port])
        t_transport = max(carrier_t.values()) + self.profile.draw_ns(self.rng, "transport_after_carrier_ms")
        for port in (a, b):
            self._schedule(port, self.ports[port].generation, TRANSPORT, 1, t_transport)

    def _schedule(self, port: NicPort, generation: int, kind: str, value: int, t_ns: int) -> None:
        pending = _Pending(t_ns, generation, kind, value)
        pending.handle = asyncio.get_running_loop().call_at(t_ns / 1e9, self._fire, port, pending)
        self._pending.setdefault(port, []).append(pending)

    def _fire(self, port: NicPort, pending: _Pending) -> None:
        self._pending[port].remove(pending)
        if self.ports[port].generation == pending.generation:
            self._transition(port, pending.kind, pending.value, pending.t_ns)

    def _catch_up(self, ports: list[NicPort], t_ns: int) -> None:
        due = [(port, x) for port in set(ports) for x in self._pending.get(port, ()) if x.t_ns <= t_ns]
        due.sort(key=lambda item: item[1].t_ns)
        for port, pending in due:
            if pending.handle is not None:
                pending.handle.cancel()
            self._fire(port, pending)

    def _transition(self, port: NicPort, kind: str, value: int, t_ns: int) -> None:
        st = self.ports[port]
        attr = "firmware" if kind == Kind.LINK_FIRMWARE else kind
        if getattr(st, attr) == value:
            return
        setattr(st, attr, value)
        for listener in self.listeners:
            listener(port, kind, value, t_ns)

    def cancel_pending(self) -> None:
        for pendings in self._pending.values():
            for pending in pendings:
                if pending.handle is not None:
                    pending.handle.cancel()
        self._pending.clear()

    # -- what probes read ------------------------------------------------------------------------------------
    def rx_power_dbm(self, port: NicPort, t_ns: int) -> float | None:
        """Received power at time t_ns; None when no light reaches the port (never a made-up floor)."""
        st = self.ports[port]
        if st.light_from is None:
            return None
        level = st.rx_level_dbm + self.rng.uniform(-0.5, 0.5) * self.profile.rx_noise_db
        since = t_ns - st.light_t_ns
        if since < st.settle_ns:
            return level - DARK_RAMP_DB * (1 - since / st.settle_ns)
        return level

    def traffic_rtt_ns(self, port: NicPort, peer: NicPort) -> int | None:
        """RTT of one ping-pong from `port` to `peer` now, or None if it would be lost."""
        st = self.ports[port]
        if not st.transport or st.light_from != peer or not self.ports[peer].transport:
            return None
        return self.profile.draw_ns(self.rng, "rtt_us")
